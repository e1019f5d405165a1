"""The engine tests' one reset: every ``kit.Ledger`` empty before each test."""

from __future__ import annotations

import pytest

from tests.engine.kit import Ledger


@pytest.fixture(autouse=True)
def _fresh_ledgers() -> None:
    for ledger in Ledger.made:
        ledger.reset()
