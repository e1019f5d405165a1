"""``build()``: check what the author wrote and compile it into a ``Plan``.

Checks run from the outside in, so the first mistake reported is the first one to fix: every
name and retry policy anywhere in the flow (they would otherwise surface as a ``TypeError``
deep in a check), then the flow's own options, then each node in step-id order through its
kind's compile function (R2.12).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ValidationError

from flowx.durations import parse_duration
from flowx.names import name_problem, shown
from flowx.plan.checks import BAD_RETRY, PlanArgumentError, check_name
from flowx.plan.compile_steps import compile_emit, compile_for_each, compile_fork, compile_step
from flowx.plan.compile_waits import compile_await_signal, compile_sleep, compile_sub_flow
from flowx.plan.compiler import Compiler, NodeCompiler, is_model_class, plan_error
from flowx.plan.drafts import (
    AwaitSignalDraft,
    Drafts,
    EmitDraft,
    FlowHeader,
    ForEachDraft,
    ForkDraft,
    NodeDraft,
    SleepDraft,
    StepDraft,
    SubFlowDraft,
)
from flowx.plan.model import NoState, Plan, Retry
from flowx.plan.timeouts import STEP_TIMEOUT_INVALID, step_timeout

_FLOW_ID = re.compile(r"^[a-z0-9][a-z0-9_.\-]*$")
_FLOW_VERSION = re.compile(r"^\d+(\.\d+){0,2}([-+][0-9A-Za-z.\-]+)?$")

#: Each draft kind's compile function. A kind the builder records but this table lacks is a
#: ``KeyError`` at the first build, and a test checks the table covers every draft class.
COMPILERS: Mapping[type[NodeDraft], NodeCompiler] = {
    StepDraft: compile_step,
    EmitDraft: compile_emit,
    ForEachDraft: compile_for_each,
    ForkDraft: compile_fork,
    AwaitSignalDraft: compile_await_signal,
    SleepDraft: compile_sleep,
    SubFlowDraft: compile_sub_flow,
}


def compile_plan(header: FlowHeader[Any], drafts: Drafts) -> Plan:
    """The checked, numbered ``Plan`` of a flow; ``PlanError`` at the first mistake."""
    check_names(header.flow_id, header.version, drafts)  # FLOWX1026/1027: names, retries
    state_model, deadline, default_timeout = _check_header(header)
    if not drafts:
        raise plan_error(header.flow_id, "FLOWX1001", "add at least one .step(...) before .build()")
    compiler = Compiler(header, state_model, default_timeout, COMPILERS)
    return Plan(
        flow_id=header.flow_id,
        version=header.version,
        input_model=header.input,
        state_model=state_model,
        profile=header.profile,
        body=compiler.nodes(drafts),
        deadline=deadline,
        partition_key=header.partition_key,
        step_timeout=default_timeout,
    )


def _check_header(
    header: FlowHeader[Any],
) -> tuple[type[BaseModel], timedelta | None, timedelta | None]:
    """The flow's own options, checked: its state model, deadline and default step timeout."""
    flow_id, version = header.flow_id, header.version
    if not _FLOW_ID.match(flow_id):
        raise plan_error(
            flow_id,
            "FLOWX1014",
            "the flow id must be lower-case letters, digits, '.', '_' or '-' (e.g. 'order.place')",
        )
    if not _FLOW_VERSION.match(version):
        raise plan_error(
            flow_id, "FLOWX1014", f"version {version!r} must look like '1', '1.2' or '1.2.3'"
        )
    if not is_model_class(header.input):
        raise plan_error(
            flow_id,
            "FLOWX1007",
            "input= must be a pydantic BaseModel subclass describing the input",
        )
    if header.state is not None and not is_model_class(header.state):
        raise plan_error(flow_id, "FLOWX1007", "state= must be a pydantic BaseModel subclass")
    state_model = header.state or NoState
    try:
        state_model()
    except ValidationError as exc:
        raise plan_error(
            flow_id,
            "FLOWX1006",
            f"state model {state_model.__name__} must be constructible with no arguments "
            f"(give every field a default): {exc.errors()[0]['loc']}",
        ) from exc
    deadline = None
    if header.deadline is not None:
        try:
            deadline = parse_duration(header.deadline, what="deadline")
        except ValueError as exc:
            raise plan_error(flow_id, "FLOWX1009", str(exc)) from exc
    try:
        default_timeout = step_timeout(header.step_timeout, where="step_timeout=")
    except ValueError as exc:
        raise plan_error(flow_id, STEP_TIMEOUT_INVALID, str(exc)) from exc
    return state_model, deadline, default_timeout


def check_names(flow_id: object, version: object, drafts: Drafts) -> None:
    """Check a flow's id, version and every node's name and retry policy before the plan is
    compiled, so a bad argument is named rather than met as a ``TypeError`` there."""
    check_name(flow_id, "the flow id")
    if not isinstance(version, str) or name_problem(version) is not None:
        raise PlanArgumentError(
            "FLOWX1014",
            f"flow {shown(flow_id)}: version {shown(version)} must look like '1', '1.2' or '1.2.3'",
            flow_id=str(flow_id),
        )
    _check_draft_names(str(flow_id), drafts)


def _check_draft_names(flow_id: str, drafts: Drafts) -> None:
    for d in drafts:
        if isinstance(d, AwaitSignalDraft):
            signal = d.signal
            if isinstance(signal, str) and signal:  # FLOWX1023 covers the rest
                check_name(signal, "signal name", flow_id)
            if d.name is not signal:  # recorded as ``name or signal``: the author named it
                check_name(d.name, f"await_signal {shown(signal)} name=", flow_id)
        elif d.name is not None or isinstance(d, ForEachDraft | ForkDraft):
            check_name(d.name, f"{d.kind} name=", flow_id)
        if isinstance(d, StepDraft):
            _check_retries(flow_id, d)
        for body in d.bodies():
            _check_draft_names(flow_id, body)


def _check_retries(flow_id: str, d: StepDraft) -> None:
    for key, policy in (("retry", d.retry), ("compensate_retry", d.compensate_retry)):
        if policy is not None and not isinstance(policy, Retry):
            raise PlanArgumentError(
                BAD_RETRY,
                f"flow {shown(flow_id)}: {d.kind} {shown(d.name)} has {key}="
                f"{shown(policy)}; pass flowx.Retry(attempts=..., ...)",
                flow_id=flow_id,
            )
