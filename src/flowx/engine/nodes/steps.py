"""The node kinds that run now, on this node: a step, an emit, a for_each, a fork.

A committed success is replayed (its result applied as a live one is, the capability not
called); anything else runs and commits. Failures that no retry fixes halt the run with
``Halt.failed``; the ``Execution`` then fails the flow, compensating first.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import Any, NoReturn

from pydantic import ValidationError

from flowx import codec
from flowx.capability import Capability
from flowx.engine.failures import error_payload, exhausted
from flowx.engine.halt import Halt, HaltKind
from flowx.engine.history import Attempts
from flowx.engine.run import EVENT_NAMESPACE, Run
from flowx.engine.stops import StopReached
from flowx.engine.timeouts import DeadlineReached, attempt_limit, invoke_bounded
from flowx.errors import FlowXError, NonRetryableError, SerialisationError
from flowx.plan.events import contract_of
from flowx.plan.model import NO_RETRY, EmitNode, ForEachNode, ForkNode, Retry, StepNode
from flowx.sealing import MARK
from flowx.stores.records import EventWrite, InstanceState, Outcome
from flowx.tracing import current_context

log = logging.getLogger("flowx.engine")

#: Read once: on CPython 3.11 each read of an enum class's member passes through its
#: metaclass's ``__getattr__`` hook (a few times a dict lookup), and this is the step path.
_SUCCESS, _COMPLETED = Outcome.SUCCESS, InstanceState.COMPLETED

#: R9.5: a result the journal cannot store (or the state it makes) fails its own step, once.
RESULT_UNSTORABLE = "step.result_unstorable"

#: JSON gives these back exactly as they went in (a float by its shortest repr): a result of
#: one of them is not decoded again from the text just encoded (but see ``MARK``).
_EXACT = frozenset({str, int, float, bool, type(None)})


def step(run: Run, node: StepNode, scope: str, item: Any, has_item: bool) -> Awaitable[Any]:
    """Run (or replay) one capability call, with its retry policy: what to await for it.

    Not a coroutine itself: the usual step (no failure behind it, nothing to wait for first)
    is ``_call_until_done``'s coroutine, handed to the walk, so the run's every suspension
    passes through one frame less; a draining node hands the run back (``_yielded``); the
    rest goes through ``_from_the_start``."""
    a = run.history.of((scope, node.step_id))
    if node.argument is None:
        argument = item if has_item else run.input
    else:
        try:  # the selector, on the input or the for_each element
            argument = node.argument(run.source(item, has_item), run.state)
        except Exception as exc:
            return _from_the_start(run, node, scope, item, has_item, exc)
    if a.success is not None or a.failures or run.poisoned:
        return _from_the_start(run, node, scope, item, has_item, None, argument)
    cap = run.pinned(node, a)
    run.forward(node, scope)
    if run.should_yield is not None and run.should_yield():
        return _yielded(run)
    run.check_deadline(node, scope)
    policy = node.retry if cap.idempotent else NO_RETRY
    return _call_until_done(run, node, scope, argument, cap, policy, [], a)


async def _from_the_start(
    run: Run,
    node: StepNode,
    scope: str,
    item: Any,
    has_item: bool,
    raised: Exception | None,
    argument: Any = None,
) -> Any:
    """``step`` whole, as it was: a replayed step, one with failures behind it (which may
    wait out a backoff, or find the node draining first), a poisoned one, or a selector
    that raised."""
    a = run.history.of((scope, node.step_id))
    if raised is not None:
        argument = await _argument_raised(run, node, scope, a, raised)
    if a.success is not None:
        return run.replay_done(node, scope, a.success, argument)
    cap = run.pinned(node, a)
    policy = node.retry if cap.idempotent else NO_RETRY
    failures = list(a.failures)
    if exhausted(failures, policy):
        raise Halt.failed(node, scope, failures[-1])
    run.forward(node, scope)
    if run.should_yield is not None and run.should_yield():
        await _yielded(run)
    run.check_deadline(node, scope)
    if failures:
        await run.backoff(policy.delay(len(failures)))
        run.check_deadline(node, scope)
        run.forward(node, scope)
    if run.poisoned:
        await _poison(run, node, scope, cap, a.last_attempt + 1)
    return await _call_until_done(run, node, scope, argument, cap, policy, failures, a)


async def _yielded(run: Run) -> NoReturn:
    """The node is draining: hand the instance back at this boundary (``Pending``). A fenced
    write like any other: a node that lost the lease hands back nothing."""
    await run.transition(InstanceState.PENDING)
    raise Halt.yielded()


async def _argument_raised(
    run: Run, node: StepNode, scope: str, a: Attempts, exc: Exception
) -> Any:
    """A selector (``argument=``) that raised: it fails a step that never ran, and gives a
    replayed step's compensation ``None``."""
    if a.success is None and not a.failures:
        await _selector_failed(run, node, scope, a, exc)
    if a.success is None:
        raise Halt.failed(node, scope, a.failures[-1]) from exc
    log.warning(
        "instance %s: argument= of replayed step %r raised %r; its compensation gets None",
        run.instance_id,
        node.name,
        exc,
    )
    return None


