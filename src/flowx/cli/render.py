"""What every command prints: ``-o json`` (one document) and ``-o text`` (lines and tables).

Each record becomes one dict (``flowx.hosting.documents``, shared with the HTTP API); the JSON
output is that dict and the text output is read from it, so the two cannot say different things. The
text keeps the stored JSON text of a payload where a person reads it (a state bag, an error),
the JSON decodes it so scripts get values, not strings.

Tables are hand-written rather than a table library so the bare install (``pydantic`` and
``click``) can print everything; operators on a minimal container still get readable output.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import click

from flowx.engine.waiting import WaitKind
from flowx.hosting.documents import (
    event_dict,
    instance_dict,
    outbox_dict,
    parent_dict,
    payload,
    receipt_dict,
    replay_dict,
    shown,
    signal_dict,
    step_dict,
    stop_dict,
    taken_signals,
    waiting_dict,
)
from flowx.stores.records import InstanceRecord, StepRecord

__all__ = [  # the record documents, re-exported for the commands that print them
    "event_dict",
    "instance_dict",
    "outbox_dict",
    "parent_dict",
    "payload",
    "receipt_dict",
    "replay_dict",
    "signal_dict",
    "step_dict",
    "stop_dict",
    "taken_signals",
    "waiting_dict",
]

# -- primitives -------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns under a dashed rule, two spaces apart.

    Trailing spaces are stripped so that the output diffs and greps cleanly; ``None`` prints as
    an empty cell rather than the word ``None``.
    """
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def emit_json(value: Any) -> None:
    """Print one JSON document. ``default=str`` turns datetimes into text instead of failing."""
    click.echo(json.dumps(value, default=str, indent=2, sort_keys=True))


def clip(text: str | None, width: int = 60) -> str:
    """Shorten ``text`` to ``width`` characters, ending in ``…`` when something was cut.

    A step result can be megabytes of JSON; one table row must stay one terminal line. The full
    value is always available with ``-o json``.
    """
    if text is None:
        return ""
    text = " ".join(text.splitlines())
    return text if len(text) <= width else text[: width - 1] + "…"


def stamp(moment: datetime, timespec: str = "seconds") -> str:
    """A moment for a table cell: seconds in a listing, milliseconds in one instance's history."""
    return moment.isoformat(timespec=timespec)


def stop_text(doc: dict[str, Any]) -> str:
    """One line per fact an operator acts on: what happened, and what is still to happen."""
    verb = "cancel" if doc["mode"] == "cancel" else "terminate"
    iid, state = doc["instance_id"], doc["state"]
    if doc["status"] == "ended":
        lines = [f"instance {iid} had already ended {state}; nothing to do"]
    elif state in ("Cancelled", "Terminated"):
        lines = [f"instance {iid}: {state}"]
    else:
        already = " (already requested)" if doc["status"] == "already" else ""
        lines = [f"instance {iid}: {verb} requested{already}; now {state}"]
        if doc["instance_id"] not in doc["waiting"]:
            lines.append(
                "  it stops at its next step boundary, on the node running it (at that "
                "node's next lease renewal)"
            )
    others = [i for i in doc["reached"] if i != iid]
    if others:
        lines.append(f"  reached {len(others)} sub-flow instance(s): {', '.join(others)}")
    if doc["waiting"]:
        lines.append(
            "  left Pending for a worker that carries their flow (a compensation is owed): "
            + ", ".join(doc["waiting"])
        )
    return "\n".join(lines)


# -- text, read from those dicts ---------------------------------------------------------------


def instances_text(rows: list[dict[str, Any]]) -> str:
    """``flowx list``: one line per instance dict."""
    return table(
        ["instance", "flow", "version", "state", "created", "updated"],
        [
            (
                r["instance_id"],
                r["flow_id"],
                r["flow_version"],
                r["state"],
                stamp(r["created_at"]),
                stamp(r["updated_at"]),
            )
            for r in rows
        ],
    )


def _waits_for(waiting: dict[str, Any]) -> str:
    if waiting["kind"] == WaitKind.SUB_FLOW:
        return "sub-flow child (woken when the child instance ends)"
    if waiting["kind"] == WaitKind.SIGNAL:
        return f"signal {waiting['signal']!r} (deliver it with `flowx signal`)"
    return "timer"


def _facts(doc: dict[str, Any], record: InstanceRecord) -> list[tuple[str, object]]:
    """The key/value block of ``flowx show``; the state bag and error as stored text."""
    instance, parent, waiting = doc["instance"], doc["parent"], doc["waiting"]
    facts: list[tuple[str, object]] = [
        ("instance", instance["instance_id"]),
        ("flow", f"{instance['flow_id']}@{instance['flow_version']}"),
        ("state", instance["state"]),
        ("tenant", instance["tenant_id"] or "-"),
        ("fence", instance["fence"]),
        ("created", stamp(instance["created_at"], "milliseconds")),
        ("updated", stamp(instance["updated_at"], "milliseconds")),
    ]
    if parent is not None:
        facts.append(
            (
                "parent",
                f"{parent['instance_id']} (step {parent['step_id']}, "
                f"scope {parent['scope'] or '-'})",
            )
        )
    if waiting is not None:
        facts.append(("waits for", _waits_for(waiting)))
        facts.append(("wake at", waiting["wake_at"] or "- (no timeout)"))
        step = f"#{waiting['step_id']}" if waiting["step_id"] is not None else "-"
        if waiting["step"]:
            step = f"{waiting['step']!r} ({step})"
        facts.append(("wait step", f"{step}, scope {waiting['scope'] or '-'}"))
    if instance["resume_from_step"] is not None:
        facts.append(("replayed", f"from step #{instance['resume_from_step']}"))
    stop = instance["stop_request"]
    if stop is not None:
        facts.append(("stop", f"{stop['mode']} by {stop['by']} at {stop['at']}: {stop['reason']}"))
    if record.error:
        facts.append(("error", record.error))
    facts.append(("state bag", shown(record.state_bag)))
    return facts


