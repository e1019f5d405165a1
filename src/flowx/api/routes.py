"""The API's operations, each a thin call into the host: the same functions ``flowx start``,
``signal``, ``cancel``, ``terminate``, ``replay``, ``list``, ``show``, ``result`` and ``outbox``
call, answering the same documents (``flowx.hosting.documents``) as JSON.

Reads go to the journal through the host's stores; writes go through ``FlowHost`` so every
rule the CLI keeps (idempotency, admission, fencing, who and why of a stop) holds here too.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from flowx.api import models
from flowx.api.auth import requires
from flowx.api.models import NAME_PATTERN
from flowx.durations import parse_duration
from flowx.errors import (
    DeadLetterNotFound,
    DurabilityNotConfigured,
    FlowFailed,
    FlowXError,
    InstanceNotFound,
    RequestInvalid,
)
from flowx.hosting.correlation import resolve_correlation
from flowx.hosting.documents import (
    event_dict,
    instance_dict,
    instance_view,
    next_cursor,
    receipt_dict,
    replay_dict,
    result_dict,
    step_dict,
    stop_dict,
)
from flowx.hosting.host import FlowHost
from flowx.hosting.storable import storable_id
from flowx.names import name_problem
from flowx.stores.protocols import InstanceQuery, Stores
from flowx.stores.records import ArchivedInstance, InstanceState

#: The longest a result long-poll holds a request, and the longest pause between two looks.
LONGEST_WAIT: Final = 60.0
POLL_CAP: Final = 0.5

Deps = list[Any]
Moment = Annotated[
    str | None,
    Query(description="ISO 8601; UTC if no zone", json_schema_extra={"format": "date-time"}),
]
Filter = Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME_PATTERN)]
InstanceId = Annotated[str, Path(min_length=1, max_length=100)]


def journal_id(text: str) -> bool:
    """Whether ``text`` is an id a journal gives (instances and events have UUIDs): anything
    else names nothing, and is answered "not found" before a store is asked (PostgreSQL keys
    them as ``uuid``)."""
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return storable_id(text)


def checked_name(value: str | None, what: str) -> str | None:
    if value is not None:
        problem = name_problem(value)
        if problem is not None:
            raise RequestInvalid(f"{what} {problem}", code="request.invalid")
    return value


def moment(text: str | None, what: str) -> datetime | None:
    """An ISO 8601 moment; one without a zone is UTC, the zone every store writes."""
    if text is None:
        return None
    try:
        found = datetime.fromisoformat(text)
    except ValueError:
        raise RequestInvalid(
            f"{what} is not an ISO 8601 moment a journal can hold (e.g. 2026-12-01T00:00:00Z)",
            code="request.invalid",
        ) from None
    if found.tzinfo is None:
        found = found.replace(tzinfo=UTC)
    try:
        return found.astimezone(UTC)
    except OverflowError:  # a moment at the calendar's edge: the edge, as a filter means it
        return (datetime.min if found.year < 2 else datetime.max).replace(tzinfo=UTC)


def cursor(text: str | None) -> tuple[datetime, str] | None:
    if text is None:
        return None
    stamp, sep, instance_id = text.rpartition(",")
    when = moment(stamp, "before") if sep else None
    if when is None or not journal_id(instance_id):
        raise RequestInvalid(
            "before is not CREATED_AT,ID: pass the 'next' of the previous page",
            code="request.invalid",
        )
    return when, instance_id


def build(host: FlowHost, *, run_here: bool) -> APIRouter:
    """The ``/v1`` operations over ``host``. ``run_here``: a start or signal runs the instance
    in this process (the API inside a worker) rather than leaving it for the workers."""
    api = APIRouter(prefix="/v1", dependencies=[Depends(_known_query)])
    read = [Depends(requires("read", host.settings))]
    admin = [Depends(requires("admin", host.settings))]
    _starts(api, host, read, admin, run_here=run_here)
    _reads(api, host, read)
    _acts(api, host, admin, run_here=run_here)
    _outbox(api, host, read, admin)
    return api


async def _known_query(request: Request) -> None:
    """Refuse a query parameter the operation does not take: a misspelt filter
    (``?stat=Failed``) must not answer every instance as if it were the filtered list."""
    route = request.scope.get("route")
    known = {p.alias for p in getattr(getattr(route, "dependant", None), "query_params", ())}
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        takes = ", ".join(sorted(known)) or "none"
        raise RequestInvalid(
            f"unknown query parameter(s) {', '.join(map(repr, unknown))}; this operation "
            f"takes: {takes}",
            code="request.invalid",
        )


def journal_of(host: FlowHost) -> Stores:
    found = host.store
    if found is None:
        raise FlowXError("this server has no journal; start it with --db", code="api.no_journal")
    return found


async def instance_contents(host: FlowHost, instance_id: str) -> ArchivedInstance:
    """Everything the journal holds of one instance, in one read."""
    found = []
    if journal_id(instance_id):
        found = list(await journal_of(host).retention.contents([instance_id]))
    if not found:
        raise InstanceNotFound(instance_id)
    return found[0]


def _starts(api: APIRouter, host: FlowHost, read: Deps, admin: Deps, *, run_here: bool) -> None:
    @api.get("/flows", dependencies=read, response_model=models.Flows, tags=["flows"])
    async def flows() -> dict[str, Any]:
        """The flows this server carries, each version with its input's JSON schema."""
        return {
            "flows": [
                {
                    "flow_id": p.flow_id,
                    "version": p.version,
                    "durable": p.durable,
                    "input_schema": p.input_model.model_json_schema(),
                }
                for p in host.plans
            ]
        }

    @api.post(
        "/flows/{flow_id}/instances",
        dependencies=admin,
        response_model=models.Started,
        status_code=201,
        tags=["instances"],
        responses={200: {"model": models.Started, "description": "Started before (same key)"}},
    )
    async def start(
        flow_id: Annotated[str, Path(min_length=1, max_length=200, pattern=NAME_PATTERN)],
        request: models.StartRequest,
        response: Response,
    ) -> dict[str, Any]:
        """Start an instance. 201 when started, 200 when its idempotency key had started it
        before (nothing new is started), 422 naming each field the input got wrong."""
        checked_name(flow_id, "flow_id")
        checked_name(request.idempotency_key, "idempotency_key")
        checked_name(request.correlation_id, "correlation_id")
        plan = host.plan(flow_id, checked_name(request.version, "version"))
        value = {} if request.input is None else request.input
        handle = await host.start(
            plan,
            value,
            idempotency_key=request.idempotency_key,
            correlation_id=request.correlation_id,
            run_here=run_here or not plan.durable,
        )
        doc: dict[str, Any] = {
            "instance_id": handle.instance_id,
            "flow_id": plan.flow_id,
            "flow_version": plan.version,
            "created": handle.created,
        }
        if not plan.durable:  # it ran within this request, and only this process knows it
            try:
                result = await handle.result()
            except FlowFailed as exc:
                doc["state"] = exc.state
                doc["error"] = exc.error
            else:
                doc["state"] = InstanceState.COMPLETED
                doc["result"] = result.model_dump(mode="json") if result is not None else None
        if not handle.created:
            response.status_code = 200
        return doc


