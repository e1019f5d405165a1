"""Where the tests find PostgreSQL, and how each test gets a schema of its own."""

from __future__ import annotations

import os

PG_DSN = os.environ.get("FLOWX_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
