"""Compiling the nodes that suspend an instance: ``await_signal``, ``sleep`` and ``sub_flow``.

They share two refusals, checked before anything else about them: an instance waits at one
place at a time, so no wait inside a fork branch (FLOWX1019); and a signal or a timer needs a
journal to be woken from, so none in an Ephemeral flow (FLOWX1017; a sub-flow says FLOWX1022
in its own words).
"""

from __future__ import annotations

from pydantic import TypeAdapter

from flowx.durations import parse_duration
from flowx.plan.compiler import Compiler
from flowx.plan.drafts import AwaitSignalDraft, NodeDraft, SleepDraft, SubFlowDraft
from flowx.plan.model import AwaitSignalNode, Plan, Profile, SleepNode, SubFlowNode


def _refuse_in_fork(c: Compiler, d: NodeDraft) -> None:
    if c.in_fork is not None:
        raise c.error(
            "FLOWX1019",
            f"{d.kind} {d.name or ''!s} is inside a branch of fork {c.in_fork!r}; an "
            "instance waits at one place at a time, so a branch cannot suspend it while "
            "its siblings run. Put the wait before or after the fork",
        )


def _refuse_ephemeral(c: Compiler, d: NodeDraft) -> None:
    if c.profile is Profile.EPHEMERAL:
        raise c.error(
            "FLOWX1017",
            f"{d.kind} {d.name or ''!s} is in an Ephemeral flow, which journals "
            "nothing, so nothing could wake it after a restart; make the flow Durable",
        )


def compile_sleep(c: Compiler, d: SleepDraft) -> SleepNode:
    """A durable timer; unnamed, it is called after its duration as written."""
    _refuse_in_fork(c, d)
    _refuse_ephemeral(c, d)
    try:
        duration = parse_duration(d.duration, what="sleep duration")
    except ValueError as exc:
        raise c.error("FLOWX1009", str(exc)) from exc
    name = d.name or f"sleep:{d.duration}"
    return SleepNode(step_id=c.claim(name), name=name, duration=duration)


def compile_await_signal(c: Compiler, d: AwaitSignalDraft) -> AwaitSignalNode:
    """A wait for one signal name with one payload type; it claims its id after every check,
    and its ``on_timeout`` branch follows it depth first."""
    _refuse_in_fork(c, d)
    _refuse_ephemeral(c, d)
    name = d.name or d.signal
    c.check_into(d.into, f"await_signal {name!r}")
    timeout = None
    if d.timeout is not None:
        try:
            timeout = parse_duration(d.timeout, what="signal timeout")
        except ValueError as exc:
            raise c.error("FLOWX1009", str(exc)) from exc
    where = f"await_signal {name!r}"
    _check_signal(c, d, where)
    if d.on_timeout is not None:
        if timeout is None:
            raise c.error("FLOWX1009", f"{where} has on_timeout= but no timeout=; give it one")
        if not d.on_timeout:
            raise c.error("FLOWX1010", f"{where} has an empty on_timeout branch")
    step_id = c.claim(name)
    return AwaitSignalNode(
        step_id=step_id,
        name=name,
        signal=d.signal,
        payload_type=d.payload_type,
        timeout=timeout,
        into=d.into,
        on_timeout=c.nodes(d.on_timeout) if d.on_timeout is not None else (),
    )


def _check_signal(c: Compiler, d: AwaitSignalDraft, where: str) -> None:
    """The signal's name is the author's (FLOWX1023) and its payload type is one type that
    pydantic can validate a sent payload against (FLOWX1021)."""
    if not isinstance(d.signal, str) or not d.signal or d.signal.startswith("flowx."):
        raise c.error(
            "FLOWX1023",
            f"{where}: signal name {d.signal!r} must be a non-empty string not "
            "starting with 'flowx.' (FlowX's own waits use that prefix)",
        )
    known = c.signal_types.setdefault(d.signal, d.payload_type)
    if known != d.payload_type:
        raise c.error(
            "FLOWX1021",
            f"{where}: signal {d.signal!r} is awaited elsewhere in this flow as "
            f"{known!r}; one signal name has one payload type, so use another name",
        )
    try:
        TypeAdapter(d.payload_type)
    except Exception as exc:
        raise c.error(
            "FLOWX1021",
            f"{where}: payload type {d.payload_type!r} cannot be validated "
            f"({exc}); use a pydantic model or a plain type such as dict or str",
        ) from exc


def compile_sub_flow(c: Compiler, d: SubFlowDraft) -> SubFlowNode:
    """A child instance the parent waits for durably, so both must be Durable (FLOWX1022)."""
    _refuse_in_fork(c, d)
    child = d.plan
    if not isinstance(child, Plan):
        raise c.error("FLOWX1012", "sub_flow(plan=...) must be a built plan (call .build())")
    name = d.name or f"sub_flow:{child.flow_id}"
    where = f"sub_flow {name!r}"
    if c.profile is Profile.EPHEMERAL or not child.durable:
        raise c.error(
            "FLOWX1022",
            f"{where}: a parent waits for its child durably, so both must be Durable "
            f"({c.flow_id} is {c.profile.value}, {child.ref} is "
            f"{child.profile.value})",
        )
    c.check_callable(d.input, "input", where)
    c.check_into(d.into, where)
    return SubFlowNode(
        step_id=c.claim(name),
        name=name,
        flow_id=child.flow_id,
        flow_version=child.version,
        input=d.input,
        into=d.into,
        plan=child,
    )
