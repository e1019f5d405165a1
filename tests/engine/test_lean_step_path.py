"""What the trimmed step path (issue 14) must still do as before: the live run goes on with
the value a replay reads back from the row (R2.5), and the run's result is the state the
journal holds at its end; fork branches' commits still take turns, the state copy a result
is validated into is pydantic's, and this run's own commits are indexed as rows would be."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, ConfigDict, PrivateAttr
from pydantic_core import SchemaValidator

import flowx
from flowx import codec
from flowx.engine.history import History
from flowx.engine.run import _ASSIGNS, Run, _assigner, _copied
from flowx.stores.records import Outcome, StepWrite
from tests.engine import kit
from tests.engine.kit import rows_of

MARKED = '{"$flowx.sealed": "a document a capability read, returned verbatim"}'


class Noted(BaseModel):
    note: str | None = None
    seen: list[str] = []


@flowx.capability("lean.echo", version="1.0.0")
async def echo(ctx: flowx.StepContext, order: kit.Order) -> str:
    return MARKED


@flowx.capability("lean.plain", version="1.0.0")
async def plain(ctx: flowx.StepContext, order: kit.Order) -> str:
    return "a"


@flowx.capability("lean.each", version="1.0.0")
async def each(ctx: flowx.StepContext, n: int) -> str:
    return "b"


async def test_a_text_result_holding_the_sealing_mark_is_read_back_as_a_replay_reads_it(
    host_factory: Any,
) -> None:
    """A ``str`` result is not decoded again after encoding (JSON gives it back as it is),
    except one holding the sealing mark's text: decoding it without keys refuses it, as a
    replay of the row would. Skipped, the live run committed a success no node could ever
    replay."""
    plan = (
        flowx.flow("lean.mark", version="1", input=kit.Order, state=Noted)
        .step(echo, into="note")
        .build()
    )
    host = await host_factory(plan)
    handle = await host.start(plan, kit.Order(order_id="m1"))
    with contextlib.suppress(flowx.FlowFailed):
        await handle.result()
    (first, *_) = await rows_of(host, handle.instance_id)
    assert first.outcome is flowx.Outcome.FAILURE
    assert codec.loads(first.result)["code"] == "keys.missing"


def counted(order: kit.Order, state: Noted) -> list[int]:
    state.seen.append("counted")  # a selector that changes the state it is handed, in place
    return [1]


async def test_the_result_is_the_state_the_instance_ended_with(host_factory: Any) -> None:
    """The run's result reuses the encoding of its last write: the transition that ends
    the instance is that write, so a state changed in place after the last step's commit
    is in both the stored row and the result."""
    plan = (
        flowx.flow("lean.inplace", version="1", input=kit.Order, state=Noted)
        .step(plain, into="note")
        .for_each("each", counted, lambda body: body.step(each))
        .build()
    )
    host = await host_factory(plan)
    handle = await host.start(plan, kit.Order(order_id="i1"))
    here = await handle.result()  # this node's RunResult
    stored = codec.loads((await host.get(handle.instance_id)).state_bag)
    assert here.model_dump() == stored == {"note": "a", "seen": ["counted"]}


# -- fork branches take turns only once there are branches (Run.branching) -----------------

#: Set by each branch's capability as it returns; made afresh by the test that uses them (an
#: event belongs to the loop it first waited in).
arrived: dict[str, asyncio.Event] = {}


@flowx.capability("lean.left", version="1.0.0")
async def left(ctx: flowx.StepContext, order: kit.Order) -> str:
    arrived["left"].set()
    return "L"


@flowx.capability("lean.right", version="1.0.0")
async def right(ctx: flowx.StepContext, order: kit.Order) -> str:
    arrived["right"].set()
    return "R"


class Sides(BaseModel):
    left: str | None = None
    right: str | None = None


class _CrossingJournal:
    """A journal whose fork-branch commits each wait until the other branch's capability has
    returned: two branch commits are then under way at once unless the run makes them take
    turns. Everything else goes straight through."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def commit(self, commit: Any) -> Any:
        step = commit.step
        if step is not None and step.step_name in ("left", "right"):
            other = "right" if step.step_name == "left" else "left"
            await asyncio.wait_for(arrived[other].wait(), timeout=5)
        return await self._inner.commit(commit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Crossing:
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.journal = _CrossingJournal(inner.journal)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_fork_branches_committing_at_once_each_keep_their_field(
    host_factory: Any, memory_store: Any
) -> None:
    """A run commits without a lock until a fork starts branches; from then on the branches'
    commits take turns, so one branch's state snapshot never drops the other's field."""
    arrived.update(left=asyncio.Event(), right=asyncio.Event())
    plan = (
        flowx.flow("lean.sides", version="1", input=kit.Order, state=Sides)
        .fork(
            "both",
            lambda b: b.step(left, name="left", into="left"),
            lambda b: b.step(right, name="right", into="right"),
        )
        .build()
    )
    host = await host_factory(plan, store=_Crossing(memory_store))
    handle = await host.start(plan, kit.Order(order_id="s1"))
    state = await handle.result(timeout=10)
    assert (state.left, state.right) == ("L", "R")
    stored = codec.loads((await host.get(handle.instance_id)).state_bag)
    assert stored == {"left": "L", "right": "R"}


# -- the state copy a step's result is validated into (run._copied) ------------------------


class Plain(BaseModel):
    last: int | None = None
    items: list[int] = []


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")
    last: int | None = None


class Private(BaseModel):
    last: int | None = None
    _seen: list[str] = PrivateAttr(default_factory=list)


class OwnCopy(BaseModel):
    last: int | None = None
    copies: ClassVar[int] = 0

    def __copy__(self) -> OwnCopy:
        OwnCopy.copies += 1
        return super().__copy__()


def _parts(model: BaseModel) -> tuple[Any, ...]:
    return (
        type(model),
        model.__dict__,
        model.__pydantic_fields_set__,
        model.__pydantic_extra__,
        model.__pydantic_private__,
    )


@pytest.mark.parametrize(
    "original",
    [
        Plain(last=1, items=[1, 2]),
        Plain(),
        Open(last=2, note="kept", more=[1]),
        Private(last=3),
    ],
    ids=["plain", "defaults", "extra fields", "private attributes"],
)
def test_the_state_copy_is_pydantics_shallow_copy(original: BaseModel) -> None:
    if isinstance(original, Private):
        original._seen.append("x")
    before = _parts(original)
    fields_set = set(original.__pydantic_fields_set__)
    copied = _copied(original)
    assert copied is not original
    assert _parts(copied) == _parts(original.model_copy())
    # Its own containers: assigning a field of the copy leaves the original as it was.
    validator = type(original).__pydantic_validator__
    validator.validate_assignment(copied, "last", 9)
    assert copied.last == 9 and "last" in copied.__pydantic_fields_set__
    assert _parts(original) == before
    assert original.__pydantic_fields_set__ == fields_set
    if isinstance(original, Open):
        assert copied.__pydantic_extra__ is not original.__pydantic_extra__


class OwnModelCopy(BaseModel):
    last: int | None = None
    copies: ClassVar[int] = 0

    def model_copy(self, *, update: Any = None, deep: bool = False) -> OwnModelCopy:
        OwnModelCopy.copies += 1
        return super().model_copy(update=update, deep=deep)


class OwnNew(BaseModel):
    last: int | None = None
    copies: ClassVar[int] = 0

    def __new__(cls, *args: Any, **kwargs: Any) -> OwnNew:
        OwnNew.copies += 1  # pydantic's copy makes the copy through ``cls.__new__``
        return super().__new__(cls)


@pytest.mark.parametrize(
    "model", [OwnCopy, OwnModelCopy, OwnNew], ids=["__copy__", "model_copy", "__new__"]
)
def test_a_model_with_its_own_copy_is_copied_by_it(model: Any) -> None:
    original = model(last=1)
    before = model.copies
    copied = _copied(original)
    assert model.copies == before + 1 and copied.last == 1


class Frozen(BaseModel, frozen=True):
    last: int | None = None


class Later(BaseModel):
    child: Missing | None = None


def test_what_assigns_a_state_field_is_kept_once_its_class_has_it() -> None:
    """``Run.applied`` looks a state class's validator up once (a pydantic class's own
    attributes are slow to read): a frozen class is rebuilt whole; a class still waiting
    for ``model_rebuild`` has a stand-in, asked again until the real one is there."""
    assert _assigner(Frozen) is None and _ASSIGNS[Frozen] is None
    assert _assigner(Plain) is Plain.__pydantic_validator__ is _ASSIGNS[Plain]
    assert _assigner(Later) is Later.__pydantic_validator__ and Later not in _ASSIGNS
    Later.model_rebuild()
    assert _assigner(Later) is Later.__pydantic_validator__ is _ASSIGNS[Later]
    assert isinstance(_ASSIGNS[Later], SchemaValidator)


class Missing(BaseModel):  # defined after ``Later``, which names it
    n: int = 0


# -- the index of this run's own commits (History.committed) -------------------------------


def _write(outcome: Outcome, attempt: int = 1) -> StepWrite:
    return StepWrite(
        scope="",
        step_id=1,
        attempt=attempt,
        step_name="s",
        outcome=outcome,
        result=codec.dumps({"message": "m"}) if outcome is not Outcome.SUCCESS else "1",
        capability_id="c",
        capability_version="2",
        duration_ms=0,
    )


@pytest.mark.parametrize(
    ("earlier", "replay_sequence"),
    [((), None), ((), 5), ((Outcome.FAILURE,), None), ((Outcome.SUCCESS,), None)],
    ids=[
        "a first success",
        "a first success in a replay",
        "a success after a failure",
        "a second success",
    ],
)
def test_a_committed_success_is_indexed_as_the_row_would_be(
    earlier: tuple[Outcome], replay_sequence: int | None
) -> None:
    """The first success of a step, outside a replay from a chosen step, is indexed by a
    shortcut; the index it makes is the one ``_absorb`` makes (the other cases go through
    ``_absorb`` itself, and are here to show the two stay interchangeable)."""
    plan = flowx.flow("lean.index", version="1", input=kit.Order).step(plain, name="s").build()
    direct, through_rows = (History(plan, "i", (), replay_sequence) for _ in range(2))
    writes = [_write(o, n + 1) for n, o in enumerate(earlier)]
    writes.append(_write(Outcome.SUCCESS, len(writes) + 1))
    for w in writes:
        direct.committed(("", 1), w)
        through_rows._absorb(
            ("", 1), w.attempt, w.outcome, w.result, w.nondeterministic,
            w.capability_version, None,
        )  # fmt: skip
    assert direct.attempts == through_rows.attempts
    assert direct.of(("", 1)).last_attempt == len(writes)


UNDONE: list[tuple[str, Any]] = []


@flowx.capability("lean.first", version="1.0.0")
async def first_step(ctx: flowx.StepContext, order: kit.Order) -> str:
    return "one"


@flowx.capability("lean.middle", version="1.0.0")
async def middle_step(ctx: flowx.StepContext, order: kit.Order) -> str:
    return "two"


@flowx.capability("lean.third", version="1.0.0")
async def third_step(ctx: flowx.StepContext, order: kit.Order) -> str:
    return "three"


@flowx.capability("lean.last", version="1.0.0")
async def last_step(ctx: flowx.StepContext, order: kit.Order) -> str:
    raise flowx.NonRetryableError("the last step refuses")


@flowx.capability("lean.undo_first", version="1.0.0")
async def undo_first(ctx: flowx.StepContext, order: kit.Order) -> None:
    UNDONE.append(("first", ctx.step_result))


@flowx.capability("lean.undo_third", version="1.0.0")
async def undo_third(ctx: flowx.StepContext, order: kit.Order) -> None:
    UNDONE.append(("third", ctx.step_result))


async def test_steps_with_no_compensation_are_not_kept_and_the_rest_are_undone_newest_first(
    host_factory: Any,
) -> None:
    """The run keeps only the finished steps something can undo (``Run.keep``): a step with
    no compensation between two that have one changes neither which are undone nor their
    order, and each compensation still sees its own step's result."""
    UNDONE.clear()
    plan = (
        flowx.flow("lean.kept", version="1", input=kit.Order, state=Noted)
        .step(first_step, compensate=undo_first)
        .step(middle_step, into="note")
        .step(third_step, compensate=undo_third)
        .step(last_step)
        .build()
    )
    host = await host_factory(plan)
    handle = await host.start(plan, kit.Order(order_id="k1"))
    failed = await kit.failure_of(handle)
    assert failed.state == "Failed"
    assert UNDONE == [("third", "three"), ("first", "one")]
    rows = await rows_of(host, handle.instance_id)
    assert [(r.step_id, r.outcome) for r in rows] == [
        (1, Outcome.SUCCESS),
        (2, Outcome.SUCCESS),
        (3, Outcome.SUCCESS),
        (4, Outcome.FAILURE),
        (3, Outcome.COMPENSATED),
        (1, Outcome.COMPENSATED),
    ]


def test_a_run_keeps_for_its_saga_only_the_steps_something_can_undo() -> None:
    """``Run.keep`` holds a finished step (its argument and result) only when it has a
    compensation: the others would never be undone, so the run does not carry them."""
    plan = (
        flowx.flow("lean.keeps", version="1", input=kit.Order, state=Noted)
        .step(first_step, compensate=undo_first)
        .step(middle_step)
        .build()
    )
    undoable, plain_step = plan.body
    run = object.__new__(Run)  # only what ``keep`` reads: the history and the commit count
    run.history = History(plan, "i-keeps", (), None)
    run.commits = 0
    run.keep(undoable, "", "argument", "one")  # type: ignore[arg-type]
    run.keep(plain_step, "", "argument", "two")  # type: ignore[arg-type]
    assert [(d.node, d.result) for d in run.history.done] == [(undoable, "one")]
