"""While a node is open, CPython's young-generation threshold is raised, never lowered, and put
back by the last node of the process to close (``flowx.hosting.collector``).

The speed this buys is measured by ``benchmarks/gc_threshold.py``, not here: these tests say
what is changed in the process and that it is put back, whatever way the node ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

import flowx
from flowx.hosting import collector

FOUND = (700, 10, 10)


@pytest.fixture(autouse=True)
def _thresholds() -> Iterator[None]:
    """Each test starts from CPython's defaults with no node holding the threshold (another
    test may have left one open), and leaves the process as it found it."""
    before, enabled = gc.get_threshold(), gc.isenabled()
    kept = (collector._holders, collector._found, collector._set)
    collector._holders, collector._found, collector._set = 0, None, None
    gc.set_threshold(*FOUND)
    gc.enable()
    try:
        yield
    finally:
        collector._holders, collector._found, collector._set = kept
        gc.set_threshold(*before)
        if enabled:
            gc.enable()
        else:
            gc.disable()


def _host(threshold: int | None = None, store: Any = None) -> flowx.FlowHost:
    settings = flowx.HostSettings(recovery=False, timers=False, retention=False)
    if threshold is not None:
        settings = settings.replace(gc_threshold=threshold)  # type: ignore[arg-type]
    return flowx.FlowHost(store=store or flowx.from_url("memory://"), flows=[], settings=settings)


async def test_an_open_node_raises_the_young_threshold_the_last_to_close_puts_it_back() -> None:
    async with _host():
        assert gc.get_threshold() == (10_000, 10, 10)
        async with _host(threshold=20_000):
            assert gc.get_threshold() == (20_000, 10, 10)  # raised further, never lowered
        assert gc.get_threshold() == (20_000, 10, 10)  # one node is still open
    assert gc.get_threshold() == FOUND


async def test_a_threshold_of_0_a_higher_one_and_a_disabled_collector_are_left_alone() -> None:
    async with _host(threshold=0):
        assert gc.get_threshold() == FOUND
    gc.set_threshold(50_000, 5, 5)
    async with _host():
        assert gc.get_threshold() == (50_000, 5, 5)
    assert gc.get_threshold() == (50_000, 5, 5)
    gc.set_threshold(*FOUND)
    gc.disable()
    async with _host():
        assert gc.get_threshold() == FOUND
    assert not gc.isenabled()


async def test_a_threshold_set_by_someone_else_meanwhile_is_kept_at_close() -> None:
    async with _host():
        gc.set_threshold(3_000, 20, 20)  # the application's own choice, made while open
    assert gc.get_threshold() == (3_000, 20, 20)
    gc.set_threshold(*FOUND)
    async with _host():
        gc.set_threshold(3_000, 20, 20)
        async with _host():  # raised again over the application's choice ...
            assert gc.get_threshold() == (10_000, 20, 20)
    assert gc.get_threshold() == (3_000, 20, 20)  # ... which is what the last puts back


class _Refusing:
    """A store whose ``open`` fails with an error the host does not retry."""

    def __init__(self) -> None:
        self._inner = flowx.from_url("memory://")

    async def open(self) -> None:
        raise RuntimeError("refused at open")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_node_whose_open_fails_puts_the_threshold_back() -> None:
    with pytest.raises(RuntimeError, match="refused at open"):
        await _host(store=_Refusing()).open()
    assert gc.get_threshold() == FOUND


async def test_a_node_reopened_after_a_drain_holds_the_threshold_once() -> None:
    host = _host()
    await host.open()
    await host.drain()
    assert gc.get_threshold() == FOUND
    await host.open()
    assert gc.get_threshold() == (10_000, 10, 10)
    await host.drain()
    await host.drain()  # a second drain releases nothing twice
    assert gc.get_threshold() == FOUND


def test_hold_and_release_without_a_node() -> None:
    assert collector.hold(0) is False
    held = collector.hold(4_000)
    assert held and gc.get_threshold() == (4_000, 10, 10)
    collector.release(False)  # a node that held nothing releases nothing
    assert gc.get_threshold() == (4_000, 10, 10)
    collector.release(held)
    assert gc.get_threshold() == FOUND


def test_a_negative_threshold_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="gc_threshold"):
        flowx.HostSettings(gc_threshold=-1)
