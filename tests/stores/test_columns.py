"""The shared column lists name exactly the fields of the records they are read into: a field
added to a record without its column (or the other way round) fails here, not as a
``TypeError`` in one backend's reader."""

from __future__ import annotations

import dataclasses

from flowx.stores.columns import (
    CANDIDATE_COLUMNS,
    CREATE_COLUMNS,
    EVENT_COLUMNS,
    INSTANCE_COLUMNS,
    SIGNAL_COLUMNS,
    STEP_COLUMNS,
    names,
)
from flowx.stores.records import (
    EventRecord,
    InstanceRecord,
    NewInstance,
    RecoveryCandidate,
    SignalRecord,
    StepRecord,
)


def fields(record: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(record))


def test_each_list_names_its_records_fields_in_order() -> None:
    assert names(INSTANCE_COLUMNS) == fields(InstanceRecord)
    assert names(STEP_COLUMNS) == fields(StepRecord)
    assert names(CANDIDATE_COLUMNS) == fields(RecoveryCandidate)
    assert names(SIGNAL_COLUMNS) == fields(SignalRecord)
    assert set(names(EVENT_COLUMNS)) == set(fields(EventRecord))


def test_a_create_writes_every_field_of_a_new_instance_and_its_fence_and_stamps() -> None:
    assert set(names(CREATE_COLUMNS)) == set(fields(NewInstance)) | {
        "fence",
        "created_at",
        "updated_at",
    }


def test_names_reads_qualified_and_aliased_columns() -> None:
    assert names("o.a, coalesce(o.b, 0) AS b, c") == ("a", "b", "c")
