"""Capabilities: the versioned Python functions a step calls.

``@capability("payment.capture", version="2.1.0", idempotent=False)`` registers the function in
a registry. A plan refers to a capability by id and a version (exact, or a prefix such as
``"2"`` that resolves to the highest registered ``2.x.y``); the resolved version is recorded on
each step row and reused on resume (R2.6).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import re
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from flowx.errors import CapabilityNotFound, FlowXError, PlanError
from flowx.names import name_problem, shown

F = TypeVar("F", bound=Callable[..., Any])

_ID = re.compile(r"^[a-z0-9][a-z0-9_.\-]*$")
_VERSION = re.compile(r"^\d+(\.\d+){0,2}([-+][0-9A-Za-z.\-]+)?$")


def _version_key(version: str) -> tuple[int, ...]:
    core = re.split(r"[-+]", version, maxsplit=1)[0]
    return tuple(int(p) for p in core.split("."))


@dataclass(frozen=True, kw_only=True, slots=True)
class Capability:
    """A registered capability. ``invoke`` runs a plain ``def`` in a worker thread."""

    id: str
    version: str
    fn: Callable[..., Any] = field(repr=False, compare=False)
    idempotent: bool = True
    takes_argument: bool = True
    is_async: bool = False
    #: ``id@version``: how plans, the journal and ``flowx`` commands name this capability
    #: (made once: every step attempt names its capability).
    ref: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ref", f"{self.id}@{self.version}")

    async def invoke(self, ctx: Any, argument: Any, executor: Executor | None = None) -> Any:
        """Call the function; a plain ``def`` runs on ``executor`` (the host's capability
        threads), so a blocking capability never stalls the event loop."""
        if self.is_async:
            args = (ctx, argument) if self.takes_argument else (ctx,)
            return await self.fn(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, self.prepared(ctx, argument))

    def prepared(self, ctx: Any, argument: Any) -> Callable[[], Any]:
        """A plain ``def``'s call, ready for a thread: it sees the caller's context variables
        (logging and tracing context go with it)."""
        args = (ctx, argument) if self.takes_argument else (ctx,)
        return functools.partial(contextvars.copy_context().run, self.fn, *args)


class CapabilityRegistry:
    """Capabilities by id and version. One process-wide default; tests can make their own."""

    def __init__(self) -> None:
        self._by_id: dict[str, dict[str, Capability]] = {}

    def register(self, cap: Capability) -> None:
        """Make ``cap`` resolvable by plans; re-registering the same function is harmless,
        a different function under the same id and version is refused."""
        versions = self._by_id.setdefault(cap.id, {})
        existing = versions.get(cap.version)
        if existing is not None and existing.fn is not cap.fn:
            # Re-importing the same module re-registers the same function: harmless. A second
            # function under one id and version is two meanings for one journal row: refused.
            same = getattr(existing.fn, "__qualname__", None) == getattr(
                cap.fn, "__qualname__", None
            ) and getattr(existing.fn, "__module__", None) == getattr(cap.fn, "__module__", None)
            if not same:
                raise FlowXError(
                    f"capability {cap.ref} is already registered by "
                    f"{existing.fn.__module__}.{existing.fn.__qualname__}; give the new one "
                    "another version",
                    code="capability.duplicate",
                )
        versions[cap.version] = cap

    def resolve(self, capability_id: str, version: str | None = None) -> Capability:
        """The exact version, or the highest whose version starts with ``version``'s parts."""
        versions = self._by_id.get(capability_id)
        if not versions:
            raise CapabilityNotFound(
                f"no capability {capability_id!r} is registered; decorate a function with "
                f"@flowx.capability({capability_id!r}, version=...) and import its module"
            )
        if version is None:
            return versions[max(versions, key=_version_key)]
        if version in versions:
            return versions[version]
        wanted = _version_key(version)
        matching = [v for v in versions if _version_key(v)[: len(wanted)] == wanted]
        if not matching:
            raise CapabilityNotFound(
                f"capability {capability_id!r} has no version matching {version!r} "
                f"(registered: {', '.join(sorted(versions, key=_version_key))})"
            )
        return versions[max(matching, key=_version_key)]

    def all(self) -> list[Capability]:
        """Every registered capability, every version: what a worker can serve."""
        return [c for versions in self._by_id.values() for c in versions.values()]


default_registry = CapabilityRegistry()


def capability(
    capability_id: str,
    *,
    version: str,
    idempotent: bool = True,
    registry: CapabilityRegistry | None = None,
) -> Callable[[F], F]:
    """Declare a function as a capability a step can call.

    The function takes ``(ctx)`` or ``(ctx, argument)`` and may be ``async def`` or ``def``.
    ``idempotent=False`` means FlowX never retries it automatically (R4.2); it still
    re-executes after a crash between its effect and its commit, with the same
    ``ctx.idempotency_key`` — pass that key to whatever performs the effect.
    """
    problem = name_problem(capability_id)
    if problem is not None:
        raise PlanError(
            "FLOWX1026",
            f"capability id {shown(capability_id)} {problem}; use e.g. 'payment.capture'",
        )
    if not isinstance(version, str) or name_problem(version) is not None:
        raise FlowXError(
            f"capability version {shown(version)} must look like '1', '1.2' or '1.2.3'",
            code="capability.bad_version",
        )
    if not _ID.fullmatch(capability_id):
        raise FlowXError(
            f"capability id {capability_id!r} must be lower-case letters, digits, '.', '_' "
            "or '-', e.g. 'payment.capture'",
            code="capability.bad_id",
        )
    if not _VERSION.fullmatch(version):
        raise FlowXError(
            f"capability version {version!r} must look like '1', '1.2' or '1.2.3'",
            code="capability.bad_version",
        )

    def decorate(fn: F) -> F:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(params) not in (1, 2):
            raise FlowXError(
                f"capability {capability_id!r}: {fn.__qualname__} must take (ctx) or "
                f"(ctx, argument), not {len(params)} positional parameters",
                code="capability.bad_signature",
            )
        cap = Capability(
            id=capability_id,
            version=version,
            fn=fn,
            idempotent=idempotent,
            takes_argument=len(params) == 2,
            is_async=inspect.iscoroutinefunction(fn),
        )
        (registry or default_registry).register(cap)
        fn.__flowx_capability__ = cap  # type: ignore[attr-defined]
        return fn

    return decorate


def capability_of(obj: object) -> Capability | None:
    """The ``Capability`` behind a decorated function (or a ``Capability`` itself)."""
    if isinstance(obj, Capability):
        return obj
    cap = getattr(obj, "__flowx_capability__", None)
    if isinstance(cap, Capability):
        return cap
    wrapped = getattr(obj, "__wrapped__", None)
    if wrapped is not None and wrapped is not obj:
        return capability_of(wrapped)
    if isinstance(obj, functools.partial):
        return None
    return None
