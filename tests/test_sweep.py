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

from kanlib import disturbance, manifest, records
from kanlib.analysis import load
from runhelp import manifest_rows, processes_mentioning, tiny
from runners.sweep import run_sweep

pytestmark = pytest.mark.usefixtures("no_process_left")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_one_failing_member_of_three(tmp_path):
    # The middle run diverges (SGD with a huge learning rate): nan_policy='stop' fails it.
    configs = [tiny(tmp_path, steps=10, seed=1),
               tiny(tmp_path, steps=10, seed=2, optimizer="sgd", lr=1e12),
               tiny(tmp_path, steps=10, seed=3)]
    res = run_sweep(configs, progress=False, rerun_disturbed=False, timeout_s=120)
    assert len(res.records) == 2 and not res.ok
    [(cfg, msg)] = res.failures
    assert cfg is configs[1] and msg.startswith("failed: kanlib.train.NonFiniteLoss: non-finite loss at step")
    rows = manifest_rows(configs[0])
    assert [(r["run_key"], r["status"]) for r in rows] == [
        (configs[0].run_key(), "ok"), (configs[1].run_key(), "failed"), (configs[2].run_key(), "ok")]
    # A second pass runs only the failed one again.
    res2 = run_sweep(configs, progress=False, rerun_disturbed=False, timeout_s=120)
    assert res2.skipped == 2 and len(res2.failures) == 1
    assert [r["status"] for r in manifest_rows(configs[0])] == ["ok", "failed", "ok", "failed"]


SWEEP_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from runhelp import tiny
    from runners.sweep import run_sweep
    configs = [tiny({out!r}, steps=s, seed=i, checkpoint_every=5) for i, s in enumerate([10, 400])]
    run_sweep(configs, progress=False, rerun_disturbed=False, timeout_s=120)