async def _selector_failed(
    run: Run, node: StepNode | ForEachNode, scope: str, a: Attempts, exc: Exception
) -> NoReturn:
    """A selector that raised fails its node, which never ran, with no retry: a step's
    ``argument=`` (``step.argument_failed``) or a for_each's ``items=``
    (``for_each.items_failed``)."""
    kind, selector = ("step", "argument") if isinstance(node, StepNode) else ("for_each", "items")
    run.forward(node, scope)
    await run.fail_node(
        node,
        scope,
        a.last_attempt + 1,
        f"{kind} {node.name!r}: {selector}= raised {type(exc).__name__}: {exc}",
        f"{kind}.{selector}_failed",
    )


async def _poison(run: Run, node: StepNode, scope: str, cap: Capability, attempt: int) -> None:
    """R4.3: the worker died in this step too often; fail it instead of running it again."""
    run.poisoned = False
    error = error_payload(
        FlowXError(
            f"the worker running this step was lost {run.spec.resume_count} times in a "
            "row without committing anything; the step is failed instead of run again",
            code="step.poison",
        ),
        retryable=False,
    )
    await run.write(
        (scope, node.step_id), run.row(node, cap, scope, attempt, Outcome.FAILURE, error)
    )
    raise Halt.failed(node, scope, error)


async def _call_until_done(
    run: Run,
    node: StepNode,
    scope: str,
    argument: Any,
    cap: Capability,
    policy: Retry,
    failures: list[dict[str, Any]],
    a: Attempts,
) -> Any:
    """Call the capability until it succeeds or the policy runs out; every try is a row.
    A step's ``Attempts`` (``a``) keeps its generation while it runs: a replay changes it,
    never an attempt."""
    key = (scope, node.step_id)
    attempt = a.last_attempt + 1
    drawn = a.last_failure_drawn
    while True:
        ctx = run.context(node, scope, attempt, recorded=drawn, generation=a.generation)
        run.live()
        started = time.monotonic()
        try:
            if node.timeout is None and run.deadline_at is None:  # unbounded: the usual one
                limit, by_deadline = None, False
            else:
                limit, by_deadline = attempt_limit(node.timeout, run.deadline_at, run.clock)
            raw = await invoke_bounded(
                cap,
                ctx,
                argument,
                run.executor,
                limit=limit,
                by_deadline=by_deadline,
                # Only an attempt with a bound can overrun it and be named: not built per step.
                what=f"step {node.name!r} ({cap.ref})" if limit is not None else "",
                stop=run.step_cut,
            )
            # R9.5: checked here, so an unstorable result fails this step, never the commit.
            at = f"{scope}/{node.step_id}"
            sealed = run.seals(node)
            text = _stored(raw, "result", node, cap, at=at, whole=sealed)
            # The live run goes on with the value a replay would read back from the row:
            # decoded, unless JSON gives it back as it is (a text holding the sealing mark is
            # decoded, as a replay decodes it: without keys, both refuse it alike).
            exact = not sealed and type(raw) in _EXACT and not (type(raw) is str and MARK in raw)
            value = raw if exact else codec.loads(text, root="result", at=at)
            base = run.state
            new_state = run.applied(node.into, value)  # the result must fit its field
            bag = _stored(new_state, "state", node, cap) if node.into is not None else None
        except Exception as exc:
            error = _attempt_error(run, node, scope, cap, exc)
            failures.append(error)
            await run.write(
                key, run.row(node, cap, scope, attempt, Outcome.FAILURE, error, ctx, started)
            )
            if exhausted(failures, policy):
                raise Halt.failed(node, scope, error) from exc
            await run.backoff(policy.delay(len(failures)))
            run.check_deadline(node, scope)
            run.forward(node, scope)  # a fork sibling may have failed meanwhile
            attempt += 1
            drawn = ctx.drawn()
            continue
        final = scope == "" and node is run.final_node
        await run.write(
            key,
            run.row(node, cap, scope, attempt, _SUCCESS, text, ctx, started),
            apply=(node.into, value),
            prepared=(base, new_state, bag),
            snapshot=final,
            state=_COMPLETED if final else None,
        )
        run.completed = final
        run.keep(node, scope, argument, value)
        run.executed += 1
        return value


