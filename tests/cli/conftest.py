"""What every CLI test file shares: a fresh SQLite journal per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def db(tmp_path: Path) -> str:
    """The ``--db`` URL of a SQLite file no other test touches (created on first open)."""
    return f"sqlite:///{tmp_path / 'cli.db'}"


@pytest.fixture
def faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fault-switch folder for ``tests.cli.wait_flows`` (a capability named X fails while
    a file X exists in it), named in the environment the CLI's flows read."""
    from tests.cli.wait_flows import FAULTS_ENV

    where = tmp_path / "faults"
    where.mkdir()
    monkeypatch.setenv(FAULTS_ENV, str(where))
    yield where


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """`flowx worker` run in-process configures the flowx and library loggers with a handler
    on the runner's captured stream; put them back after each test, so no later test logs to
    a stream that is gone."""
    import logging

    from flowx.hosting.worker import LIBRARY_LOGGERS

    names = ("flowx", *LIBRARY_LOGGERS)
    saved = {
        n: (
            list(logging.getLogger(n).handlers),
            logging.getLogger(n).level,
            logging.getLogger(n).propagate,
        )
        for n in names
    }
    yield
    for name, (handlers, level, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