""")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_sweep_resumes_only_what_is_missing(tmp_path, sig):
    script = SWEEP_SCRIPT.format(root=ROOT, tests=os.path.join(ROOT, "tests"), out=str(tmp_path))
    configs = [tiny(tmp_path, steps=s, seed=i, checkpoint_every=5) for i, s in enumerate([10, 400])]
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Wait until the sweep has recorded the first run and the second (long) run has written a checkpoint,
        # then kill the sweep outright. Both conditions: the worker group goes on to the second run without
        # waiting for the sweep to write the first one's manifest row (it polls the group's events), so on a busy
        # machine the checkpoint can come first (CI, stop 32: the row was not there yet when SIGKILL came).
        ckpt = os.path.join(configs[1].run_dir(), "checkpoints", "latest")

        def reached() -> bool:
            return os.path.exists(ckpt) and any(r["status"] == "ok" for r in manifest_rows(configs[0]))

        deadline = time.monotonic() + 90
        while not reached() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert reached(), "the sweep never recorded its first run and checkpointed its second"
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

    res = run_sweep(configs, progress=False, rerun_disturbed=False, timeout_s=120)
    assert res.ok and res.skipped == 1 and len(res.records) == 2
    rows = [(r["run_key"], r["status"]) for r in manifest_rows(configs[0])]
    assert rows == [(configs[0].run_key(), "ok")] + interrupted + [(configs[1].run_key(), "ok")]
    rec = {r["run_key"]: r for r in res.records}[configs[1].run_key()]
    assert rec["resumed_from_step"] > 0  # continued from its checkpoint, not from scratch
    steps = load.load_steps(configs[1].run_dir())
    assert steps.step.tolist() == list(range(400))


@pytest.mark.slow
def test_manifest_tolerates_truncated_line_and_concurrent_appends(tmp_path):
    path = str(tmp_path / "manifest.jsonl")
    manifest.append_manifest(path, {"run_key": "a", "status": "ok"})
    with open(path, "a") as f:
        f.write('{"run_key": "b", "stat')  # a writer died mid-line
    manifest.append_manifest(path, {"run_key": "c", "status": "failed", "error": "x"})
    with pytest.warns(UserWarning, match="line 2"):
        df, bad = load.read_manifest(path)
    assert df.run_key.tolist() == ["a", "c"] and bad[0][:2] == (path, 2)
    with pytest.raises(ValueError, match="status: unknown value 'done'"):
        manifest.append_manifest(path, {"run_key": "d", "status": "done"})

    # Many processes appending at once: every line arrives whole.
    code = ("import sys; sys.path.insert(0, %r); from kanlib import manifest\n"
            "for i in range(50): manifest.append_manifest(%r, {'run_key': f'p{sys.argv[1]}-{i}', 'status': 'ok', "
            "'error': 'x' * 3000})") % (ROOT, path)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(n)]) for n in range(4)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    with pytest.warns(UserWarning):
        df, bad = load.read_manifest(path)
    assert len(df) == 2 + 200 and len(bad) == 1


def test_steps_loader_drops_a_truncated_last_line(tmp_path):
    w = records.StepWriter(str(tmp_path / records.STEPS_NAME))
    for s in range(3):
        w.write(records.StepRow(step=s, measured=1, step_time_s=0.1, loss=1.0))
    w.close()
    with open(tmp_path / records.STEPS_NAME, "a") as f:
        f.write("3,1,0.1")
    with pytest.warns(UserWarning, match="line 5: truncated row"):
        df = load.load_steps(str(tmp_path))
    assert df.step.tolist() == [0, 1, 2]
    records.truncate_steps(str(tmp_path / records.STEPS_NAME), 2)
    assert load.load_steps(str(tmp_path)).step.tolist() == [0, 1]


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
        recs = load.read(str(tmp_path))
    assert len(recs.select().data) == 1
    bad = {os.path.basename(os.path.dirname(p)): (line, reason) for p, line, reason in recs.bad}
    assert bad["run-b"][0] == 3 and bad["run-c"][1].startswith("not a run record")
    with pytest.raises(load.RecordError, match=f"^{cut / records.RECORD_NAME}, line 3: "):
        load.load_records(str(tmp_path), strict=True)


def test_empty_output_dir_says_no_records(tmp_path):
    with pytest.raises(load.NoRecordsError, match=f"^no records under {tmp_path}"):
        load.load_records(str(tmp_path))
    with pytest.raises(load.NoRecordsError, match=f"^no records of study 'x' under {tmp_path}"):
        load.load_records(str(tmp_path), study="x")


def _torchrun_children(pid: int) -> list[int]:
    from runners.supervisor import descendants

    out = []
    for c in descendants(pid):
        try:
            with open(f"/proc/{c}/cmdline", "rb") as f:
                if b"torch.distributed.run" in f.read():
                    out.append(c)
        except OSError:
            pass
    return out


SWEEP_OF_TWO = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from runhelp import tiny
    from runners.sweep import run_sweep
    configs = [tiny({out!r}, steps=s, seed=i) for i, s in enumerate([4000, 10])]
    res = run_sweep(configs, progress=False, rerun_disturbed=False, timeout_s=120)
    print("RESULT", len(res.records), len(res.failures), flush=True)
""")


@pytest.mark.slow
def test_sigkilled_torchrun_in_a_sweep_leaves_nothing_and_the_sweep_goes_on(tmp_path):
    script = SWEEP_OF_TWO.format(root=ROOT, tests=os.path.join(ROOT, "tests"), out=str(tmp_path))
    configs = [tiny(tmp_path, steps=s, seed=i) for i, s in enumerate([4000, 10])]
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        steps = os.path.join(configs[0].run_dir(), records.STEPS_NAME)
        deadline = time.monotonic() + 90
        while not os.path.exists(steps) and time.monotonic() < deadline:
            time.sleep(0.05)
        [torchrun] = _torchrun_children(proc.pid)
        from runners.supervisor import descendants

        workers = descendants(torchrun)
        assert len(workers) >= 2
        os.kill(torchrun, signal.SIGKILL)  # as the OOM killer would
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "RESULT 1 1" in out, out  # the sweep recorded the failure and ran the next config
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{p}") for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in workers if os.path.exists(f"/proc/{p}")], "workers outlived their killed torchrun"
    assert not os.path.exists(os.path.join(configs[0].run_dir(), records.RECORD_NAME))
    rows = [(r["run_key"], r["status"]) for r in manifest_rows(configs[0])]
    assert rows == [(configs[0].run_key(), "failed"), (configs[1].run_key(), "ok")]
    assert manifest_rows(configs[0])[0]["error"] == "was killed by SIGKILL"