def _stored(
    value: Any,
    root: str,
    node: StepNode,
    cap: Capability,
    *,
    at: str | None = None,
    whole: bool = False,
) -> str:
    """``value`` (a step's result, or the state it makes) encoded for its row; refused as
    ``step.result_unstorable``, saying whose result it was (R9.5). The words are put together
    only for a refusal: this runs twice on every step commit."""
    try:
        return codec.dumps(value, root=root, at=at, whole=whole)
    except SerialisationError as exc:
        whose = f"step {node.name!r}: the result of {cap.ref}"
        raise codec.refused(exc, whose, RESULT_UNSTORABLE) from exc


def _attempt_error(
    run: Run, node: StepNode, scope: str, cap: Capability, exc: Exception
) -> dict[str, Any]:
    """A failed attempt's row payload; the flow deadline cutting it halts instead."""
    if isinstance(exc, DeadlineReached):
        assert run.deadline_at is not None  # nosec B101  # invariant: only a deadline raises it
        raise Halt.deadline(node, scope, run.deadline_at, running=True) from exc
    if isinstance(exc, StopReached):  # R9.4: an operator's stop cut the attempt
        raise Halt.stopped(node, scope, exc.request, running=True) from exc
    if isinstance(exc, ValidationError):
        return error_payload(
            FlowXError(
                f"step {node.name!r}: the result of {cap.ref} does not fit state "
                f"field {node.into!r}: {exc.errors()[0].get('msg')}",
                code="step.result_invalid",
            ),
            retryable=False,
        )
    return error_payload(exc)


async def emit(run: Run, node: EmitNode, scope: str, item: Any, has_item: bool) -> Any:
    """Stage an event in the same commit as its row (the outbox relays it)."""
    key = (scope, node.step_id)
    a = run.history.of(key)
    if a.success is not None:
        run.replayed += 1
        return codec.loads(a.success.result)
    if a.failures:
        raise Halt.failed(node, scope, a.failures[-1])
    run.forward(node, scope)
    run.check_deadline(node, scope)
    attempt = a.last_attempt + 1
    source = run.source(item, has_item)
    try:
        built = node.build(source, run.state)
        if not isinstance(built, node.event_type):
            raise NonRetryableError(
                f"emit {node.name!r} built a {type(built).__name__}, not the declared "
                f"{node.event_type.__name__}"
            )
        contract = contract_of(node.event_type)
        assert contract is not None  # nosec B101  # invariant: FLOWX1024 checks it at build time
        payload = contract.encode(built)
        partition_key = _partition_key(run, node, source)
    except Exception as exc:
        error = error_payload(exc, retryable=False)
        await run.write(key, run.row(node, None, scope, attempt, Outcome.FAILURE, error))
        raise Halt.failed(node, scope, error) from exc
    final = scope == "" and node is run.final_node
    # A re-run after a replay (``history.py``) stages a new event, under an id of its own.
    generation = f"/g{a.generation}" if a.generation else ""
    event_id = str(
        uuid.uuid5(EVENT_NAMESPACE, f"{run.instance_id}/{scope}/{node.step_id}{generation}")
    )
    await run.write(
        key,
        run.row(node, None, scope, attempt, Outcome.SUCCESS, payload),
        snapshot=final,
        state=InstanceState.COMPLETED if final else None,
        events=(
            EventWrite(
                event_id=event_id,
                type=contract.type,
                schema_version=contract.schema_version,
                partition_key=None if partition_key is None else str(partition_key),
                payload=payload,
                # Its consumer continues this instance's trace (the ``traceparent`` header).
                trace_context=current_context(),
            ),
        ),
    )
    run.completed = final
    run.executed += 1
    return codec.loads(payload)