def _reads(api: APIRouter, host: FlowHost, read: Deps) -> None:
    @api.get(
        "/instances", dependencies=read, response_model=models.InstancePage, tags=["instances"]
    )
    async def list_instances(
        flow: Filter = None,
        state: InstanceState | None = None,
        version: Filter = None,
        tenant: Filter = None,
        parent: Filter = None,
        since: Moment = None,
        until: Moment = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        before: str | None = None,
    ) -> dict[str, Any]:
        """Instances, newest first, under ``flowx list``'s filters; keyset-paged: pass the
        answer's ``next`` as ``before`` for the next page."""
        query = InstanceQuery(
            limit=limit,
            flow_id=checked_name(flow, "flow"),
            state=state,
            flow_version=checked_name(version, "version"),
            tenant_id=checked_name(tenant, "tenant"),
            parent_id=checked_name(parent, "parent"),
            since=moment(since, "since"),
            until=moment(until, "until"),
            before=cursor(before),
        )
        rows = list(await journal_of(host).catalog.list_instances(query))
        return {"instances": [instance_dict(r) for r in rows], "next": next_cursor(rows, limit)}

    @api.get(
        "/instances/{instance_id}",
        dependencies=read,
        response_model=models.InstanceView,
        tags=["instances"],
    )
    async def show(instance_id: InstanceId) -> dict[str, Any]:
        """An instance, what it waits for, its parent, its signals and its events."""
        return instance_view(await instance_contents(host, instance_id), host.plans)

    @api.get(
        "/instances/{instance_id}/steps",
        dependencies=read,
        response_model=models.Steps,
        tags=["instances"],
    )
    async def steps(instance_id: InstanceId) -> dict[str, Any]:
        """Every step row of the instance (attempts, compensations, waits), in commit order."""
        everything = await instance_contents(host, instance_id)
        return {"steps": [step_dict(s) for s in everything.steps]}

    @api.get(
        "/instances/{instance_id}/result",
        dependencies=read,
        response_model=models.Result,
        tags=["instances"],
        responses={202: {"model": models.Result, "description": "Not ended (within wait)"}},
    )
    async def result(
        instance_id: InstanceId,
        response: Response,
        wait: Annotated[float, Query(ge=0, le=LONGEST_WAIT)] = 0.0,
    ) -> dict[str, Any]:
        """What the instance ended with (200), waiting up to ``wait`` seconds for it to end
        (a long poll); 202 with its current state if it has not ended by then."""
        if not journal_id(instance_id):
            raise InstanceNotFound(instance_id)
        ends = time.monotonic() + wait
        pause = 0.05
        while True:
            record = await host.get(instance_id)
            left = ends - time.monotonic()
            if record.state.terminal or left <= 0:
                break
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, POLL_CAP)
        if not record.state.terminal:
            response.status_code = 202
        return result_dict(record)