@pytest.mark.slow
def test_workers_of_a_torchrun_killed_by_hand_die_with_it(tmp_path):
    from runners.command import launch_env, torchrun_command

    cfg = tiny(tmp_path, steps=4000)
    p = subprocess.Popen(torchrun_command(cfg), env=launch_env(cfg), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        steps = os.path.join(cfg.run_dir(), records.STEPS_NAME)
        deadline = time.monotonic() + 90
        while not os.path.exists(steps) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(processes_mentioning(str(tmp_path))) == 3  # torchrun and its two workers
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
    deadline = time.monotonic() + 10
    while processes_mentioning(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_mentioning(str(tmp_path))
    assert not os.path.exists(os.path.join(cfg.run_dir(), records.RECORD_NAME))


CONCURRENT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from runhelp import tiny
    from runners.sweep import run_sweep
    configs = [tiny({out!r}, steps=60, seed=i) for i in range(3)]
    res = run_sweep(configs, progress=False, rerun_disturbed=False, timeout_s=120)
    print("RESULT", len(res.records), res.skipped, len(res.failures), flush=True)
""")


@pytest.mark.slow
def test_two_concurrent_sweeps_run_each_run_once(tmp_path):
    script = CONCURRENT.format(root=ROOT, tests=os.path.join(ROOT, "tests"), out=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all("RESULT 3" in o for o in outs), outs
    configs = [tiny(tmp_path, steps=60, seed=i) for i in range(3)]
    rows = manifest_rows(configs[0])
    assert sorted(r["run_key"] for r in rows) == sorted(c.run_key() for c in configs)  # one row per run
    assert {r["status"] for r in rows} == {"ok"}
    for c in configs:
        assert load.load_steps(c.run_dir()).step.tolist() == list(range(60))  # no interleaved rows


def test_code_change_changes_the_run_key(tmp_path):
    import shutil

    for name in ("kanlib", "runners"):
        shutil.copytree(os.path.join(ROOT, name), tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))

    def key() -> str:
        code = ("from kanlib.config import RunConfig; from kanlib.runkey import code_version; "
                "print(code_version(), RunConfig().run_key())")
        env = {k: v for k, v in os.environ.items() if k != "KANLIB_CODE_VERSION"}
        return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                              text=True, check=True).stdout.split()

    first = key()
    for analysis in ("analysis/style.py", "studies/strong_scaling.py", "report.py"):  # measurements unchanged
        with open(tmp_path / "kanlib" / analysis, "a") as f:
            f.write("\n# a comment\n")
    assert key() == first
    with open(tmp_path / "kanlib" / "train.py", "a") as f:  # an uncommitted edit of what a run executes
        f.write("\n# a comment\n")
    second = key()
    assert second[0] != first[0] and second[1] != first[1]


@pytest.mark.slow
def test_rewritten_data_file_is_run_again_not_reused(tmp_path):
    """Issue 23: a sweep over ``task=file`` skipped its run after the file was rewritten with other values (the
    run key covered the path only); the key and the record now carry the file's content hash."""
    import numpy as np

    data = tmp_path / "d.csv"

    def write(seed):
        rng = np.random.default_rng(seed)
        x = rng.uniform(-1, 1, (300, 2))
        rows = "\n".join(f"{a:.6f},{b:.6f},{np.sin(a) * b:.6f}" for a, b in x)
        data.write_text("a,b,y\n" + rows + "\n")

    write(1)
    cfg = tiny(tmp_path, task="file", data_path=str(data), widths=(2, 4, 1), nproc_per_node=1, steps=6,
               n_train=200, n_val=50, global_batch=32)
    first = run_sweep([cfg], progress=False, rerun_disturbed=False, timeout_s=120)
    rec1 = first.records[-1]
    size = data.stat().st_size
    write(2)  # other values (the same number of rows)
    assert cfg.run_key() != rec1["run_key"]
    again = run_sweep([cfg], progress=False, rerun_disturbed=False, timeout_s=120)
    assert again.skipped == 0
    rec2 = again.records[-1]
    assert rec2["run_id"] != rec1["run_id"] and rec2["data_sha256"] != rec1["data_sha256"]
    assert rec1["data_sha256"] and len(rec1["data_sha256"]) == 16 and size > 0
    assert run_sweep([cfg], progress=False, rerun_disturbed=False, timeout_s=120).skipped == 1  # unchanged: reused


def test_a_torch_upgrade_changes_the_run_key(monkeypatch):
    """Issue 23: after a torch upgrade a sweep reused the old records (the key did not cover the torch version)."""
    from kanlib import runkey
    from kanlib.config import RunConfig

    import torch

    assert runkey.torch_version() == torch.__version__  # the version a run's record states
    cfg = RunConfig()
    before = cfg.run_key()
    monkeypatch.setattr(runkey, "torch_version", lambda: "9.9.9+cpu")
    assert cfg.run_key() != before


@pytest.mark.parametrize("timeout_s", [0, -1, float("nan"), "60"])
def test_a_deadline_that_is_not_positive_is_refused_before_anything_runs(tmp_path, timeout_s):
    """Issue 23: timeout_s of 0 or -1 was accepted and gave an instant timeout row."""
    from kanlib.config import ConfigError
    from runners.launch import run

    cfg = tiny(tmp_path)
    with pytest.raises(ConfigError, match="^timeout_s: a run's deadline must be a positive number"):
        run_sweep([cfg], progress=False, timeout_s=timeout_s)
    with pytest.raises(ConfigError, match="^timeout_s: "):
        run(cfg, echo=False, timeout_s=timeout_s)
    assert not os.path.exists(os.path.join(tmp_path, cfg.study))


# -- disturbed runs run again: nothing lost, nothing run twice (issue 34) ------------------------------------------
def flag_first_attempts(monkeypatch, cfgs) -> None:
    """Make the first complete attempt of each of ``cfgs`` count as disturbed, whatever the machine did, and every
    rerun (a record naming ``earlier_attempts``) quiet: the sweep's handling is tested here, not the counters."""
    keys = {c.run_key() for c in cfgs}
    monkeypatch.setattr(disturbance, "disturbance", lambda rec: "flagged by the test" if rec.get("run_key") in keys
                        and not rec.get("earlier_attempts") else "")


def rows_of(cfg) -> list[tuple[str, str]]:
    return [r["status"] for r in manifest_rows(cfg) if r["run_key"] == cfg.run_key()]


@pytest.mark.slow
def test_a_rerun_killed_at_its_start_keeps_the_disturbed_record_as_the_runs_record(tmp_path, monkeypatch):
    """Issue 34, item 1: the rerun of a disturbed run moved its only complete record into attempts/ before it
    started; a rerun that failed (its worker SIGKILLed at its first step) left the run with no record at all."""
    cfg = tiny(tmp_path, nproc_per_node=1, steps=10)
    flag_first_attempts(monkeypatch, [cfg])
    aside = manifest.set_aside

    def set_aside_then_arm_a_kill(run_dir):  # the rerun's fresh launch inherits the fault; the first attempt did not
        monkeypatch.setenv("KANLIB_FAULT", f"kill@0:0#{cfg.run_key()[-10:]}")
        return aside(run_dir)

    monkeypatch.setattr(manifest, "set_aside", set_aside_then_arm_a_kill)
    res = run_sweep([cfg], progress=False, timeout_s=120, keep_groups=False)
    assert res.ok and res.rerun == 1 and res.disturbed == 1, res
    [(failed_cfg, why)] = res.rerun_failures
    assert failed_cfg is cfg and why.startswith("failed: ") and "SIGKILL" in why, why
    [rec] = res.records
    assert rows_of(cfg) == ["ok", "disturbed", "failed"]
    # the earlier complete attempt is the run's record again, with its own steps; nothing is pending
    on_disk = records.read_record(os.path.join(cfg.run_dir(), records.RECORD_NAME))
    assert on_disk["run_id"] == rec["run_id"] and not on_disk.get("earlier_attempts")
    assert load.load_steps(cfg.run_dir()).step.tolist() == list(range(10))
    assert not os.path.exists(os.path.join(cfg.run_dir(), manifest.ATTEMPTS_DIR, manifest.RERUN_MARK))
    # the analysis finds it (and leaves it out as disturbed only by its policy)
    assert load.load_records(str(tmp_path), disturbed="keep").run_id.tolist() == [rec["run_id"]]
    # which row is the run's: its last ok row of the record's launch, here the first attempt's
    rows = manifest_rows(cfg)
    assert manifest.row_of_record(rows, on_disk) is rows[0] or manifest.row_of_record(rows, on_disk) == rows[0]


KILLED_AFTER_SET_ASIDE = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from kanlib import disturbance, manifest
    from runhelp import tiny
    from runners.sweep import run_sweep
    cfg = tiny({out!r}, nproc_per_node=1, steps=10)
    disturbance.disturbance = lambda rec: "flagged by the test" if not rec.get("earlier_attempts") else ""
    aside = manifest.set_aside
    def set_aside_then_die(run_dir):
        aside(run_dir)
        os.kill(os.getpid(), signal.SIGKILL)  # the sweep dies between the set-aside and the rerun
    manifest.set_aside = set_aside_then_die
    run_sweep([cfg], progress=False, timeout_s=120)
""")


@pytest.mark.slow
def test_a_sweep_killed_between_set_aside_and_rerun_loses_nothing_and_the_next_reruns_it_once(tmp_path, monkeypatch):
    """Issue 34, items 1 and 4: a sweep killed after setting a disturbed record aside left the run without a record;
    a resumed sweep must find the record in place and run it again, once."""
    script = KILLED_AFTER_SET_ASIDE.format(root=ROOT, tests=os.path.join(ROOT, "tests"), out=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    cfg = tiny(tmp_path, nproc_per_node=1, steps=10)
    first = records.read_record(os.path.join(cfg.run_dir(), records.RECORD_NAME))  # still the run's record
    assert load.load_records(str(tmp_path), disturbed="keep").run_id.tolist() == [first["run_id"]]
    assert rows_of(cfg) == ["ok"]
    flag_first_attempts(monkeypatch, [cfg])
    res = run_sweep([cfg], progress=False, timeout_s=120)
    assert res.ok and res.skipped == 1 and res.rerun == 1 and res.disturbed == 0, res
    [rec] = res.records
    assert [a["run_id"] for a in rec["earlier_attempts"]] == [first["run_id"]]
    assert rows_of(cfg) == ["ok", "disturbed", "ok"]
    assert not os.path.exists(os.path.join(cfg.run_dir(), manifest.ATTEMPTS_DIR, manifest.RERUN_MARK))
    again = run_sweep([cfg], progress=False, timeout_s=120)  # a rerun is not run again
    assert again.skipped == 1 and again.rerun == 0 and again.launches == 0
    assert rows_of(cfg) == ["ok", "disturbed", "ok"]


@pytest.mark.slow
def test_a_resumed_sweep_reruns_a_disturbed_record_an_earlier_sweep_left_once(tmp_path, monkeypatch):
    """Issue 34, item 4: skip_done took any valid record as done, so a disturbed run an interrupted (or
    rerun_disturbed=False) sweep finished was never run again and stayed out of every analysis."""
    cfgs = [tiny(tmp_path, nproc_per_node=1, steps=10, seed=s) for s in (1, 2)]
    flag_first_attempts(monkeypatch, cfgs[:1])
    first = run_sweep(cfgs, progress=False, timeout_s=120, rerun_disturbed=False)
    assert first.ok and first.disturbed == 1 and first.rerun == 0
    res = run_sweep(cfgs, progress=False, timeout_s=120)
    assert res.ok and res.skipped == 2 and res.rerun == 1 and res.disturbed == 0, res
    rec = {r["run_key"]: r for r in res.records}[cfgs[0].run_key()]
    assert len(rec["earlier_attempts"]) == 1
    assert rows_of(cfgs[0]) == ["ok", "disturbed", "ok"] and rows_of(cfgs[1]) == ["ok"]
    # which row is the run's: the last ok row (the rerun's launch), not the set-aside attempt's
    rows = manifest_rows(cfgs[0])
    mine = [r for r in rows if r["run_key"] == cfgs[0].run_key()]
    assert manifest.row_of_record(rows, rec)["launch_id"] == mine[-1]["launch_id"] != mine[0]["launch_id"]
    assert run_sweep(cfgs, progress=False, timeout_s=120).rerun == 0  # once
    assert rows_of(cfgs[0]) == ["ok", "disturbed", "ok"]


OTHER_SWEEP = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from runhelp import tiny
    from runners.launch import run
    rec = run(tiny({out!r}, nproc_per_node=1, steps=10), echo=False, timeout_s=120)  # runs the point again
    print("RESULT", rec["run_id"], flush=True)
""")


@pytest.mark.slow
def test_a_sweep_holding_a_stale_disturbed_record_leaves_another_sweeps_fresh_record_alone(tmp_path, monkeypatch):
    """Issue 34, item 3: sweep B decided to rerun from the record it held in memory; another sweep had run the
    point again meanwhile (here: runners.launch.run), and B moved that fresh record into attempts/, labelled it disturbed and ran a third time."""
    cfg = tiny(tmp_path, nproc_per_node=1, steps=10)
    script = OTHER_SWEEP.format(root=ROOT, tests=os.path.join(ROOT, "tests"), out=str(tmp_path))
    seen: dict = {}

    def flagged(rec):
        # B's own first record is disturbed; the first time B judges it, another sweep runs the point again
        seen.setdefault("first", rec.get("run_id"))
        if rec.get("run_id") != seen["first"]:
            return ""
        if "other" not in seen:
            seen["other"] = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                           timeout=300).stdout
        return "flagged by the test"

    monkeypatch.setattr(disturbance, "disturbance", flagged)
    res = run_sweep([cfg], progress=False, timeout_s=120)
    on_disk = records.read_record(os.path.join(cfg.run_dir(), records.RECORD_NAME))
    assert f"RESULT {on_disk['run_id']}" in seen["other"] and on_disk["run_id"] != seen["first"], seen
    assert res.ok and res.rerun == 0 and [r["run_id"] for r in res.records] == [on_disk["run_id"]], res
    assert rows_of(cfg) == ["ok", "ok"]  # no disturbed row for the other sweep's attempt, no third run
    assert not os.path.isdir(os.path.join(cfg.run_dir(), manifest.ATTEMPTS_DIR))


