"""Hypothesis keeps caches (character tables, the constants of the code under test) in a
``.hypothesis`` folder of the working directory even with ``database=None``. The fuzz tests
point it at one folder under the system's temporary directory instead: the tree stays clean,
and the character tables (seconds to build) are built once per machine, not once per run.
No examples are stored there (``database=None``), so runs stay independent."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis.configuration import set_hypothesis_home_dir

set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "flowx-hypothesis-cache")