def _acts(api: APIRouter, host: FlowHost, admin: Deps, *, run_here: bool) -> None:
    @api.post(
        "/instances/{instance_id}/signals",
        dependencies=admin,
        response_model=models.Receipt,
        tags=["instances"],
    )
    async def signal(instance_id: InstanceId, request: models.SignalRequest) -> dict[str, Any]:
        """Deliver a signal; with a ``key``, a redelivery is inert (``status: duplicate``)."""
        checked_name(request.name, "name")
        checked_name(request.key, "key")
        if not journal_id(instance_id):
            raise InstanceNotFound(instance_id)
        # As JSON text: the host reads a str payload as JSON, and "hello" is a value here.
        text = json.dumps(request.payload, ensure_ascii=False)
        receipt = await host.signal(
            instance_id, request.name, text, key=request.key, run_here=run_here
        )
        return receipt_dict(receipt)

    @api.post(
        "/correlations/{correlation_id}/signals",
        dependencies=admin,
        response_model=models.Receipt,
        tags=["instances"],
    )
    async def signal_by_correlation(
        correlation_id: InstanceId, request: models.SignalRequest
    ) -> dict[str, Any]:
        """Deliver a signal to the instance started with this correlation id (issue 18): the
        one not ended, else the newest ended; 404 if none has it, 422
        (``signal.ambiguous_correlation``) if several not ended do."""
        checked_name(correlation_id, "correlation_id")
        checked_name(request.name, "name")
        checked_name(request.key, "key")
        store = host.store
        if store is None:
            raise DurabilityNotConfigured("this node has no journal to find a correlation id in")
        instance_id = await resolve_correlation(store.catalog, correlation_id)
        text = json.dumps(request.payload, ensure_ascii=False)
        receipt = await host.signal(
            instance_id, request.name, text, key=request.key, run_here=run_here
        )
        return receipt_dict(receipt)

    @api.post(
        "/instances/{instance_id}/cancel",
        dependencies=admin,
        response_model=models.Stopped,
        tags=["instances"],
    )
    async def cancel(instance_id: InstanceId, request: models.StopRequest) -> dict[str, Any]:
        """Cancel the instance and its running sub-flows: each stops at its next boundary,
        compensates what finished and ends Cancelled. Repeating it is inert."""
        if not journal_id(instance_id):
            raise InstanceNotFound(instance_id)
        return stop_dict(await host.cancel(instance_id, request.reason, by="api"))

    @api.post(
        "/instances/{instance_id}/terminate",
        dependencies=admin,
        response_model=models.Stopped,
        tags=["instances"],
    )
    async def terminate(instance_id: InstanceId, request: models.StopRequest) -> dict[str, Any]:
        """Terminate the instance and its running sub-flows, compensating nothing."""
        if not journal_id(instance_id):
            raise InstanceNotFound(instance_id)
        return stop_dict(await host.terminate(instance_id, request.reason, by="api"))

    @api.post(
        "/instances/{instance_id}/replay",
        dependencies=admin,
        response_model=models.Replay,
        tags=["instances"],
    )
    async def replay(instance_id: InstanceId, request: models.ReplayRequest) -> dict[str, Any]:
        """Re-run a stopped instance from a step (``dry_run``: only say what would re-run and
        what would be undone)."""
        step = request.from_step
        if isinstance(step, str):
            checked_name(step, "from_step")
        deadline = None
        if request.deadline is not None:
            try:
                deadline = parse_duration(request.deadline, what="deadline")
            except ValueError as exc:
                raise RequestInvalid(str(exc), code="request.invalid") from None
        if not journal_id(instance_id):
            raise InstanceNotFound(instance_id)
        planned = await host.replay(
            instance_id, step, dry_run=request.dry_run, deadline=deadline, run_here=run_here
        )
        return {**replay_dict(planned), "dry_run": request.dry_run}


def _outbox(api: APIRouter, host: FlowHost, read: Deps, admin: Deps) -> None:
    @api.get("/outbox", dependencies=read, response_model=models.Outbox, tags=["outbox"])
    async def outbox(limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> dict[str, Any]:
        """How many events wait to be published, and the dead letters, oldest first."""
        box = journal_of(host).outbox
        pending = await box.pending_count()
        return {
            "pending": pending,
            "dead_letters": [event_dict(e) for e in await box.dead_letters(limit=limit)],
        }

    @api.post(
        "/outbox/dead-letters/{event_id}/retry",
        dependencies=admin,
        response_model=models.Requeued,
        tags=["outbox"],
    )
    async def retry(
        event_id: Annotated[str, Path(min_length=1, max_length=100)],
    ) -> dict[str, Any]:
        """Put a dead letter back in the outbox once its cause is fixed."""
        if not journal_id(event_id) or not await journal_of(host).outbox.retry_dead_letter(
            event_id
        ):
            raise DeadLetterNotFound(event_id)
        return {"event_id": event_id, "requeued": True}
