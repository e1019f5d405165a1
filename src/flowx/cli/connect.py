"""What a command opens: the stores a URL names, the plans ``--flows`` names, and a host that
runs only what it is asked to."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from flowx.cli.exits import fail
from flowx.errors import FlowNotCarried, FlowNotFound, FlowXError, JournalNotFound
from flowx.hosting.archive import Archiver
from flowx.hosting.host import FlowHost
from flowx.hosting.settings import HostSettings
from flowx.hosting.stores import from_url
from flowx.hosting.worker import load_flows
from flowx.plan.model import Plan
from flowx.redaction import redact
from flowx.stores.protocols import Stores


@asynccontextmanager
async def open_stores(url: str, *, create: bool = True) -> AsyncIterator[Stores]:
    """Open (and so migrate) the stores a URL names, and always close them.

    ``create=False`` (a command that only reads) opens an existing journal as it is: a
    SQLite file that does not exist is an error naming the path, not a new empty journal, and
    a journal at an older schema is refused with the migration to run rather than migrated.

    ``close`` runs even when ``open`` fails — on a file that is not a journal, say — so the
    store's database thread never outlives the command.
    """
    if not create:
        _must_exist(url)
    stores = from_url(url, migrate=create)
    try:
        await stores.open()
        yield stores
    finally:
        await stores.close()


def plans_or_fail(flows: tuple[str, ...]) -> list[Plan]:
    """The plans ``--flows`` names, loaded before any store is opened; a FlowX error exits."""
    try:
        return list(load_flows(flows))
    except FlowXError as exc:
        fail(exc)


def command_host(stores: Stores, plans: list[Plan], archiver: Archiver | None = None) -> FlowHost:
    """A host for one command: no recovery scan, no timers and no scheduled retention sweep,
    so it runs nothing it was not asked to; on exit it drains and hands back whatever it
    holds."""
    return FlowHost(
        store=stores,
        flows=plans,
        settings=HostSettings.load(recovery=False, timers=False, retention=False),
        archiver=archiver,
    )


def not_carried(exc: FlowNotFound, flows: tuple[str, ...], plans: list[Plan]) -> FlowNotCarried:
    """``--flows`` lacks the instance's flow: a command-line mistake, so a usage error."""
    what = f"{exc.flow_id}@{exc.version}" if exc.version else exc.flow_id
    carried = ", ".join(sorted(p.ref for p in plans)) or "none"
    return FlowNotCarried(
        f"the instance runs flow {what!r}, which --flows {' '.join(flows)} does not define "
        f"(it defines: {carried}); pass the module that defines it, e.g. "
        "--flows myapp.flows:FLOWS (repeatable)"
    )


def _must_exist(url: str) -> None:
    """A read command's SQLite journal must already be there (``JournalNotFound``)."""
    if not url.startswith("sqlite:///"):
        return
    path = Path(url.removeprefix("sqlite:///"))
    if not path.exists():
        raise JournalNotFound(
            f"no journal at {redact(str(path))} (from --db {redact(url)}); a command that "
            "only reads never "
            "creates one. Check --db, or create the journal with `flowx migrate --db ...`"
        )
