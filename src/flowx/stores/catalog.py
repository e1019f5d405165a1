"""The instance list's filters (``InstanceQuery``), as every backend applies them.

The SQL backends build the same conditions in their own dialect (``where``, with the
placeholder style each passes in); the memory store tests records with ``matches``. One list
of filters, so a filter added here is added everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flowx.stores.columns import TERMINAL_STATES_SQL
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceRecord

#: How ``flowx count`` groups: a column per choice.
COUNT_BY = {"state": "state", "flow": "flow_id", "version": "flow_id || '@' || flow_version"}


def matches(record: InstanceRecord, query: InstanceQuery) -> bool:
    """Whether ``record`` passes ``query``'s filters (not its page)."""
    return (
        (query.flow_id is None or record.flow_id == query.flow_id)
        and (query.state is None or record.state is query.state)
        and (query.flow_version is None or record.flow_version == query.flow_version)
        and (query.tenant_id is None or record.tenant_id == query.tenant_id)
        and (query.parent_id is None or record.parent_instance_id == query.parent_id)
        and (query.correlation_id is None or record.correlation_id == query.correlation_id)
        and (query.since is None or record.created_at >= query.since)
        and (query.until is None or record.created_at < query.until)
        and not (query.unfinished and record.state.terminal)
    )


def where(
    query: InstanceQuery, mark: Callable[[str], str], moment: Callable[[Any], Any]
) -> tuple[list[str], dict[str, Any]]:
    """``query``'s filters as SQL conditions and their parameters. ``mark(name)`` is the
    backend's placeholder for a named parameter; ``moment`` turns a datetime into what the
    backend compares ``created_at`` with."""
    conditions: list[str] = []
    params: dict[str, Any] = {}
    for column, name, value in (
        ("flow_id", "flow_id", query.flow_id),
        ("state", "state", query.state.value if query.state else None),
        ("flow_version", "flow_version", query.flow_version),
        ("tenant_id", "tenant_id", query.tenant_id),
        ("parent_instance_id", "parent_id", query.parent_id),
        ("correlation_id", "correlation_id", query.correlation_id),
    ):
        if value is not None:
            conditions.append(f"{column} = {mark(name)}")
            params[name] = value
    if query.since is not None:
        conditions.append(f"created_at >= {mark('since')}")
        params["since"] = moment(query.since)
    if query.until is not None:
        conditions.append(f"created_at < {mark('until')}")
        params["until"] = moment(query.until)
    if query.unfinished:
        conditions.append(f"state NOT IN {TERMINAL_STATES_SQL}")
    return conditions, params
