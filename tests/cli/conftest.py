"""What every CLI test file shares: a fresh SQLite journal per test."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def db(tmp_path: Path) -> str:
    """The ``--db`` URL of a SQLite file no other test touches (created on first open)."""
    return f"sqlite:///{tmp_path / 'cli.db'}"
