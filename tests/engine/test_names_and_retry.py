"""Builder arguments (issue 12 item 11): a bad name is FLOWX1026 and a bad retry policy
FLOWX1027, raised when the plan is built or the policy made, never a ``TypeError`` or an
``OverflowError`` later; durations are bounded everywhere they are parsed."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

import flowx
from flowx.durations import MAX_DURATION, parse_duration
from flowx.plan.checks import MAX_NAME_LENGTH
from flowx.plan.diagnostics import CODES


class In(BaseModel):
    n: int = 0


@flowx.capability("names.noop", version="1.0.0")
def noop(ctx: flowx.StepContext) -> int:
    return 1


def base(flow_id: Any = "names.flow", version: Any = "1") -> Any:
    return flowx.flow(flow_id, version=version, input=In)


def code_of(build: Callable[[], object]) -> str:
    with pytest.raises(flowx.PlanError) as caught:
        build()
    assert "Traceback" not in str(caught.value)
    return caught.value.code


BAD_NAMES = [
    pytest.param("", id="empty"),
    pytest.param("a\x00b", id="nul"),
    pytest.param("a\nb", id="newline"),
    pytest.param("a\x1b[31m", id="escape"),
    pytest.param("a\u2028b", id="line-separator"),
    pytest.param("a\ud800", id="surrogate"),
    pytest.param("x" * (MAX_NAME_LENGTH + 1), id="too-long"),
    pytest.param(7, id="int"),
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_bad_step_name_is_FLOWX1026(name: Any) -> None:
    assert code_of(lambda: base().step(noop, name=name).build()) == "FLOWX1026"


@pytest.mark.parametrize("name", [n for n in BAD_NAMES if n.id != "empty"])
def test_a_bad_signal_name_is_FLOWX1026(name: Any) -> None:
    code = code_of(lambda: base().await_signal(name, dict).step(noop).build())
    assert code == ("FLOWX1023" if name == 7 else "FLOWX1026")


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_bad_fork_or_for_each_name_is_FLOWX1026(name: Any) -> None:
    assert (
        code_of(
            lambda: (
                base()
                .fork(name, lambda b: b.step(noop, name="a"), lambda b: b.step(noop, name="b"))
                .build()
            )
        )
        == "FLOWX1026"
    )
    assert (
        code_of(lambda: base().for_each(name, lambda i, s: [1], lambda b: b.step(noop)).build())
        == "FLOWX1026"
    )


@pytest.mark.parametrize("name", [n for n in BAD_NAMES if n.id != "empty"])
def test_a_bad_flow_id_is_FLOWX1026(name: Any) -> None:
    assert code_of(lambda: base(flow_id=name).step(noop).build()) == "FLOWX1026"


def test_an_empty_flow_id_or_a_malformed_version_keeps_FLOWX1014_or_is_FLOWX1026() -> None:
    assert code_of(lambda: base(flow_id="").step(noop).build()) == "FLOWX1026"
    assert code_of(lambda: base(version=1).step(noop).build()) == "FLOWX1014"
    assert code_of(lambda: base(version="1\n").step(noop).build()) == "FLOWX1014"
    assert code_of(lambda: base(flow_id="Bad Id").step(noop).build()) == "FLOWX1014"


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_bad_capability_id_is_FLOWX1026(name: Any) -> None:
    assert code_of(lambda: flowx.capability(name, version="1")) == "FLOWX1026"


def test_a_capability_id_or_version_with_a_trailing_newline_is_refused() -> None:
    """``re.match`` with ``$`` accepts one trailing newline; the checks use fullmatch."""
    with pytest.raises(flowx.FlowXError) as caught:
        flowx.capability("names.ok", version="1\n")
    assert caught.value.code == "capability.bad_version"
    with pytest.raises(flowx.FlowXError) as caught:
        flowx.capability("names.ok", version=None)  # type: ignore[arg-type]
    assert caught.value.code == "capability.bad_version"


def test_the_longest_name_is_accepted() -> None:
    name = "s" * MAX_NAME_LENGTH
    plan = base().step(noop, name=name).build()
    assert plan.body[0].name == name


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempts": 0},
        {"attempts": -1},
        {"attempts": float("nan")},
        {"attempts": 2.5},
        {"attempts": True},
        {"attempts": 10**9},
        {"backoff": "linear"},
        {"multiplier": float("nan")},
        {"multiplier": float("inf")},
        {"multiplier": 0.5},
        {"multiplier": "2"},
        {"initial": "-1s"},
        {"initial": float("nan")},
        {"maximum": "99999999999d"},
        {"maximum": timedelta(days=36_501)},
    ],
    ids=repr,
)
def test_a_retry_out_of_range_is_FLOWX1027_and_a_value_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(flowx.PlanError) as caught:
        flowx.Retry(**kwargs)
    assert caught.value.code == "FLOWX1027"
    assert isinstance(caught.value, ValueError)  # what Retry raised before the code existed


def test_a_retry_that_is_not_a_retry_is_FLOWX1027() -> None:
    assert code_of(lambda: base().step(noop, retry=3).build()) == "FLOWX1027"
    assert code_of(lambda: base().step(noop, compensate_retry={"attempts": 2}).build()) == (
        "FLOWX1027"
    )


def test_a_retry_delay_never_overflows() -> None:
    policy = flowx.Retry(attempts=10_000, multiplier=1_000, initial="1s", maximum="36500d")
    assert policy.delay(9_999) == MAX_DURATION.total_seconds()
    assert flowx.Retry(backoff="fixed", initial="2s", maximum="1s").delay(3) == 1.0
    assert flowx.Retry(initial="1s", maximum="10s").delay(3) == 4.0


@pytest.mark.parametrize(
    "value", ["99999999999d", "36501d", float("nan"), float("inf"), 10**400, -1, "1e3s", True]
)
def test_a_duration_out_of_range_is_a_value_error_naming_it(value: Any) -> None:
    with pytest.raises(ValueError, match="sleep"):
        parse_duration(value, what="sleep")


def test_a_plan_duration_out_of_range_is_FLOWX1009() -> None:
    assert code_of(lambda: base().sleep("99999999999d").step(noop).build()) == "FLOWX1009"
    assert (
        code_of(
            lambda: (
                flowx.flow("names.d", version="1", input=In, deadline=float("inf"))
                .step(noop)
                .build()
            )
        )
        == "FLOWX1009"
    )


def test_the_new_codes_are_documented() -> None:
    assert "FLOWX1026" in CODES and "FLOWX1027" in CODES


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("1h30m", 5400), ("1h 30m", 5400), ("2d4h", 187_200), ("1.5h", 5400)],
)
def test_a_duration_may_be_bare_seconds_or_units_largest_first(text: str, seconds: int) -> None:
    assert parse_duration(text, what="sleep").total_seconds() == seconds


@pytest.mark.parametrize("text", ["30m1h", "1h1h", "1h30", "h", "1 h m", "nan", "-5s"])
def test_a_duration_in_any_other_order_or_shape_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="sleep"):
        parse_duration(text, what="sleep")
