"""Plan errors surface at build time with a FLOWX code and a fix (R2.12)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

import flowx


class Inp(BaseModel):
    n: int = 0


class St(BaseModel):
    a: int | None = None
    items: list[int] = []


@flowx.capability("diag.one", version="1.0.0")
def one(ctx: flowx.StepContext, x: Inp) -> int:
    return 1


@flowx.capability("diag.unsafe", version="1.0.0", idempotent=False)
def unsafe(ctx: flowx.StepContext, x: Inp) -> int:
    return 1


@flowx.event("diag.happened")
class Happened(BaseModel):
    n: int


class Undeclared(BaseModel):
    n: int


def plain(ctx: object, x: object) -> None:
    return None


def base(**kw: object) -> flowx.plan.FlowBuilder[Inp]:  # type: ignore[name-defined]
    return flowx.flow("diag.flow", version="1", input=Inp, state=St, **kw)  # type: ignore[arg-type]


def code_of(build: object) -> str:
    with pytest.raises(flowx.PlanError) as err:
        build()  # type: ignore[operator]
    assert err.value.code in err.value.message
    return err.value.code


def test_an_empty_flow_is_FLOWX1001() -> None:
    assert code_of(lambda: base().build()) == "FLOWX1001"


def test_a_step_that_is_not_a_capability_is_FLOWX1002() -> None:
    assert code_of(lambda: base().step(plain).build()) == "FLOWX1002"


def test_duplicate_names_are_FLOWX1003_and_say_how_to_fix() -> None:
    with pytest.raises(flowx.PlanError) as err:
        base().step(one).step(one).build()
    assert err.value.code == "FLOWX1003"
    assert "name=" in err.value.message
    base().step(one).step(one, name="again").build()  # the fix works


def test_an_into_that_is_not_a_state_field_is_FLOWX1004_and_lists_the_fields() -> None:
    with pytest.raises(flowx.PlanError) as err:
        base().step(one, into="nope").build()
    assert err.value.code == "FLOWX1004"
    assert "a, items" in err.value.message


def test_a_compensate_that_is_not_a_capability_is_FLOWX1005() -> None:
    assert code_of(lambda: base().step(one, compensate=plain).build()) == "FLOWX1005"


def test_a_state_model_without_defaults_is_FLOWX1006() -> None:
    class Needs(BaseModel):
        x: int

    assert (
        code_of(lambda: flowx.flow("diag.f", version="1", input=Inp, state=Needs).step(one).build())
        == "FLOWX1006"
    )


def test_an_input_that_is_not_a_model_is_FLOWX1007() -> None:
    assert (
        code_of(
            lambda: flowx.flow("diag.f", version="1", input=dict).step(one).build()  # type: ignore[type-var]
        )
        == "FLOWX1007"
    )


def test_retrying_a_non_idempotent_capability_is_FLOWX1008() -> None:
    assert (
        code_of(lambda: base().step(unsafe, retry=flowx.Retry(attempts=3)).build()) == "FLOWX1008"
    )
    plan = base().step(unsafe).build()  # no retry= : it is simply never retried
    assert plan.body[0].retry.attempts == 1  # type: ignore[attr-defined]


def test_a_bad_duration_is_FLOWX1009() -> None:
    assert code_of(lambda: base(deadline="soon").step(one).build()) == "FLOWX1009"


def test_a_for_each_into_that_is_not_a_list_is_FLOWX1011() -> None:
    assert (
        code_of(
            lambda: (
                base().for_each("each", lambda i, s: [1], lambda b: b.step(one), into="a").build()
            )
        )
        == "FLOWX1011"
    )


def test_a_fork_with_one_branch_is_FLOWX1013() -> None:
    assert code_of(lambda: base().fork("f", lambda b: b.step(one)).build()) == "FLOWX1013"


def test_a_malformed_flow_id_or_version_is_FLOWX1014() -> None:
    assert (
        code_of(lambda: flowx.flow("Bad Id", version="1", input=Inp).step(one).build())
        == "FLOWX1014"
    )
    assert (
        code_of(lambda: flowx.flow("ok.id", version="v1", input=Inp).step(one).build())
        == "FLOWX1014"
    )


def test_into_without_a_state_model_is_FLOWX1015() -> None:
    assert (
        code_of(lambda: flowx.flow("diag.f", version="1", input=Inp).step(one, into="a").build())
        == "FLOWX1015"
    )


def test_signals_and_timers_in_an_ephemeral_flow_are_FLOWX1017() -> None:
    eph = {"profile": flowx.Ephemeral}
    assert code_of(lambda: base(**eph).step(one).await_signal("go", Inp).build()) == "FLOWX1017"
    assert code_of(lambda: base(**eph).step(one).sleep("1h").build()) == "FLOWX1017"
    base().step(one).await_signal("go", Inp).sleep("1h").build()  # Durable: fine


def test_an_emit_in_an_ephemeral_flow_or_without_a_contract_is_FLOWX1024() -> None:
    assert (
        code_of(
            lambda: base(profile=flowx.Ephemeral).emit(Happened, lambda i, s: Happened(n=1)).build()
        )
        == "FLOWX1024"
    )
    assert (
        code_of(lambda: base().emit(Undeclared, lambda i, s: Undeclared(n=1)).build())
        == "FLOWX1024"
    )


def test_a_capability_id_that_is_not_registered_is_FLOWX1018() -> None:
    assert code_of(lambda: base().step("diag.missing").build()) == "FLOWX1018"


def test_step_ids_are_depth_first_positions_and_every_construct_fits_the_scheme() -> None:
    plan = (
        base()
        .step(one)
        .for_each("each", lambda i, s: [1, 2], lambda b: b.step(one, name="inner"))
        .fork("both", lambda b: b.step(one, name="left"), lambda b: b.step(one, name="right"))
        .await_signal("approved", Inp)
        .sleep("1d", name="nap")
        .build()
    )
    assert [(n.step_id, n.name, n.kind) for n in plan.nodes()] == [
        (1, "diag.one", "step"),
        (2, "each", "for_each"),
        (3, "inner", "step"),
        (4, "both", "fork"),
        (5, "left", "step"),
        (6, "right", "step"),
        (7, "approved", "await_signal"),
        (8, "nap", "sleep"),
    ]


def test_a_string_reference_resolves_the_highest_matching_version() -> None:
    @flowx.capability("diag.versioned", version="1.2.0")
    def v120(ctx: object) -> int:
        return 120

    @flowx.capability("diag.versioned", version="1.10.0")
    def v1100(ctx: object) -> int:
        return 1100

    @flowx.capability("diag.versioned", version="2.0.0")
    def v200(ctx: object) -> int:
        return 200

    plan = base().step("diag.versioned", version="1").build()
    assert plan.body[0].capability.version == "1.10.0"  # type: ignore[attr-defined]
    plan = base().step("diag.versioned", version="1.2").build()
    assert plan.body[0].capability.version == "1.2.0"  # type: ignore[attr-defined]


def test_an_empty_loop_body_or_branch_is_FLOWX1010() -> None:
    assert code_of(lambda: base().for_each("each", lambda i, s: [1], lambda b: b).build()) == (
        "FLOWX1010"
    )
    assert code_of(lambda: base().fork("f", lambda b: b.step(one), lambda b: b).build()) == (
        "FLOWX1010"
    )
    no_branch = base().await_signal("go", Inp, timeout="1h", on_timeout=lambda b: b)
    assert code_of(no_branch.build) == "FLOWX1010"


def test_a_sub_flow_of_something_that_is_not_a_built_plan_is_FLOWX1012() -> None:
    unbuilt = flowx.flow("diag.child", version="1", input=Inp).step(one)
    assert code_of(lambda: base().sub_flow(unbuilt, lambda i, s: i).build()) == "FLOWX1012"  # type: ignore[arg-type]


def test_a_selector_that_is_not_callable_is_FLOWX1016_and_names_the_option() -> None:
    child = flowx.flow("diag.child", version="1", input=Inp).step(one).build()
    cases = {
        "argument=": lambda: base().step(one, argument=5),  # type: ignore[arg-type]
        "items": lambda: base().for_each("each", 5, lambda b: b.step(one)),  # type: ignore[arg-type]
        "build": lambda: base().emit(Happened, 5),  # type: ignore[arg-type]
        "partition_key=": lambda: base().emit(Happened, lambda i, s: 1, partition_key=5),  # type: ignore[arg-type]
        "input": lambda: base().sub_flow(child, 5),  # type: ignore[arg-type]
    }
    for option, builder in cases.items():
        with pytest.raises(flowx.PlanError) as err:
            builder().build()
        assert err.value.code == "FLOWX1016"
        assert f"{option} must be a function" in err.value.message


def test_a_duplicate_name_inside_a_loop_names_both_step_ids() -> None:
    # The loop claims its id (2) before its body, so the repeated step is step 3.
    with pytest.raises(flowx.PlanError) as err:
        base().step(one).for_each("each", lambda i, s: [1], lambda b: b.step(one)).build()
    assert err.value.code == "FLOWX1003"
    assert "used by step 1 and again by step 3" in err.value.message


def test_every_node_kind_the_builder_records_has_a_compile_function() -> None:
    from flowx.plan.compile import COMPILERS
    from flowx.plan.drafts import NodeDraft

    assert set(COMPILERS) == set(NodeDraft.__subclasses__())
