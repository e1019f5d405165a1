"""Test fixtures build hosts with node-level options as keywords; FlowHost takes them in
its settings. One place folds the one into the other."""

from __future__ import annotations

from typing import Any

import flowx

#: What a node is configured with (``HostSettings``) rather than built from.
NODE_SETTINGS = (
    "node_id",
    "recovery",
    "timers",
    "outbox_batch_size",
    "retention_page_size",
    "retention_sweep_interval",
)


def fold_settings(kw: dict[str, Any]) -> dict[str, Any]:
    """``kw`` for ``FlowHost(**kw)``, with ``node_id``/``recovery``/``timers``/
    ``outbox_batch_size`` moved into ``settings`` (the given one, or the environment's)."""
    moved = {name: kw.pop(name) for name in NODE_SETTINGS if name in kw}
    if moved:
        base = kw.get("settings") or flowx.HostSettings.load()
        kw["settings"] = base.replace(**moved)
    return kw