def _partition_key(run: Run, node: EmitNode, source: Any) -> Any:
    """The event's partition: the emit's selector, or the tenant."""
    if node.partition_key is None:
        return run.tenant_id
    partition_key = node.partition_key(source, run.state)
    if partition_key is not None:  # R9.5: a text column, checked before the commit
        partition_key = codec.text(str(partition_key), root="partition_key")
    return partition_key


async def for_each(run: Run, node: ForEachNode, scope: str, item: Any, has_item: bool) -> Any:
    """Run the body once per element, each in a scope of its own (``scope/index``)."""
    a = run.history.of((scope, node.step_id))
    if a.failures:
        raise Halt.failed(node, scope, a.failures[-1])
    try:
        items = list(node.items(run.source(item, has_item), run.state))
    except Exception as exc:
        await _selector_failed(run, node, scope, a, exc)
    collected: list[Any] = []
    for index, element in enumerate(items):
        child = f"{scope}/{index}" if scope else str(index)
        collected.append(await run.walk(node.body, child, element, True))
    if node.into is not None:
        # Derived, not journaled: a replay computes the same list from the same rows.
        try:
            run.state = run.applied(node.into, collected)
        except ValidationError as exc:
            run.forward(node, scope)
            await run.fail_node(
                node,
                scope,
                a.last_attempt + 1,
                f"for_each {node.name!r}: the collected results do not fit state field "
                f"{node.into!r}: {exc.errors()[0].get('msg')}",
                "for_each.result_invalid",
            )
    return collected


#: When branches halt for different reasons, the run halts for the first of these kinds
#: found; then for any other error; a sibling's ``HALTED`` only if nothing else happened.
_FORK_PRECEDENCE = (
    HaltKind.ABORT,
    HaltKind.YIELD,
    HaltKind.STOPPED,
    HaltKind.DEADLINE,
    HaltKind.FAILED,
)


async def fork(run: Run, node: ForkNode, scope: str, item: Any, has_item: bool) -> Any:
    """Branches run concurrently, each in a scope of its own, and join. A branch that
    fails stops its siblings at their next boundary; then the usual path compensates
    every step that finished, in any branch, newest first."""
    prefix = f"{scope}/" if scope else ""
    run.branching()
    tasks = [
        asyncio.get_running_loop().create_task(
            run.walk(branch, f"{prefix}{node.step_id}.{i}", item, has_item)
        )
        for i, branch in enumerate(node.branches)
    ]
    try:
        _done, running = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        if running:
            run.stop_forward(halted=True)
            await asyncio.wait(running)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    outcomes = [t.exception() if not t.cancelled() else None for t in tasks]
    for kind in _FORK_PRECEDENCE:
        first = next((e for e in outcomes if isinstance(e, Halt) and e.kind is kind), None)
        if first is not None:
            raise first
    other = next((e for e in outcomes if e is not None and not _is_halted(e)), None)
    if other is not None:
        raise other
    halted = next((e for e in outcomes if e is not None and _is_halted(e)), None)
    if halted is not None:  # compensating: nothing forward ran in any branch
        raise halted
    return [t.result() for t in tasks]


def _is_halted(exc: BaseException) -> bool:
    return isinstance(exc, Halt) and exc.kind is HaltKind.HALTED
