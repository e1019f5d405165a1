"""Where an instance lives, written into its id (R6.2, R9.9: a journal sharded by tenant).

Why in the id: every call that names an instance (open, commit, signal, stop, show) must reach
its shard, and a lookup table or a broadcast on each of them would cost a round trip to every
shard. So a sharded store *places* each new id — it rewrites a few fixed bits of the UUID to
name the shard — and routing is then arithmetic on the id alone. The id stays a valid UUID
(the journal's columns are ``uuid``, the CLI and the API validate ids as UUIDs).

Layout: a placed id is a version-8 UUID (RFC 9562's vendor-specific version) whose third group
reads ``8SSf``: ``SS`` is the shard index in hex (so at most 256 shards) and ``f`` marks it as
placed by FlowX. Every other id (version 4 or 5, as an unsharded FlowX mints them) is *not
placed*: a sharded store keeps it on shard 0, so the database of an unsharded deployment can
become shard 0 and every id it holds still resolves.

Tenant to shard: jump consistent hash (Lamping and Veach) of a 64-bit blake2b of the tenant
(``""`` for an instance with no tenant). Stable across processes and releases (never Python's
``hash``), and when a shard is added only about 1/(n+1) of the tenants map to the new one;
the others keep theirs. ``pins`` overrides the hash for named tenants (how a tenant is moved,
or kept where it is when shards are added: README "Sharding the journal").
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

#: A shard index is one byte of the id.
MAX_SHARDS = 256
_VERSION = 8
_MARK = 0xF
# Bits 64..79 of the UUID's integer: version nibble, shard byte, mark nibble.
_FIELD_SHIFT = 64
_FIELD_MASK = 0xFFFF << _FIELD_SHIFT
_VARIANT_MASK = 0b11 << 62
_VARIANT_RFC = 0b10 << 62
_JUMP_MULTIPLIER = 2862933555777941757
_U64 = (1 << 64) - 1


def place(instance_id: str, shard: int) -> str:
    """``instance_id`` rewritten to name ``shard``: deterministic, so the same start (the same
    idempotency key, so the same derived id) on the same shard always yields the same id."""
    if not 0 <= shard < MAX_SHARDS:
        raise ValueError(f"shard index {shard} is out of range 0..{MAX_SHARDS - 1}")
    value = uuid.UUID(instance_id).int
    field = (_VERSION << 12) | (shard << 4) | _MARK
    value = (value & ~_FIELD_MASK & ~_VARIANT_MASK) | (field << _FIELD_SHIFT) | _VARIANT_RFC
    return str(uuid.UUID(int=value))


def shard_of(instance_id: str) -> int | None:
    """The shard a placed id names; ``None`` for an id that was never placed (or not a UUID:
    the store answers such an id as it answers any unknown one)."""
    try:
        value = uuid.UUID(instance_id).int
    except ValueError:
        return None
    field = (value & _FIELD_MASK) >> _FIELD_SHIFT
    if field >> 12 != _VERSION or field & 0xF != _MARK:
        return None
    return (field >> 4) & 0xFF


def inherit(child_id: str, parent_id: str) -> str:
    """A sub-flow child's id on its parent's shard: a child's end wakes its parent, and a stop
    reaches every descendant, each in one transaction, so a family lives on one database."""
    shard = shard_of(parent_id)
    return child_id if shard is None else place(child_id, shard)


def tenant_hash(tenant: str | None) -> int:
    """A 64-bit hash of the tenant that every process and release agrees on."""
    digest = hashlib.blake2b((tenant or "").encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def jump(key: int, buckets: int) -> int:
    """Jump consistent hash: a bucket in ``range(buckets)``; growing ``buckets`` by one moves
    a key only to the new bucket, and only about one key in ``buckets``."""
    chosen, candidate = -1, 0
    while candidate < buckets:
        chosen = candidate
        key = (key * _JUMP_MULTIPLIER + 1) & _U64
        candidate = int((chosen + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return chosen


def tenant_shard(tenant: str | None, shards: int, pins: Mapping[str, int] | None = None) -> int:
    """The shard new instances of ``tenant`` are placed on."""
    if pins and (tenant or "") in pins:
        return pins[tenant or ""]
    return jump(tenant_hash(tenant), shards)


@runtime_checkable
class ShardedIds(Protocol):
    """**Protocol (optional):** a store that places each new instance id on a shard. The host
    applies it to a start's id before anything is derived from it (the sealing context, the
    row), so a store without it sees ids exactly as before."""

    def place(self, instance_id: str, tenant: str | None) -> str:
        """``instance_id`` placed on the shard of ``tenant``."""
        ...
