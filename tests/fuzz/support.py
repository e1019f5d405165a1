"""What the fuzz tests share: the bounded hypothesis settings, strategies for hostile values,
flows to aim them at, and a host on a real SQLite journal whose rows are checked after the
examples: the rows written before are unchanged, and a flow still starts and finishes."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import flowx
from flowx.stores.protocols import InstanceQuery

T = TypeVar("T")

#: Bounded and reproducible: a fixed derivation of examples from each test's name, no example
#: database written, no per-example deadline (the first example opens the journal).
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# -- hostile values -----------------------------------------------------------------------

#: Any character, lone surrogates, controls and NUL included.
any_char = st.characters(codec=None, categories=None)
texts = st.text(any_char, max_size=24)
#: Mostly printable, sometimes anything: names, keys, ids.
names = st.one_of(
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12),
    texts,
    st.text(min_size=190, max_size=260),
    st.integers(),
    st.none(),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    texts,
    st.binary(max_size=8),
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(texts, children, max_size=4),
        st.dictionaries(st.integers(), children, max_size=2),
        st.frozensets(st.integers(), max_size=3),
    )


#: Python values of every kind a caller may pass, storable or not.
values = st.recursive(scalars, _containers, max_leaves=12)


def _json_values() -> st.SearchStrategy[Any]:
    leaves = st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text()
    )
    return st.recursive(
        leaves,
        lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(), c, max_size=4)),
        max_leaves=10,
    )


json_values = _json_values()


@st.composite
def json_texts(draw: st.DrawFn) -> str:
    """Text a user might pass as ``--input``/``--payload``: JSON, JSON with a lone surrogate
    escape or NaN in it, JSON cut short or nested deep, or anything at all."""
    import json

    kind = draw(st.sampled_from(["json", "surrogate", "nan", "cut", "deep", "garbage"]))
    base = {"value": draw(st.floats(allow_nan=False, allow_infinity=False)), "label": ""}
    if kind == "json":
        base["label"] = draw(st.text(max_size=10))
        return json.dumps({**base, "extra": draw(json_values)})
    if kind == "surrogate":
        code = draw(st.integers(0xD800, 0xDFFF))
        return json.dumps(base).replace('"label": ""', f'"label": "a\\u{code:04x}"')
    if kind == "nan":
        return json.dumps(base).replace(json.dumps(base["value"]), "NaN", 1)
    if kind == "cut":
        text = json.dumps(base)
        return text[: draw(st.integers(0, len(text) - 1))]
    if kind == "deep":
        depth = draw(st.sampled_from([150, 600, 5_000]))
        return '{"value": 1, "label": "", "extra": ' + "[" * depth + "]" * depth + "}"
    return draw(texts)


def storable(value: Any) -> bool:
    """Whether the journal could hold ``value`` unchanged: the property the codec enforces."""
    if value is None or isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, list | tuple):
        return all(storable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and storable(k) and storable(v) for k, v in value.items())
    return False


# -- flows --------------------------------------------------------------------------------


class FuzzIn(BaseModel):
    value: Any = None
    label: str = ""
    key: str = ""


class FuzzState(BaseModel):
    result: Any = None
    got: Any = None


#: What ``fuzz.result`` returns for an input's ``key``: a step result drawn by hypothesis.
RESULTS: dict[str, Any] = {}


@flowx.capability("fuzz.result", version="1.0.0")
def result(ctx: flowx.StepContext, value: FuzzIn) -> Any:
    return RESULTS.get(value.key, value.value)


def _partition(value: FuzzIn) -> str | None:
    if value.label.startswith("boom"):
        raise RuntimeError("the partition key selector failed")
    return value.label or None


echo = (
    flowx.flow(
        "fuzz.echo", version="1.0.0", input=FuzzIn, state=FuzzState, partition_key=_partition
    )
    .step(result, into="result", retry=flowx.Retry(attempts=1, backoff="none"))
    .build()
)
wait = (
    flowx.flow("fuzz.wait", version="1.0.0", input=FuzzIn, state=FuzzState)
    .await_signal("go", Any, into="got")
    .step(result, into="result", retry=flowx.Retry(attempts=1, backoff="none"))
    .build()
)
FLOWS = [echo, wait]
FLOWS_REF = "tests.fuzz.support:FLOWS"


@dataclasses.dataclass
class Snapshot:
    instances: list[Any]
    steps: list[Any]


class Harness:
    """One host on a real SQLite journal (or memory), opened once for all of a test's
    examples, with an instance finished before the first example to check afterwards."""

    def __init__(self, tmp_path: Path, *, store: str = "sqlite") -> None:
        self.path = tmp_path / "fuzz.db"
        self.loop = asyncio.new_event_loop()
        backing = flowx.sqlite(self.path) if store == "sqlite" else flowx.memory()
        self.host = flowx.FlowHost(
            store=backing,
            flows=FLOWS,
            settings=flowx.HostSettings.load(recovery=False, timers=False),
        )
        self.run(self.host.__aenter__())
        self.baseline = self.run(self._finish(FuzzIn(value={"n": 1}, label="t")))
        self.before = self.run(self._snapshot())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    async def _finish(self, value: FuzzIn) -> str:
        handle = await self.host.start(echo, value)
        await handle.result(timeout=20)
        return handle.instance_id

    async def _snapshot(self) -> Snapshot:
        store = self.host.store
        assert store is not None
        rows = list(await store.catalog.list_instances(InstanceQuery(limit=1000)))
        mine = [r for r in rows if r.instance_id == self.baseline]
        return Snapshot(mine, list(await store.journal.steps(self.baseline)))

    def assert_intact(self) -> None:
        """The baseline's rows are as they were, and a new flow starts and completes."""
        assert self.run(self._snapshot()) == self.before
        fresh = self.run(self._finish(FuzzIn(value=[1, "two"], label="after")))
        record = self.run(self.host.get(fresh))
        assert record.state is flowx.InstanceState.COMPLETED

    def close(self) -> None:
        try:
            self.run(self.host.__aexit__(None, None, None))
        finally:
            self.loop.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
