"""The web UI (R9.7): server-rendered pages over the same host calls and documents as the API.

No JavaScript build and no script at all: HTML forms and links, a ``<meta refresh>`` for the
live list, Jinja2 templates shipped in the package (``templates/``), auto-escaped. Sign-in
sets the API token in an HttpOnly, SameSite=Strict cookie, so another site cannot make a
signed-in browser post an action; every action is behind the admin scope and a confirmation
page (a replay shows its dry run first).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final
from urllib.parse import urlsplit

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from flowx.api.auth import COOKIE, scope_of
from flowx.api.errors import status_of
from flowx.api.routes import (
    checked_name,
    cursor,
    instance_contents,
    journal_id,
    journal_of,
    moment,
)
from flowx.durations import parse_duration
from flowx.errors import DeadLetterNotFound, FlowXError, InstanceNotFound, RequestInvalid
from flowx.hosting.documents import (
    event_dict,
    instance_dict,
    instance_view,
    next_cursor,
    replay_dict,
    step_dict,
)
from flowx.hosting.host import FlowHost
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceState

TEMPLATES: Final = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
#: Seconds between two reloads of a live list.
LIVE_EVERY: Final = 3
PAGE: Final = 50


def _bar(steps: list[dict[str, Any]], created: datetime) -> None:
    """Place each step row on one time axis, from the instance's creation to its last commit:
    a bar starts where the attempt started and is as long as it took, so waits and retries
    show as the gaps between bars."""
    if not steps:
        return
    end = max(s["committed_at"] for s in steps)
    span = max((end - created).total_seconds(), 0.001)
    for s in steps:
        took = s["duration_ms"] / 1000
        began = (s["committed_at"] - created).total_seconds() - took
        s["left"] = round(min(max(began / span * 100, 0.0), 99.0), 2)
        s["bar"] = round(min(max(took / span * 100, 0.8), 100.0 - s["left"]), 2)


class Pages:
    """What every page needs: the host, rendering with the viewer's scope, and the gate."""

    def __init__(self, host: FlowHost, *, run_here: bool) -> None:
        self.host = host
        self.settings = host.settings
        self.run_here = run_here

    def token(self, request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer "):
            return header[7:].strip()
        return request.cookies.get(COOKIE)

    def page(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        settings = self.settings
        open_ = settings.api_token is None and settings.api_read_token is None
        scope = scope_of(settings, self.token(request))
        values = {"scope": scope, "open": open_, **context}
        return TEMPLATES.TemplateResponse(request, name, values, status_code=status)

    def gate(self, request: Request, admin: bool = False) -> Response | None:
        """A sign-in page for no token, a refusal for a reader asking an admin action."""
        scope = scope_of(self.settings, self.token(request))
        if scope is None:
            return RedirectResponse(f"/ui/login?next={request.url.path}", status_code=303)
        if admin and not _same_origin(request):
            refusal = "this action was posted from another site; use the FlowX UI's own form"
            return self.page(request, "error.html", 403, message=refusal)
        if admin and scope != "admin":
            return self.page(
                request, "error.html", 403, message="this action needs the admin token"
            )
        return None

    async def guarded(self, request: Request, admin: bool, render: Any) -> Response:
        refused = self.gate(request, admin)
        if refused is not None:
            return refused
        try:
            return await render()  # type: ignore[no-any-return]
        except FlowXError as exc:
            status = status_of(exc)
            return self.page(request, "error.html", status, message=exc.message, code=exc.code)


def build(host: FlowHost, *, run_here: bool = False) -> APIRouter:
    ui = APIRouter(prefix="/ui", include_in_schema=False)
    pages = Pages(host, run_here=run_here)
    _sign_in(ui, pages)
    _instances(ui, pages)
    _actions(ui, pages)
    _outbox(ui, pages)
    return ui


def _sign_in(ui: APIRouter, pages: Pages) -> None:
    settings, page = pages.settings, pages.page

    @ui.get("/login", response_class=HTMLResponse)
    async def login(request: Request, next: str = "/ui/") -> Response:
        return page(request, "login.html", next=next if next.startswith("/ui") else "/ui/")

    @ui.post("/login")
    async def sign_in(
        request: Request, token: Annotated[str, Form()], next: Annotated[str, Form()] = "/ui/"
    ) -> Response:
        if scope_of(settings, token) is None:
            return page(request, "login.html", 401, next=next, failed=True)
        target = next if next.startswith("/ui") else "/ui/"
        response = RedirectResponse(target, status_code=303)
        # Secure whenever the page itself came over HTTPS (behind a TLS proxy that forwards
        # the scheme too), so the token is never sent back over plain HTTP.
        secure = request.url.scheme == "https"
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", secure=secure)
        return response

    @ui.post("/logout")
    async def sign_out(request: Request) -> Response:
        """Forget the token this browser holds; posted from our own pages only."""
        if not _same_origin(request):
            refusal = "this sign-out was posted from another site; use the FlowX UI's own form"
            return page(request, "error.html", 403, message=refusal)
        response = RedirectResponse("/ui/login", status_code=303)
        response.delete_cookie(COOKIE, httponly=True, samesite="strict")
        return response


def _instances(ui: APIRouter, pages: Pages) -> None:
    host, page, guarded = pages.host, pages.page, pages.guarded

    @ui.get("/", response_class=HTMLResponse)
    async def instances(
        request: Request,
        state: str | None = None,
        flow: str | None = None,
        version: str | None = None,
        tenant: str | None = None,
        parent: str | None = None,
        since: str | None = None,
        until: str | None = None,
        before: str | None = None,
        live: int = 0,
    ) -> Response:
        async def render() -> Response:
            states = {s.value for s in InstanceState}
            if state and state not in states:
                raise RequestInvalid(f"no state {state!r}", code="request.invalid")
            query = InstanceQuery(
                limit=PAGE,
                flow_id=checked_name(flow or None, "flow"),
                state=InstanceState(state) if state else None,
                flow_version=checked_name(version or None, "version"),
                tenant_id=checked_name(tenant or None, "tenant"),
                parent_id=checked_name(parent or None, "parent"),
                since=moment(since or None, "since"),
                until=moment(until or None, "until"),
                before=cursor(before or None),
            )
            rows = list(await journal_of(host).catalog.list_instances(query))
            more = next_cursor(rows, PAGE)
            filters = {
                "state": state or "", "flow": flow or "", "version": version or "",
                "tenant": tenant or "", "parent": parent or "", "since": since or "",
                "until": until or "",
            }  # fmt: skip
            return page(
                request,
                "instances.html",
                rows=[instance_dict(r) for r in rows],
                states=sorted(states),
                filters=filters,
                more=more,
                live=LIVE_EVERY if live else 0,
                now=datetime.now(UTC),
            )

        return await guarded(request, False, render)

    @ui.get("/instances/{instance_id}", response_class=HTMLResponse)
    async def instance(request: Request, instance_id: str) -> Response:
        async def render() -> Response:
            everything = await instance_contents(host, instance_id)
            record, steps = everything.instance, list(everything.steps)
            view = instance_view(everything, host.plans)
            children = await journal_of(host).catalog.list_instances(
                InstanceQuery(limit=200, parent_id=instance_id)
            )
            timeline = [step_dict(s) for s in steps]
            _bar(timeline, record.created_at)
            plan_steps: list[str] = []
            if host.carries(record.flow_id, record.flow_version):
                plan_steps = sorted({s.step_name for s in steps})
            return page(
                request,
                "instance.html",
                i=view["instance"],
                waiting=view["waiting"],
                steps=timeline,
                children=[instance_dict(c) for c in children],
                signals=view["signals"],
                events=view["events"],
                plan_steps=plan_steps,
                ended=record.state.terminal,
            )

        return await guarded(request, False, render)


def _actions(ui: APIRouter, pages: Pages) -> None:
    host, page, guarded = pages.host, pages.page, pages.guarded

    @ui.post("/instances/{instance_id}/{action}", response_class=HTMLResponse)
    async def act(
        request: Request,
        instance_id: str,
        action: str,
        reason: Annotated[str, Form()] = "",
        name: Annotated[str, Form()] = "",
        payload: Annotated[str, Form()] = "",
        key: Annotated[str, Form()] = "",
        from_step: Annotated[str, Form()] = "",
        deadline: Annotated[str, Form()] = "",
        confirmed: Annotated[str, Form()] = "",
    ) -> Response:
        """Every action: the first post shows what it will do (a replay's dry run), the
        second, with ``confirmed``, does it."""

        async def render() -> Response:
            if action not in ("cancel", "terminate", "signal", "replay"):
                raise RequestInvalid(f"no action {action!r}", code="request.invalid")
            if not journal_id(instance_id):
                raise InstanceNotFound(instance_id)
            if action == "signal":
                checked_name(name, "signal name")
                checked_name(key or None, "key")
            form = {"reason": reason, "name": name, "payload": payload, "key": key,
                    "from_step": from_step, "deadline": deadline}  # fmt: skip
            plan = None
            if action == "replay":
                step: str | int = int(from_step) if from_step.isdigit() else from_step
                when = parse_duration(deadline, what="deadline") if deadline else None
                checked_name(from_step, "from_step")
                planned = await host.replay(
                    instance_id, step, dry_run=not confirmed, deadline=when,
                    run_here=pages.run_here,
                )  # fmt: skip
                plan = replay_dict(planned)
            if not confirmed:
                return page(
                    request, "confirm.html", action=action, instance_id=instance_id,
                    form=form, plan=plan,
                )  # fmt: skip
            if action == "cancel":
                await host.cancel(instance_id, reason, by="ui")
            elif action == "terminate":
                await host.terminate(instance_id, reason, by="ui")
            elif action == "signal":
                await host.signal(
                    instance_id, name, payload or "null", key=key or None,
                    run_here=pages.run_here,
                )  # fmt: skip
            return RedirectResponse(f"/ui/instances/{instance_id}", status_code=303)

        return await guarded(request, True, _valued(render))


def _outbox(ui: APIRouter, pages: Pages) -> None:
    host, page, guarded = pages.host, pages.page, pages.guarded

    @ui.get("/outbox", response_class=HTMLResponse)
    async def outbox(request: Request) -> Response:
        async def render() -> Response:
            box = journal_of(host).outbox
            backlog = await box.backlog()
            dead = [event_dict(e) for e in await box.dead_letters(limit=200)]
            lag = None
            if backlog.oldest_staged_at is not None:
                lag = (datetime.now(UTC) - backlog.oldest_staged_at).total_seconds()
            return page(request, "outbox.html", backlog=backlog, lag=lag, dead=dead)

        return await guarded(request, False, render)

    @ui.post("/outbox/{event_id}/retry")
    async def retry(request: Request, event_id: str) -> Response:
        async def render() -> Response:
            if not journal_id(event_id) or not await journal_of(host).outbox.retry_dead_letter(
                event_id
            ):
                raise DeadLetterNotFound(event_id)
            return RedirectResponse("/ui/outbox", status_code=303)

        return await guarded(request, True, render)

    @ui.get("/versions", response_class=HTMLResponse)
    async def versions(request: Request) -> Response:
        async def render() -> Response:
            counts = await journal_of(host).catalog.count_instances(
                InstanceQuery(unfinished=True), by="version"
            )
            carried = {p.ref for p in host.plans}
            rows = [
                {"ref": ref, "running": n, "carried": ref in carried}
                for ref, n in sorted(counts.items())
            ]
            idle = sorted(carried - set(counts))
            return page(request, "versions.html", rows=rows, idle=idle)

        return await guarded(request, False, render)


def _same_origin(request: Request) -> bool:
    """Whether a form post comes from this server's own pages: a browser names the page's
    origin on every POST (``Origin``, and ``Sec-Fetch-Site``), so a form on another site,
    or on another port of the same machine, is refused even though the cookie went with
    it (and when no token is asked at all)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None  # no header: not a browser's cross-site form
    return urlsplit(origin).netloc == request.headers.get("host")


def _valued(render: Any) -> Any:
    """A form value the host cannot take (a bad duration, a step id) is a 422, not a 500."""

    async def run() -> Response:
        try:
            return await render()  # type: ignore[no-any-return]
        except ValueError as exc:
            raise RequestInvalid(str(exc), code="request.invalid") from None

    return run
