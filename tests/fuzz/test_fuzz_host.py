"""Property (issue 12 item 11): ``host.start``, ``host.signal`` and a step's result, given
any value, either succeed or raise a FlowX error; a value the journal cannot store is
refused (or fails its step) and never changes a row; the journal stays intact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import flowx
from tests.fuzz.support import (
    FUZZ,
    RESULTS,
    FuzzIn,
    Harness,
    echo,
    names,
    storable,
    texts,
    values,
    wait,
)


@pytest.mark.parametrize("store", ["sqlite", "memory"])
def test_host_start_with_any_input_and_keys(tmp_path: Path, store: str) -> None:
    with Harness(tmp_path, store=store) as h:

        @FUZZ
        @given(
            value=values,
            label=st.one_of(texts, st.just("boom")),
            key=st.one_of(st.none(), names),
            correlation=st.one_of(st.none(), texts),
        )
        def start(value: Any, label: str, key: Any, correlation: str | None) -> None:
            given_input = {"value": value, "label": label}
            try:
                handle = h.run(
                    h.host.start(
                        echo,
                        given_input,
                        idempotency_key=key,
                        correlation_id=correlation,
                        run_here=False,
                    )
                )
            except flowx.FlowXError as exc:
                event(f"refused {exc.code}")
                return
            event("started")
            assert storable(value) or isinstance(value, tuple | frozenset)
            record = h.run(h.host.get(handle.instance_id))
            assert record.state is flowx.InstanceState.PENDING

        start()
        h.assert_intact()


def test_host_signal_with_any_payload(tmp_path: Path) -> None:
    with Harness(tmp_path) as h:
        waiting = h.run(h.host.start(wait, FuzzIn(label="w"), run_here=False)).instance_id

        @FUZZ
        @given(
            payload=values,
            name=st.one_of(st.just("go"), names),
            key=st.one_of(st.none(), names),
            instance=st.one_of(st.just(waiting), names),
        )
        def signal(payload: Any, name: Any, key: Any, instance: Any) -> None:
            try:
                h.run(h.host.signal(instance, name, payload, key=key, run_here=False))
            except flowx.FlowXError as exc:
                event(f"refused {exc.code}")
                return
            event("delivered")
            assert instance == waiting and name == "go"

        signal()
        h.assert_intact()


def test_a_step_result_of_any_value_commits_or_fails_its_step(tmp_path: Path) -> None:
    with Harness(tmp_path) as h:
        counter = iter(range(10**6))

        @FUZZ
        @given(result=values)
        def step(result: Any) -> None:
            key = f"r{next(counter)}"
            RESULTS[key] = result
            try:
                handle = h.run(h.host.start(echo, FuzzIn(key=key)))
                record = h.run(h.host.get(handle.instance_id))
                for _ in range(3):  # wait_idle is bounded; a few rounds cover a timer
                    if record.state.terminal:
                        break
                    h.run(h.host.wait_idle(timeout=20))
                    record = h.run(h.host.get(handle.instance_id))
                assert record.state.terminal, f"{key} still {record.state.value} after 60 s"
            finally:
                del RESULTS[key]
            steps = h.run(h.host.store.journal.steps(handle.instance_id))  # type: ignore[union-attr]
            event(f"ended {record.state.value}")
            if record.state is flowx.InstanceState.COMPLETED:
                assert storable(result) or isinstance(result, tuple)
            else:
                assert record.state is flowx.InstanceState.FAILED
                assert "step.result_unstorable" in (record.error or "")
                assert len(steps) == 1  # failed once, not retried

        step()
        h.assert_intact()