def test_a_full_disk_when_writing_a_plan_stops_the_sweep_with_a_message_and_its_row(tmp_path, monkeypatch):
    """Issue 34, item 12: a full disk in write_plan ended the sweep in a traceback, with no sweeps.jsonl row."""
    import errno

    from kanlib import worker
    from runners.sweep import SweepStopped

    def full(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(worker, "write_plan", full)
    cfgs = [tiny(tmp_path, seed=s) for s in (1, 2)]
    with pytest.raises(SweepStopped, match=r"^sweep stopped: OSError: \[Errno 28\] No space left on device: '.*plan"
                                           r"\.json'; 0 of 2 runs have a record, 0 failed, the others did not run\. "
                                           r"Nothing written before was lost"):
        run_sweep(cfgs, progress=False, timeout_s=120)
    [row] = manifest.read_jsonl(os.path.join(str(tmp_path), cfgs[0].study, records.SWEEPS_NAME))
    assert row["n_runs"] == 2 and row["n_ok"] == 0 and row["n_failed"] == 0 and row["n_launches"] == 0
    for cfg in cfgs:  # no lock left held: a rerun takes them at once
        lock = manifest.RunLock(cfg.run_dir())
        assert lock.acquire(wait=False)
        lock.release()


def test_a_sweep_on_a_really_full_disk_stops_with_a_message(full_disk):
    from conftest import fill_disk
    from runners.sweep import SweepStopped

    cfg = tiny(full_disk)
    fill_disk(full_disk)
    with pytest.raises(SweepStopped, match=r"^sweep stopped: OSError: .*0 of 1 runs have a record"):
        run_sweep([cfg], progress=False, timeout_s=120)


SLOW_START = textwrap.dedent("""
    # A worker group's processes start slowly (the sweep is interrupted while they do); nothing else changes.
    import time
    with open("/proc/self/cmdline", "rb") as f:
        if b"kanlib.worker" in f.read():
            time.sleep(30)
""")


@pytest.mark.slow
def test_a_sweep_interrupted_while_its_launch_starts_records_the_run_preempted_not_failed(tmp_path):
    """Issue 34, item 12: SIGTERM to a sweep during a launch's start-up recorded the run that never began as
    failed."""
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(SLOW_START)
    script = SWEEP_SCRIPT.format(root=ROOT, tests=os.path.join(ROOT, "tests"), out=str(tmp_path / "out"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(slow), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        from runners.supervisor import descendants

        def workers() -> bool:
            for p in descendants(proc.pid):
                try:
                    with open(f"/proc/{p}/cmdline", "rb") as f:
                        if b"kanlib.worker" in f.read():
                            return True
                except OSError:
                    pass
            return False

        deadline = time.monotonic() + 90
        while not workers() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert workers(), "the sweep never started its launch"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    cfg = tiny(tmp_path / "out", steps=10, seed=0, checkpoint_every=5)
    [row] = manifest_rows(cfg)
    assert (row["run_key"], row["status"]) == (cfg.run_key(), "preempted"), row
    assert row["error"] == "the runner was interrupted (SweepInterrupted) before the run began"
