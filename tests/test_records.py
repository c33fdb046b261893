"""The run's data, defined once: generated schema, step rows, record checks."""

import math
import os

import pytest

from kanlib import records

DOCS = os.path.join(os.path.dirname(__file__), "..", "docs", "schema.md")


def test_schema_doc_is_generated_from_the_dataclasses():
    with open(DOCS) as f:
        assert f.read() == records.schema_markdown(), "regenerate: python -m kanlib.records > docs/schema.md"


def test_every_field_is_documented():
    from dataclasses import fields

    for cls in (records.StepRow, records.Provenance, records.RunRecord, records.ManifestRow):
        for f in fields(cls):
            if f.name in ("provenance", "config"):
                continue
            assert len(f.metadata.get("doc", "")) > 3, f"{cls.__name__}.{f.name} has no docstring"


def test_step_columns_come_from_the_row_and_round_trip(tmp_path):
    path = str(tmp_path / records.STEPS_NAME)
    with records.StepWriter(path) as w:
        w.write(records.StepRow(step=0, measured=1, step_time_s=0.5, loss=2.0))
    rows, bad = records.read_steps_rows(path)
    assert not bad and list(rows[0]) == records.STEP_COLUMNS
    assert float(rows[0]["step_time_s"]) == 0.5 and math.isnan(float(rows[0]["val_loss"]))
    assert records.StepRow.reduced("max")[:1] == ["step_time_s"] and records.StepRow.reduced("mean") == ["loss"]


@pytest.mark.parametrize("change, reason", [
    ({"step_time_s": float("nan")}, "step_time_s is nan"),
    ({"step_time_s": 0.0}, "step_time_s is 0.0"),
    ({"step_time_s": -1.0}, "step_time_s is -1.0"),
    ({"step_time_s": "fast"}, "step_time_s is 'fast', not a number"),
    ({"schema_version": 99}, "schema_version 99"),
    ({"comm_total_s": -0.1}, "comm_total_s is -0.1"),
])
def test_bad_records_are_refused_with_a_reason(tmp_path, change, reason):
    good = {"schema_version": 2, "step_time_s": 0.01, "world_size": 2, "global_batch": 64, "status": "ok"}
    assert records.check_record(good) is None
    path = tmp_path / "record.json"
    import json

    path.write_text(json.dumps({**good, **change}))
    with pytest.raises(records.RecordError, match=f"^{path}: {reason}"):
        records.read_record(str(path))


def test_atomic_write_leaves_no_temporary_on_failure(tmp_path):
    path = str(tmp_path / "x.json")
    with pytest.raises(TypeError):
        records.atomic_write_json(path, {"bad": object()})
    assert os.listdir(tmp_path) == []
