"""Which nodes' values a plan binds for sealed state fields (R9.8): the engine seals each such
node's row whole, and the host seals a signal awaited by one in the inbox."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, SecretStr

import flowx
from flowx.plan.model import bound_for
from flowx.sealing import sealed_fields
from tests.secrets.secret_flows import Approval, Payment, collect, part_reference, tokens


def _ids(plan: flowx.Plan, *names: str) -> frozenset[int]:
    return frozenset(n.step_id for n in plan.nodes() if n.name in names)


def test_a_for_each_binds_what_its_body_gives_back_through_forks_and_nested_for_eaches() -> None:
    fields = sealed_fields(collect.state_model)
    assert fields == {"references", "approvals", "tokens"}
    assert bound_for(collect.body, fields) == _ids(
        collect, "parts", "both", "left", "inner", "right", "approvals", "part_ok"
    ) | _ids(collect, "tokens", "token")
    assert bound_for(collect.body, frozenset({"approvals"})) == _ids(
        collect, "approvals", "part_ok"
    )
    assert bound_for(collect.body, frozenset()) == frozenset()


class State(BaseModel):
    kept: list[Any] = []
    last: str | None = None
    sent: str | None = None


@flowx.event("bound.sent", version="1")
class Sent(BaseModel):
    ref: str


class Wallet(BaseModel):
    plain: list[str] = []
    tokens: list[SecretStr] = []  # a secret type below the top level
    card: Approval | None = None  # nothing sensitive in it
    payment: Payment | None = None  # a model with secrets in it
    iban: flowx.Sensitive[str] = ""


def test_a_field_that_can_hold_a_secret_at_any_depth_is_sealed_for_the_rows_bound_for_it() -> None:
    """A step's row may hold the value in another shape than the field (a plain ``str``
    bound for a ``list[SecretStr]``): the field's declared type decides."""
    assert sealed_fields(Wallet) == {"tokens", "payment", "iban"}


def test_only_the_last_node_of_a_body_and_a_timeout_path_are_given_back() -> None:
    plan = (
        flowx.flow("bound.for", version="1", input=Payment, state=State)
        .for_each(
            "each",
            lambda p, s: ["a"],
            lambda body: body.step(part_reference, name="first", into="last").await_signal(
                "ok",
                Approval,
                timeout="1h",
                on_timeout=lambda t: t.step(part_reference, name="fallback"),
            ),
            into="kept",
        )
        .build()
    )
    # "first" feeds only its own field; the wait, or its timeout path, gives the element back.
    assert bound_for(plan.body, frozenset({"kept"})) == _ids(plan, "each", "ok", "fallback")
    assert bound_for(plan.body, frozenset({"last"})) == _ids(plan, "first")


def test_an_emit_gives_back_its_event_which_leaves_as_its_type_declares() -> None:
    plan = (
        flowx.flow("bound.emit", version="1", input=Payment, state=State)
        .for_each(
            "each",
            lambda p, s: ["a"],
            lambda body: body.emit(Sent, lambda part, s: Sent(ref=part)),
            into="kept",
        )
        .build()
    )
    assert bound_for(plan.body, frozenset({"kept"})) == _ids(plan, "each")


def test_a_sub_flow_as_the_last_node_gives_back_its_child_and_the_parent_row_is_bound() -> None:
    """The parent's row for the child holds the child's final state: bound like a step's
    result. (The child's own rows are sealed as the child's own types declare.)"""
    plan = (
        flowx.flow("bound.child", version="1", input=Payment, state=State)
        .for_each(
            "each",
            lambda p, s: [p],
            lambda body: body.step(part_reference, name="before").sub_flow(
                tokens, lambda element, s: element, name="child"
            ),
            into="kept",
        )
        .build()
    )
    assert bound_for(plan.body, frozenset({"kept"})) == _ids(plan, "each", "child")
