"""``InstanceCatalog`` conformance: the instance list's filters, its keyset pages, and the
counts an operator asks for (``flowx list``, ``flowx count``)."""

from __future__ import annotations

from typing import Any

from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceState
from flowx.testing.conformance._support import at, commit, instance


async def _at(stores: Any, when: float, **kw: Any) -> str:
    created = await stores.journal.create(instance(**kw), token=1, now=at(when))
    iid: str = created.instance.instance_id
    return iid


def _ids(rows: Any) -> list[str]:
    return [r.instance_id for r in rows]


class InstanceCatalogConformance:
    """Needs a ``stores`` fixture yielding opened ``Stores``."""

    async def test_filters_narrow_the_list_and_it_pages_newest_first(self, stores: Any) -> None:
        a = await _at(stores, 1, flow_id="f.a", tenant_id="t1")
        b = await _at(stores, 2, flow_id="f.a", flow_version="2.0.0", tenant_id="t2")
        c = await _at(
            stores, 3, flow_id="f.b", parent_instance_id=a, parent_scope="", parent_step_id=1
        )
        await stores.journal.commit(commit(b, token=1, now=4, state=InstanceState.COMPLETED))
        catalog = stores.catalog
        assert _ids(await catalog.list_instances(InstanceQuery())) == [c, b, a]
        assert _ids(await catalog.list_instances(InstanceQuery(flow_id="f.a"))) == [b, a]
        assert _ids(await catalog.list_instances(InstanceQuery(flow_version="2.0.0"))) == [b]
        assert _ids(await catalog.list_instances(InstanceQuery(tenant_id="t1"))) == [a]
        assert _ids(await catalog.list_instances(InstanceQuery(parent_id=a))) == [c]
        assert _ids(await catalog.list_instances(InstanceQuery(state=InstanceState.COMPLETED))) == [
            b
        ]
        window = InstanceQuery(since=at(2), until=at(3))
        assert _ids(await catalog.list_instances(window)) == [b]
        first = await catalog.list_instances(InstanceQuery(limit=2))
        assert _ids(first) == [c, b]
        cursor = (first[-1].created_at, first[-1].instance_id)
        assert _ids(await catalog.list_instances(InstanceQuery(limit=2, before=cursor))) == [a]
        assert list(await catalog.list_instances(InstanceQuery(parent_id="not an id"))) == []

    async def test_counts_group_by_state_or_flow_under_the_same_filters(self, stores: Any) -> None:
        ids = [await _at(stores, n, flow_id="f.a" if n < 3 else "f.b") for n in range(5)]
        await stores.journal.commit(commit(ids[0], token=1, now=9, state=InstanceState.FAILED))
        catalog = stores.catalog
        assert await catalog.count_instances(InstanceQuery(), by="state") == {
            "Failed": 1,
            "Running": 4,
        }
        assert await catalog.count_instances(InstanceQuery(), by="flow") == {"f.a": 3, "f.b": 2}
        assert await catalog.count_instances(InstanceQuery(flow_id="f.b"), by="state") == {
            "Running": 2
        }
        assert await catalog.count_instances(InstanceQuery(flow_id="none"), by="flow") == {}
        assert await catalog.count_instances(InstanceQuery(unfinished=True), by="version") == {
            "f.a@1.0.0": 2,
            "f.b@1.0.0": 2,
        }
        unfinished = await catalog.list_instances(InstanceQuery(unfinished=True))
        assert ids[0] not in _ids(unfinished) and len(unfinished) == 4

    async def test_the_correlation_filter_finds_every_instance_carrying_it(
        self, stores: Any
    ) -> None:
        """Issue 18 (R6.1): a signal by correlation id looks its instances up through the list
        — newest first, ended ones too, never one with another (or no) correlation id."""
        a = await _at(stores, 1, correlation_id="corr-1")
        b = await _at(stores, 2, correlation_id="corr-1")
        await _at(stores, 3, correlation_id="corr-2")
        await _at(stores, 4)
        c = await _at(stores, 5, correlation_id="corr-1")
        await stores.journal.commit(commit(b, token=1, now=6, state=InstanceState.COMPLETED))
        catalog = stores.catalog
        assert _ids(await catalog.list_instances(InstanceQuery(correlation_id="corr-1"))) == [
            c,
            b,
            a,
        ]
        live = InstanceQuery(correlation_id="corr-1", unfinished=True)
        assert _ids(await catalog.list_instances(live)) == [c, a]
        assert await catalog.count_instances(live, by="state") == {"Running": 2}
        assert _ids(
            await catalog.list_instances(InstanceQuery(correlation_id="corr-1", limit=1))
        ) == [c]
        assert list(await catalog.list_instances(InstanceQuery(correlation_id="none"))) == []
