"""Compiling the nodes that run in place: ``step``, ``emit``, ``for_each`` and ``fork``.

One function per kind, each checking its draft in the order the author would fix it and
wording every mistake with the node's name and a ``FLOWX`` code (R2.12). The order of the
checks, and whether a node claims its step id before or after its body, is part of the
behaviour: step ids are depth-first positions, and FLOWX1003 names them.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from flowx.plan.compiler import Compiler, is_model_class
from flowx.plan.drafts import EmitDraft, ForEachDraft, ForkDraft, StepDraft
from flowx.plan.events import contract_of
from flowx.plan.model import (
    DEFAULT_COMPENSATION_RETRY,
    DEFAULT_STEP_RETRY,
    NO_RETRY,
    EmitNode,
    ForEachNode,
    ForkNode,
    Node,
    Profile,
    Retry,
    StepNode,
    walk,
)
from flowx.plan.timeouts import STEP_TIMEOUT_INVALID, step_timeout


def compile_step(c: Compiler, d: StepDraft) -> StepNode:
    """Check one step against its capability and the flow, and build its node."""
    cap = c.capability(d.target, d.version, "step", "FLOWX1002")
    name = d.name or cap.id
    where = f"step {name!r}"
    step_id = c.claim(name)
    c.check_into(d.into, where)
    c.check_callable(d.argument, "argument=", where)
    retry: Retry = d.retry or (DEFAULT_STEP_RETRY if cap.idempotent else NO_RETRY)
    if not cap.idempotent and retry.attempts > 1:
        raise c.error(
            "FLOWX1008",
            f"{where} asks for {retry.attempts} attempts, but {cap.ref} is declared "
            "idempotent=False and is never retried automatically (R4.2); drop retry= "
            "or make the capability idempotent (pass ctx.idempotency_key on)",
        )
    comp = None
    if d.compensate is not None:
        comp = c.capability(d.compensate, None, f"{where} compensate=", "FLOWX1005")
    comp_retry: Retry = d.compensate_retry or DEFAULT_COMPENSATION_RETRY
    if comp is not None and not comp.idempotent:
        comp_retry = NO_RETRY
    try:
        timeout = step_timeout(d.timeout, where=where)
    except ValueError as exc:
        raise c.error(STEP_TIMEOUT_INVALID, str(exc)) from exc
    return StepNode(
        step_id=step_id,
        name=name,
        capability=cap,
        into=d.into,
        retry=retry,
        compensate=comp,
        compensate_retry=comp_retry,
        argument=d.argument,
        timeout=timeout if timeout is not None else c.step_timeout,
    )


def compile_emit(c: Compiler, d: EmitDraft) -> EmitNode:
    """An event needs a declared contract and a journal to be staged with (FLOWX1024)."""
    event_type = d.event_type
    name = d.name or f"emit:{getattr(event_type, '__name__', event_type)}"
    where = f"emit {name!r}"
    if c.profile is Profile.EPHEMERAL:
        raise c.error(
            "FLOWX1024",
            f"{where} is in an Ephemeral flow, which keeps no journal, so there is no "
            "transaction to stage the event in; make the flow Durable or publish from "
            "a capability",
        )
    if not is_model_class(event_type) or contract_of(event_type) is None:
        raise c.error(
            "FLOWX1024",
            f"{where}: {event_type!r} has no declared event contract; decorate a "
            "pydantic model with @flowx.event('type.name', version='1')",
        )
    c.check_callable(d.build, "build", where)
    c.check_callable(d.partition_key, "partition_key=", where)
    return EmitNode(
        step_id=c.claim(name),
        name=name,
        event_type=event_type,
        build=d.build,
        partition_key=d.partition_key,
    )


def _is_list_annotation(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is list or annotation is list:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_is_list_annotation(a) for a in typing.get_args(annotation))
    return False


def compile_for_each(c: Compiler, d: ForEachDraft) -> ForEachNode:
    """The loop claims its id before its body, whose nodes follow it depth first."""
    name = d.name or "for_each"
    where = f"for_each {name!r}"
    step_id = c.claim(name)
    c.check_callable(d.items, "items", where)
    c.check_into(d.into, where)
    if d.into is not None and not _is_list_annotation(
        c.state_model.model_fields[d.into].annotation
    ):
        raise c.error("FLOWX1011", f"{where}: into={d.into!r} must be a list field")
    if not d.body:
        raise c.error("FLOWX1010", f"{where} has an empty body; add a step to it")
    return ForEachNode(
        step_id=step_id,
        name=name,
        items=d.items,
        body=c.nodes(d.body),
        into=d.into,
    )


def compile_fork(c: Compiler, d: ForkDraft) -> ForkNode:
    """Two or more non-empty branches, compiled as fork ``name``'s (so waits are refused in
    them), that write no state field in common (FLOWX1020)."""
    name = d.name or "fork"
    step_id = c.claim(name)
    if len(d.branches) < 2:
        raise c.error(
            "FLOWX1013",
            f"fork {name!r} has {len(d.branches)} branch(es); give it two or "
            "more, or write the steps inline",
        )
    for i, branch in enumerate(d.branches):
        if not branch:
            raise c.error("FLOWX1010", f"fork {name!r} branch {i} is empty")
    outer, c.in_fork = c.in_fork, name
    try:
        branches = tuple(c.nodes(branch) for branch in d.branches)
    finally:
        c.in_fork = outer
    _check_branch_writes(c, name, branches)
    return ForkNode(step_id=step_id, name=name, branches=branches)


def _check_branch_writes(c: Compiler, name: str, branches: tuple[tuple[Node, ...], ...]) -> None:
    writers: dict[str, int] = {}
    for i, branch_nodes in enumerate(branches):
        written = {getattr(n, "into", None) for n in walk(branch_nodes)} - {None}
        for field_name in sorted(str(f) for f in written):
            if field_name in writers:
                raise c.error(
                    "FLOWX1020",
                    f"fork {name!r}: branches {writers[field_name]} and {i} both write "
                    f"state field {field_name!r}; concurrent branches would race for "
                    "it, so give each branch fields of its own",
                )
            writers[field_name] = i