_STEP_COLUMNS = [
    "sequence",
    "scope",
    "step_id",
    "step",
    "attempt",
    "outcome",
    "capability",
    "duration_ms",
    "committed_at",
    "node",
    "result",
]


def show_text(doc: dict[str, Any], record: InstanceRecord, steps: list[StepRecord]) -> str:
    """``flowx show``: the facts of ``doc``, then the step history (results clipped to a line,
    so from the stored text rather than the decoded value)."""
    facts = _facts(doc, record)
    width = max(len(k) for k, _ in facts)
    lines = [f"{key:<{width}}  {value}" for key, value in facts] + [""]
    if not steps:
        return "\n".join([*lines, "no steps committed yet"])
    rows = [
        (
            s["sequence"],
            s["scope"] or "-",
            s["step_id"],
            s["step_name"],
            s["attempt"],
            s["outcome"],
            f"{s['capability_id']}@{s['capability_version']}" if s["capability_id"] else "-",
            s["duration_ms"],
            stamp(s["committed_at"], "milliseconds"),
            s["node_id"] or "-",
            clip(shown(raw.result)),
        )
        for s, raw in zip(doc["steps"], steps, strict=True)
    ]
    lines += [table(_STEP_COLUMNS, rows)]
    if doc.get("signals"):
        lines += ["", "signals"]
        lines.append(
            table(
                ["seq", "name", "key", "received_at", "taken"],
                [
                    (g["seq"], g["name"], g["key"] or "-", g["received_at"], g["taken"])
                    for g in doc["signals"]
                ],
            )
        )
    if doc.get("events"):
        lines += ["", "events"]
        lines.append(
            table(
                ["event", "type", "key", "published_at", "attempts"],
                [
                    (
                        e["event_id"],
                        e["type"],
                        e["partition_key"] or "-",
                        e["published_at"]
                        or ("dead " + e["dead_at"] if e["dead_at"] else "pending"),
                        e["attempts"],
                    )
                    for e in doc["events"]
                ],
            )
        )
    return "\n".join(lines)


_RECEIPT_MEANS = {
    "woken": "left Pending for a worker",
    "kept": "kept in the inbox until the flow reaches its wait",
    "duplicate": "already received (or the wait already took one); nothing written",
    "late": "the wait for it has already timed out; nothing written",
}


def receipt_text(receipt: dict[str, Any]) -> str:
    """``flowx signal``: what became of the signal and what that means."""
    what = _RECEIPT_MEANS.get(receipt["status"], "")
    return (
        f"{receipt['status']}: signal {receipt['name']!r} #{receipt['seq']} for "
        f"{receipt['instance_id']} (state {receipt['state']})" + (f"; {what}" if what else "")
    )


def replay_text(doc: dict[str, Any]) -> str:
    """``flowx replay``: where it started, what re-runs, and how it ended (``replay_dict``
    plus ``dry_run`` and ``final_state``)."""
    scope = f", scope {doc['scope']}" if doc["scope"] else ""
    head = "would replay" if doc["dry_run"] else "replayed"
    lines = [
        f"{head} {doc['instance_id']} ({doc['state']}) in {doc['mode']} mode "
        f"from {doc['step']!r} (step #{doc['step_id']}{scope})",
        "re-runs:" if doc["reruns"] else "re-runs: nothing",
        *(f"  {item}" for item in doc["reruns"]),
    ]
    if doc["kept"]:
        lines.append(f"keeps the results of: {', '.join(doc['kept'])}")
    if doc["deadline_at"] is not None and doc["mode"] == "forward":
        lines.append(f"deadline: {doc['deadline_at']}")
    if doc["dry_run"]:
        lines.append("dry run: nothing was written")
    elif doc["final_state"] is None:
        lines.append("left Pending for a worker (--no-wait)")
    else:
        lines.append(f"final state: {doc['final_state']}")
    return "\n".join(lines)


def dead_letters_text(events: list[dict[str, Any]]) -> str:
    """``flowx outbox dead-letters``: one line per event dict, the reason clipped."""
    return table(
        ["event_id", "type", "key", "attempts", "dead_at", "reason"],
        [
            (
                e["event_id"],
                e["type"],
                e["partition_key"] or "-",
                e["attempts"],
                stamp(datetime.fromisoformat(e["dead_at"])) if e["dead_at"] else "-",
                clip(e["reason"] or ""),
            )
            for e in events
        ],
    )
