"""The node kinds that wait: for a signal (with its timeout path) and for a moment.

A wait ends the run, not the instance: the instance is sealed ``Suspended`` at its frontier
(``Run.suspend`` raises ``Halt.suspended``), holding no task and no lease (R6.3). Whatever
wakes it resumes it through the same loop, which finds this node again and looks.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from flowx import codec
from flowx.engine.halt import Halt
from flowx.engine.run import Run
from flowx.plan.model import AwaitSignalNode, SleepNode
from flowx.stores.records import InstanceState, Outcome, SignalRecord


async def await_signal(
    run: Run, node: AwaitSignalNode, scope: str, item: Any, has_item: bool
) -> Any:
    """R2.10: the delivered signal becomes this step's own row, so a second delivery
    to this wait has nowhere to go; a signal that came early waits in the inbox."""
    key = (scope, node.step_id)
    a = run.history.of(key)
    if a.success is not None:
        run.replayed += 1
        taken = codec.loads(a.success.result, root="result", at=f"{scope}/{node.step_id}")
        if taken.get("timed_out"):
            return await run.walk(node.on_timeout, scope, item, has_item)
        run.state = run.applied(node.into, taken["payload"])
        return taken["payload"]
    if a.failures:
        raise Halt.failed(node, scope, a.failures[-1])
    run.forward(node, scope)
    run.check_deadline(node, scope)
    assert run.waits is not None  # nosec B101  # invariant: FLOWX1017
    timeout_at = run.wait_until(node, scope, node.timeout) if node.timeout is not None else None
    attempt = a.last_attempt + 1
    consumed = run.history.consumed.setdefault(node.signal, set())
    # Reaching the wait for the first time, try to seal at once: the seal itself refuses
    # when a signal is already waiting, so the inbox is read only when there is one (or
    # when a wake brought the run back here).
    w = run.last_wake
    look = w is not None and w.step_id == node.step_id and w.scope == scope
    while True:
        if not look and (timeout_at is None or run.clock.now() < timeout_at):
            await run.suspend(node, scope, at=timeout_at, signal=node.signal, child=None)
        look = False
        inbox = await run.waits.signals(node.signal)
        arrived = next((sig for sig in inbox if sig.seq not in consumed), None)
        if arrived is not None:
            value = await _take(run, node, scope, attempt, arrived)
            consumed.add(arrived.seq)
            return value
        if timeout_at is not None and run.clock.now() >= timeout_at:
            return await _timed_out(run, node, scope, item, has_item, attempt)
        # Nothing for us yet: seal (and loop to read the inbox if a signal beat the seal).


async def _take(
    run: Run, node: AwaitSignalNode, scope: str, attempt: int, arrived: SignalRecord
) -> Any:
    """Journal the signal as this wait's success row, its payload in the state."""
    at = f"{scope}/{node.step_id}"
    try:
        parsed = codec.validate_as(TypeAdapter(node.payload_type), arrived.payload, root="payload")
        # Sealed again as this step's result (R9.8): the inbox row is another place.
        text = codec.dumps(
            {"seq": arrived.seq, "key": arrived.key, "payload": parsed},
            root="result",
            at=at,
            # The payload alone: ``seq`` stays readable without keys (a replay's history,
            # admission and displays read it to know which signal this wait took).
            whole="payload" if run.seals(node) else False,
        )
        value = codec.loads(text, root="result", at=at)["payload"]
        run.applied(node.into, value)  # it must fit its state field too
    except ValidationError as exc:
        await run.fail_node(
            node,
            scope,
            attempt,
            f"signal {node.signal!r} #{arrived.seq} does not fit "
            f"{node.payload_type!r}: {exc.errors()[0].get('msg')}",
            "signal.payload_invalid",
        )
    await run.write(
        (scope, node.step_id),
        run.row(node, None, scope, attempt, Outcome.SUCCESS, text),
        apply=(node.into, value),
        state=InstanceState.RUNNING,
    )
    run.executed += 1
    return value


async def _timed_out(
    run: Run, node: AwaitSignalNode, scope: str, item: Any, has_item: bool, attempt: int
) -> Any:
    """No signal in time: take the timeout path if there is one, else fail the flow."""
    if node.on_timeout:
        await run.write(
            (scope, node.step_id),
            run.row(
                node,
                None,
                scope,
                attempt,
                Outcome.SUCCESS,
                {"timed_out": True, "at": run.clock.now().isoformat()},
            ),
            state=InstanceState.RUNNING,
        )
        run.executed += 1
        return await run.walk(node.on_timeout, scope, item, has_item)
    await run.fail_node(
        node,
        scope,
        attempt,
        f"no {node.signal!r} signal arrived within {node.timeout}",
        "signal.timed_out",
    )


async def sleep(run: Run, node: SleepNode, scope: str) -> Any:
    """R2.11: parking and scheduling the wake are one write; the timer service, on any
    node, resumes the instance when it is due (late after an outage, never not at all)."""
    key = (scope, node.step_id)
    a = run.history.of(key)
    if a.success is not None:
        run.replayed += 1
        return None
    run.forward(node, scope)
    run.check_deadline(node, scope)
    until = run.wait_until(node, scope, node.duration)
    while run.clock.now() < until:
        await run.suspend(node, scope, at=until, signal=None, child=None)
    await run.write(
        key,
        run.row(
            node,
            None,
            scope,
            a.last_attempt + 1,
            Outcome.SUCCESS,
            {"slept_until": until.isoformat()},
        ),
        state=InstanceState.RUNNING,
    )
    run.executed += 1
    return None
