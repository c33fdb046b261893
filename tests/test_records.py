"""The run's data, defined once: generated schema, step rows, record checks."""

import math
import os

import pytest

from conftest import fill_disk
from kanlib import manifest, records, schema
from kanlib.disturbance import disturbance

DOCS = os.path.join(os.path.dirname(__file__), "..", "docs", "schema.md")


def test_schema_doc_is_generated_from_the_dataclasses():
    with open(DOCS) as f:
        assert f.read() == schema.schema_markdown(), "regenerate: python -m kanlib.schema > docs/schema.md"


def test_every_field_is_documented():
    from dataclasses import fields

    for cls in (records.StepRow, records.Provenance, records.RunRecord, manifest.ManifestRow):
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
    ({"tensor_peak_bytes": -4096}, "tensor_peak_bytes is -4096"),
    ({"time_to_target_s": -1.5}, "time_to_target_s is -1.5"),
    ({"final_val_loss": float("nan")}, "final_val_loss is nan, not a finite number"),
    ({"nnodes": 1, "nproc_per_node": 4}, "world_size is 2, but the placement nnodes x nproc_per_node is 1x4"),
])
def test_bad_records_are_refused_with_a_reason(tmp_path, change, reason):
    good = {"schema_version": 2, "step_time_s": 0.01, "world_size": 2, "global_batch": 64, "status": "ok",
            "nnodes": 2, "nproc_per_node": 1, "final_val_loss": 0.5, "time_to_target_s": 1.0}
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


def test_a_full_disk_loses_nothing_already_written(full_disk):
    """Record, manifest and checkpoint writes on a full disk raise, leave no temporary file behind, and
    keep what was written before (issue: a full disk left an empty manifest and a checkpoint .tmp)."""
    import json

    import torch

    from kanlib import checkpoint

    run_dir = full_disk / "run"
    run_dir.mkdir()
    record, manifest_file = str(run_dir / "record.json"), str(full_disk / "manifest.jsonl")
    records.atomic_write_json(record, {"step_time_s": 0.5})
    manifest.append_manifest(manifest_file, {"run_key": "a", "status": "ok"})
    checkpoint.save(str(run_dir), {"model": {"w": torch.zeros(4)}, "optimizer": {}, "rng": []}, 5)
    fill_disk(full_disk)
    with pytest.raises(OSError):
        records.atomic_write_json(record, {"step_time_s": 0.7, "pad": "x" * 100_000})
    with pytest.raises(OSError):
        checkpoint.save(str(run_dir), {"model": {"w": torch.zeros(100_000)}, "optimizer": {}, "rng": []}, 10)
    with pytest.raises(OSError):
        manifest.append_manifest(manifest_file, {"run_key": "b", "status": "failed", "error": "x" * 100_000})
    left = [os.path.join(d, f) for d, _, fs in os.walk(full_disk) for f in fs if ".tmp" in f]
    assert left == []
    assert json.load(open(record)) == {"step_time_s": 0.5}
    rows, _ = manifest.read_manifest_rows(manifest_file)
    assert [(r["run_key"], r["status"]) for r in rows] == [("a", "ok")]
    assert checkpoint.load_latest(str(run_dir))["step"] == 5


def test_no_provenance_or_measurement_field_overwrites_a_config_field():
    # record.json is flat: a provenance or measurement field named like a config field would replace the
    # config's value, and analyses group by config fields (a per-run value there splits every group).
    import dataclasses

    from kanlib.collbench import BenchConfig
    from kanlib.config import RunConfig

    config = {f.name for cls in (RunConfig, BenchConfig) for f in dataclasses.fields(cls)}
    ours = {f.name for f in dataclasses.fields(records.Provenance)} | set(records.MEASUREMENT_FIELDS)
    assert config & ours <= {"backend", "device"}  # the values used, by design (the requested ones are kept)


def test_a_bench_record_from_its_dataclass_passes_its_check():
    from kanlib.collbench import BenchConfig

    cfg = BenchConfig(nproc_per_node=2)
    row = records.BenchRow(8, 2, "float32", 5, 1e-4, 9e-5, 2e-4, 0.0, 8e4, 8e4)
    rec = records.BenchRecord(records.Provenance(), cfg.to_dict(), [row], world_size=2, placement="1x2").to_dict()
    assert rec["record_kind"] == records.BENCH_KIND and rec["rows"][0]["time_s"] == 1e-4
    assert records.check_bench_record(rec) is None and records.check_record(rec) is None
    rec["rows"][0]["time_s"] = -1.0
    assert records.check_record(rec) == "rows[0].time_s is -1.0, outside its range (> 0, finite)"


def test_waits_behind_a_runs_own_threads_are_not_interference():
    """A timed hook with many small buckets makes the training thread wait behind its own process's threads
    (13-18% of the window on a quiet machine) while other processes take almost nothing: not disturbed. The same
    wait with other processes busy on its CPUs is; and where the per-CPU counters are too coarse (a short window)
    or unknown, the wait alone decides."""
    base = {"world_size": 2, "threads": 1, "interference_window_s": 1.7}
    assert disturbance({**base, "foreign_cpu_frac": 0.02, "runqueue_wait_frac": 0.17}) == ""
    assert "waited" in disturbance({**base, "foreign_cpu_frac": 0.08, "runqueue_wait_frac": 0.17})
    assert "other processes took 30%" in disturbance({**base, "foreign_cpu_frac": 0.3, "runqueue_wait_frac": 0.3})
    assert "waited" in disturbance({**base, "foreign_cpu_frac": None, "runqueue_wait_frac": 0.17})
    short = {**base, "interference_window_s": 0.05}  # 0.1 CPU-s: 10 ticks of the per-CPU counters
    assert "waited" in disturbance({**short, "foreign_cpu_frac": 0.0, "runqueue_wait_frac": 0.17})
    # the default study's shortest 2-process runs (36 steps of 6 ms), quiet: judged by the counters, not flagged
    assert disturbance({**base, "interference_window_s": 0.22, "foreign_cpu_frac": 0.0,
                        "runqueue_wait_frac": 0.12}) == ""
