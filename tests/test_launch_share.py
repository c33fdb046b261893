"""benchmarks.launch_share: where a study's run time goes, written under the study's own folder, with the wall time
of overlapping sweeps counted once."""

import glob
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sweep(start_s: int, duration_s: float, study: str) -> dict:
    """A sweeps.jsonl row that started ``start_s`` seconds after 12:00 UTC."""
    return {"study": study, "started_at": f"2026-01-01T12:{start_s // 60:02d}:{start_s % 60:02d}+00:00",
            "duration_s": duration_s, "n_runs": 1, "launcher": "local"}


def write(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_launch_share_writes_under_out_and_counts_overlapping_sweeps_once(tmp_path):
    """Issue 34.12: it wrote ./outputs/benchmarks/ wherever it ran, and added up the wall times of sweeps that ran at
    once (two sweeps on one OUT, 0-100 s and 50-150 s, made 200 s of a 150 s study)."""
    out = tmp_path / "my study"
    write(str(out / "strong_scaling" / "sweeps.jsonl"), [sweep(0, 100.0, "strong_scaling"),
                                                         sweep(50, 100.0, "strong_scaling")])
    write(str(out / "weak_scaling" / "sweeps.jsonl"), [sweep(140, 60.0, "weak_scaling"),
                                                       sweep(300, 10.0, "weak_scaling")])  # 140-200 s, 300-310 s
    os.makedirs(out / "strong_scaling" / "run0")
    (out / "strong_scaling" / "run0" / "record.json").write_text(json.dumps(
        {"n_measured_steps": 10, "step_time_s": 6.0, "nnodes": 1, "nproc_per_node": 2, "repeat": 0}))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    run = subprocess.run([sys.executable, "-m", "benchmarks.launch_share", str(out)], cwd=elsewhere,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": REPO})
    assert run.returncode == 0, run.stderr
    [path] = glob.glob(str(out / "benchmarks" / "launch_share-*.json"))
    assert f"written: {path}" in run.stdout and not (elsewhere / "outputs").exists()
    [res] = json.load(open(path))
    by = {s["study"]: s for s in res["studies"]}
    assert by["strong_scaling"]["sweeps_s"] == 150.0 and by["strong_scaling"]["measured_share"] == 0.4
    assert by["weak_scaling"]["sweeps_s"] == 70.0
    assert res["sweeps_s"] == 210.0  # 0-200 s and 300-310 s: each moment once, across studies too
    # --write DIR still gathers every OUT's result in one file there
    run = subprocess.run([sys.executable, "-m", "benchmarks.launch_share", str(out), "--write",
                          str(tmp_path / "all")], cwd=elsewhere, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert run.returncode == 0 and len(glob.glob(str(tmp_path / "all" / "launch_share-*.json"))) == 1
