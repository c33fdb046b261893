"""Sweeps that lose nothing: the manifest, failures carried past, resuming a killed sweep, and
tolerant loading of damaged result files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from kanlib import records, results
from runhelp import manifest_rows, no_process_left, processes_mentioning, tiny  # noqa: F401
from runners.sweep import run_sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_one_failing_member_of_three(tmp_path):
    # The middle run diverges (SGD with a huge learning rate): nan_policy='stop' fails it.
    configs = [tiny(tmp_path, steps=10, seed=1),
               tiny(tmp_path, steps=10, seed=2, optimizer="sgd", lr=1e12),
               tiny(tmp_path, steps=10, seed=3)]
    res = run_sweep(configs, progress=False, timeout_s=120)
    assert len(res.records) == 2 and not res.ok
    [(cfg, msg)] = res.failures
    assert cfg is configs[1] and msg.startswith("failed: NonFiniteLoss: non-finite loss at step")
    rows = manifest_rows(configs[0])
    assert [(r["run_key"], r["status"]) for r in rows] == [
        (configs[0].run_key(), "ok"), (configs[1].run_key(), "failed"), (configs[2].run_key(), "ok")]
    # A second pass runs only the failed one again.
    res2 = run_sweep(configs, progress=False, timeout_s=120)
    assert res2.skipped == 2 and len(res2.failures) == 1
    assert [r["status"] for r in manifest_rows(configs[0])] == ["ok", "failed", "ok", "failed"]


SWEEP_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from runhelp import tiny
    from runners.sweep import run_sweep
    configs = [tiny({out!r}, steps=s, seed=i, checkpoint_every=5) for i, s in enumerate([10, 400])]
    run_sweep(configs, progress=False, timeout_s=120)
""")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_sweep_resumes_only_what_is_missing(tmp_path, sig):
    script = SWEEP_SCRIPT.format(root=ROOT, tests=os.path.join(ROOT, "tests"), out=str(tmp_path))
    configs = [tiny(tmp_path, steps=s, seed=i, checkpoint_every=5) for i, s in enumerate([10, 400])]
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Wait until the second (long) run has written a checkpoint, then kill the sweep outright.
        ckpt = os.path.join(configs[1].run_dir(), "checkpoints", "latest")
        deadline = time.monotonic() + 90
        while not os.path.exists(ckpt) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert os.path.exists(ckpt), "the sweep never reached its second run"
        proc.send_signal(sig)
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The orphaned run gets SIGTERM (parent-death signal), checkpoints and stops.
    deadline = time.monotonic() + 30
    while processes_mentioning(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_mentioning(str(tmp_path))
    # SIGKILL: the sweep could not record the attempt it was in. SIGTERM: it stopped the run
    # gracefully and recorded it as preempted.
    interrupted = [] if sig == signal.SIGKILL else [(configs[1].run_key(), "preempted")]
    rows = [(r["run_key"], r["status"]) for r in manifest_rows(configs[0])]
    assert rows == [(configs[0].run_key(), "ok")] + interrupted
    assert os.path.exists(os.path.join(configs[1].run_dir(), "preempted.json"))
    assert not os.path.exists(os.path.join(configs[1].run_dir(), records.RECORD_NAME))

    res = run_sweep(configs, progress=False, timeout_s=120)
    assert res.ok and res.skipped == 1 and len(res.records) == 2
    rows = [(r["run_key"], r["status"]) for r in manifest_rows(configs[0])]
    assert rows == [(configs[0].run_key(), "ok")] + interrupted + [(configs[1].run_key(), "ok")]
    rec = {r["run_key"]: r for r in res.records}[configs[1].run_key()]
    assert rec["resumed_from_step"] > 0  # continued from its checkpoint, not from scratch
    steps = results.load_steps(configs[1].run_dir())
    assert steps.step.tolist() == list(range(400))


@pytest.mark.slow
def test_manifest_tolerates_truncated_line_and_concurrent_appends(tmp_path):
    path = str(tmp_path / "manifest.jsonl")
    records.append_manifest(path, {"run_key": "a", "status": "ok"})
    with open(path, "a") as f:
        f.write('{"run_key": "b", "stat')  # a writer died mid-line
    records.append_manifest(path, {"run_key": "c", "status": "failed", "error": "x"})
    with pytest.warns(UserWarning, match="line 2"):
        df = results.load_manifest(path)
    assert df.run_key.tolist() == ["a", "c"] and df.attrs["bad"][0][:2] == (path, 2)
    with pytest.raises(ValueError, match="status: unknown value 'done'"):
        records.append_manifest(path, {"run_key": "d", "status": "done"})

    # Many processes appending at once: every line arrives whole.
    code = ("import sys; sys.path.insert(0, %r); from kanlib import records\n"
            "for i in range(50): records.append_manifest(%r, {'run_key': f'p{sys.argv[1]}-{i}', 'status': 'ok', "
            "'error': 'x' * 3000})") % (ROOT, path)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(n)]) for n in range(4)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    with pytest.warns(UserWarning):
        df = results.load_manifest(path)
    assert len(df) == 2 + 200 and len(df.attrs["bad"]) == 1


def test_steps_loader_drops_a_truncated_last_line(tmp_path):
    w = records.StepWriter(str(tmp_path / records.STEPS_NAME))
    for s in range(3):
        w.write(records.StepRow(step=s, measured=1, step_time_s=0.1, loss=1.0))
    w.close()
    with open(tmp_path / records.STEPS_NAME, "a") as f:
        f.write("3,1,0.1")
    with pytest.warns(UserWarning, match="line 5: truncated row"):
        df = results.load_steps(str(tmp_path))
    assert df.step.tolist() == [0, 1, 2]
    records.truncate_steps(str(tmp_path / records.STEPS_NAME), 2)
    assert results.load_steps(str(tmp_path)).step.tolist() == [0, 1]


def test_corrupt_records_are_named_and_skipped(tmp_path):
    good = tmp_path / "s" / "run-a"
    good.mkdir(parents=True)
    records.atomic_write_json(str(good / records.RECORD_NAME),
                              {"schema_version": 1, "study": "s", "world_size": 1, "repeat": 0, "step_time_s": 1.0,
                               "global_batch": 64})
    cut = tmp_path / "s" / "run-b"
    cut.mkdir()
    (cut / records.RECORD_NAME).write_text('{\n "schema_version": 1,\n "study": "s", "step_')
    junk = tmp_path / "s" / "run-c"
    junk.mkdir()
    (junk / records.RECORD_NAME).write_text("[1, 2]")
    with pytest.warns(UserWarning, match="skipped 2 unreadable"):
        df = results.load_records(str(tmp_path))
    assert len(df) == 1
    bad = {os.path.basename(os.path.dirname(p)): (line, reason) for p, line, reason in df.attrs["bad"]}
    assert bad["run-b"][0] == 3 and bad["run-c"][1].startswith("not a run record")
    with pytest.raises(results.RecordError, match=f"^{cut / records.RECORD_NAME}, line 3: "):
        results.load_records(str(tmp_path), strict=True)


def test_empty_output_dir_says_no_records(tmp_path):
    with pytest.raises(results.NoRecordsError, match=f"^no records under {tmp_path}"):
        results.load_records(str(tmp_path))
    with pytest.raises(results.NoRecordsError, match=f"^no records of study 'x' under {tmp_path}"):
        results.load_records(str(tmp_path), study="x")
