"""The public API is ``flowx.__all__`` (issue 13): only what a user of the library needs, and
every class, function, method and property reachable from it documented, so ``help()`` and an
editor's hover answer "why would I call this" without reading the source.

Internals stay importable from their own modules (``flowx.hosting.lease.DurableLease``,
``flowx.engine.RunResult``, ...); they are just not promised to users.
"""

from __future__ import annotations

import enum
import inspect
import types
from collections.abc import Iterator
from typing import Any

import pytest

import flowx

#: Names that were public before issue 13 and are internals: a host builds them, a user never
#: does. ``test_internals_are_not_public`` keeps them out.
INTERNALS = {
    "DurableLease",  # the host's lease keeping
    "TimerService",  # the host runs timers itself
    "RunResult",  # what the engine hands the host
    "DuplicateStep",  # a store's refusal the engine handles; store authors use flowx.stores.errors
    "FencedOut",  # likewise: the host turns it into "this node lost the instance"
    "LeaseLost",  # likewise: the lease module's fail-closed signal to the engine
}

#: What Python, pydantic or the enum machinery gives every such class: not ours to document.
INHERITED_FROM_OUTSIDE = (object, Exception, BaseException, enum.Enum, int, str)


def _is_ours(obj: Any) -> bool:
    return (getattr(obj, "__module__", "") or "").startswith("flowx")


def _documented(obj: Any) -> bool:
    """A docstring of its own: a class does not borrow its base's (``inspect.getdoc`` would
    hand a bare pydantic model ``BaseModel``'s), and a dataclass's generated signature
    (``PublishResult(acknowledged: int, ...)``) says nothing about why."""
    if inspect.isclass(obj):
        doc = vars(obj).get("__doc__")
        if doc and doc.startswith(f"{obj.__name__}("):
            return False
    else:
        doc = inspect.getdoc(obj)
    return bool(doc and doc.strip())


def _members(cls: type) -> Iterator[tuple[str, Any]]:
    """Public methods and properties a flowx class defines itself (or inherits from a flowx
    base): pydantic's, dataclasses' and Python's own are documented where they come from."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not _is_ours(klass):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(member, property | staticmethod | classmethod):
                yield name, member.fget if isinstance(member, property) else member.__func__
            elif inspect.isfunction(member):
                yield name, member


def public_objects() -> Iterator[tuple[str, Any]]:
    """Every object reachable from ``flowx.__all__``: the names, and the members of classes."""
    for name in flowx.__all__:
        obj = getattr(flowx, name)
        if isinstance(obj, str):  # __version__
            continue
        if isinstance(obj, types.ModuleType):
            yield name, obj
            for attr in getattr(obj, "__all__", ()):
                yield f"{name}.{attr}", getattr(obj, attr)
            continue
        yield name, obj
        if inspect.isclass(obj):
            for member, value in _members(obj):
                yield f"{name}.{member}", value


def test_every_public_name_resolves() -> None:
    missing = [name for name in flowx.__all__ if not hasattr(flowx, name)]
    assert not missing, f"in flowx.__all__ but not importable: {missing}"


@pytest.mark.parametrize("name", sorted(INTERNALS))
def test_internals_are_not_public(name: str) -> None:
    assert name not in flowx.__all__, f"{name} is an internal: import it from its own module"


def _public_protocols() -> list[type]:
    return [
        obj
        for name in flowx.__all__
        if inspect.isclass(obj := getattr(flowx, name)) and getattr(obj, "_is_protocol", False)
    ]


def _documented_by_protocol(name: str) -> bool:
    """``SystemClock.now`` is documented by ``Clock.now``: a method that implements a public
    protocol's documented method says the same thing, so it need not say it twice."""
    if "." not in name:
        return False
    owner, member = name.rsplit(".", 1)
    cls = getattr(flowx, owner.split(".")[0])
    for protocol in _public_protocols():
        if protocol is cls or member not in vars(protocol):
            continue
        wanted = [m for m in vars(protocol) if not m.startswith("_")]
        if all(hasattr(cls, m) for m in wanted):
            return _documented(inspect.getattr_static(protocol, member))
    return False


def test_every_public_object_has_a_docstring() -> None:
    undocumented = sorted(
        name
        for name, obj in public_objects()
        if (inspect.isclass(obj) or callable(obj) or isinstance(obj, types.ModuleType))
        and not _documented(obj)
        and not _documented_by_protocol(name)
    )
    assert not undocumented, (
        f"{len(undocumented)} public objects without a docstring saying why a user would use "
        "them:\n" + "\n".join(undocumented)
    )
