"""The one supervisor every launcher shares: outcomes, manifest rows, the deadline, interruption, retries and
the run-folder lock, with fake jobs (no processes) so each rule is checked exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kanlib import manifest, records
from kanlib.config import RunConfig
from kanlib.manifest import RunLock
from runners.supervisor import Job, RunFailed, error_line, supervise

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cfg_for(tmp_path, **kw) -> RunConfig:
    return RunConfig(study="sup", out_dir=str(tmp_path), nproc_per_node=2, global_batch=64, **kw)


def write_record(cfg, run_id: str = "new") -> None:
    records.atomic_write_json(os.path.join(cfg.run_dir(), records.RECORD_NAME),
                              {"schema_version": 2, "run_id": run_id, "step_time_s": 0.01, "world_size": 2,
                               "global_batch": 64, "status": "ok"})


class FakeJob(Job):
    """Writes ``lines`` to its log, then ends with ``code`` after ``polls`` polls, doing ``effect`` first."""

    def __init__(self, cfg, code=0, polls=2, lines=(), effect=None, retry_first=False):
        self.cfg, self.code, self.polls, self.lines, self.effect = cfg, code, polls, lines, effect
        self.retry_first, self.starts, self.cancelled = retry_first, 0, []
        self.log = os.path.join(cfg.run_dir(), "launch.log")
        self.n = 0

    def start(self):
        self.starts += 1
        self.n = 0
        with open(self.log, "a") as f:
            f.writelines(line + "\n" for line in self.lines)

    def poll(self):
        self.n += 1
        if self.n < self.polls:
            return None
        if self.effect:
            self.effect(self)
        return self.code

    def cancel(self, grace_s):
        self.cancelled.append(grace_s)

    def log_paths(self):
        return [self.log]

    def retry(self, text):
        return self.retry_first and self.starts == 1


def rows(cfg):
    r, bad = manifest.read_manifest_rows(manifest.manifest_path(cfg.out_dir, cfg.study))
    assert not bad
    return r


def test_ok_needs_a_fresh_valid_record(tmp_path):
    cfg = cfg_for(tmp_path)
    rec = supervise(cfg, FakeJob(cfg, effect=lambda j: write_record(cfg)), echo=False)
    assert rec["run_id"] == "new"
    [row] = rows(cfg)
    assert row["status"] == "ok" and row["exit_code"] == 0 and row["placement"] == "1x2" and row["pid"] == os.getpid()
    # exit 0 again, but the record is the old one: not a success of this attempt
    with pytest.raises(RunFailed, match="exited 0 but wrote no new record") as e:
        supervise(cfg, FakeJob(cfg), echo=False)
    assert e.value.status == "failed" and rows(cfg)[-1]["status"] == "failed"


def test_a_signal_and_the_root_cause_are_named(tmp_path):
    cfg = cfg_for(tmp_path)
    with pytest.raises(RunFailed) as e:
        supervise(cfg, FakeJob(cfg, code=-9), echo=False)
    assert e.value.error == "was killed by SIGKILL" and rows(cfg)[-1]["error"] == "was killed by SIGKILL"
    lines = ["[rank1]: Traceback (most recent call last):", "[rank1]: ValueError: the real cause",
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", "Root Cause (first observed failure):",
             "[0]:", "  rank      : 1 (local_rank: 1)", "  exitcode  : 1 (pid: 7)"]
    with pytest.raises(RunFailed) as e:
        supervise(cfg, FakeJob(cfg, code=1, lines=lines), echo=False)
    assert e.value.error == "ValueError: the real cause"
    assert "[rank1]: ValueError: the real cause" in e.value.log_tail


def test_deadline_cancels_and_records_timeout(tmp_path):
    cfg = cfg_for(tmp_path)
    job = FakeJob(cfg, polls=10**9)
    t0 = time.monotonic()
    with pytest.raises(RunFailed, match="passed its deadline of 0.3 s") as e:
        supervise(cfg, job, timeout_s=0.3, echo=False)
    assert time.monotonic() - t0 < 5 and job.cancelled and e.value.returncode is None
    row = rows(cfg)[-1]
    assert row["status"] == "timeout" and row["exit_code"] is None


def test_interrupted_runner_records_what_the_run_left(tmp_path):
    cfg = cfg_for(tmp_path)

    def interrupt_after_record(job):
        write_record(cfg, "finished-just-before-ctrl-c")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        supervise(cfg, FakeJob(cfg, effect=interrupt_after_record), echo=False)
    assert rows(cfg)[-1]["status"] == "ok"  # the run had written its record: it is not a failure

    def interrupt_after_checkpoint(job):
        records.atomic_write_json(os.path.join(cfg.run_dir(), records.PREEMPTED_NAME), {"step": 3})
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        supervise(cfg, FakeJob(cfg, effect=interrupt_after_checkpoint), echo=False)
    assert rows(cfg)[-1]["status"] == "preempted"

    with pytest.raises(KeyboardInterrupt):
        supervise(cfg, FakeJob(cfg, effect=lambda j: (_ for _ in ()).throw(KeyboardInterrupt)), echo=False)
    assert rows(cfg)[-1]["status"] == "failed" and "without a checkpoint" in rows(cfg)[-1]["error"]


def test_retry_relaunches_within_one_attempt_row(tmp_path):
    cfg = cfg_for(tmp_path)

    def second_succeeds(job):
        if job.starts == 2:
            write_record(cfg)

    job = FakeJob(cfg, code=0, effect=second_succeeds, retry_first=True)
    job.code = 0
    supervise(cfg, job, retries=2, echo=False)
    assert job.starts == 2 and [r["status"] for r in rows(cfg)] == ["ok"]


def test_run_lock_is_exclusive_and_dies_with_its_owner(tmp_path):
    cfg = cfg_for(tmp_path)
    os.makedirs(cfg.run_dir())
    a, b = RunLock(cfg.run_dir()), RunLock(cfg.run_dir())
    assert a.acquire(wait=False)
    assert not b.acquire(wait=False)
    assert f"pid {os.getpid()}" in b.holder()
    a.release()
    assert b.acquire(wait=False)
    b.release()
    # a process holding the lock is SIGKILLed: the lock is free at once, no stale lock
    code = (f"import sys, time; sys.path.insert(0, {ROOT!r}); from kanlib.manifest import RunLock; "
            f"RunLock({cfg.run_dir()!r}).acquire(); print('held', flush=True); time.sleep(600)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        assert not RunLock(cfg.run_dir()).acquire(wait=False)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        assert RunLock(cfg.run_dir()).acquire(wait=False)
    finally:
        p.kill()


def test_a_lock_taken_on_a_full_disk_is_released_and_a_waiting_sweep_says_who_holds_it(full_disk, capfd):
    """Issue 23: ``acquire`` kept the locked file open when writing the holder failed with ENOSPC, so a rerun in the
    same process (a notebook kernel) waited on its own lock forever, silently (sweeps pass echo=False)."""
    from conftest import fill_disk

    run_dir = full_disk / "run"
    run_dir.mkdir()
    fill_disk(full_disk)
    with pytest.raises(OSError):
        RunLock(str(run_dir)).acquire(wait=False)
    os.remove(full_disk / "filler")
    again = RunLock(str(run_dir))
    assert again.acquire(wait=False)  # the failed attempt holds nothing
    code = (f"import sys, time; sys.path.insert(0, {ROOT!r}); from kanlib.manifest import RunLock; "
            f"RunLock({str(run_dir)!r}).acquire(); print('held', flush=True); time.sleep(1.5)")
    again.release()
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        waiter = RunLock(str(run_dir))
        assert waiter.acquire(wait=True, echo=False, poll_s=0.1)  # as a sweep that streams nothing waits
        waiter.release()
    finally:
        p.wait(timeout=10)
    assert f"kanlib: {run_dir} is being run by pid {p.pid} on " in capfd.readouterr().err


def test_a_waiting_runner_skips_what_the_holder_completed(tmp_path):
    cfg = cfg_for(tmp_path)
    os.makedirs(cfg.run_dir())
    code = (f"import sys, time, json, os; sys.path.insert(0, {ROOT!r}); from kanlib.manifest import RunLock; "
            f"from kanlib import records; l = RunLock({cfg.run_dir()!r}); l.acquire(); print('held', flush=True); "
            f"time.sleep(1.0); records.atomic_write_json(os.path.join({cfg.run_dir()!r}, 'record.json'), "
            f"dict(schema_version=2, run_id='other', step_time_s=0.01, world_size=2, global_batch=64, status='ok'))")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        job = FakeJob(cfg)
        import io

        out = io.StringIO()
        rec = supervise(cfg, job, echo=out)
        assert rec["run_id"] == "other" and job.starts == 0  # waited, then did not run it again
        assert "is being run by pid" in out.getvalue()
        assert rows(cfg) == []
    finally:
        p.wait(timeout=10)


def test_error_line_prefers_the_root_cause_rank():
    log = ("[rank0]: RuntimeError: peer went away\n[rank1]: KeyError: 'x'\n"
           "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 5)\n")
    assert error_line(log) == "KeyError: 'x'"
    assert error_line("Root Cause\n  rank      : 3\n  exitcode  : -9 (pid: 1)\n") == "rank 3 was killed by SIGKILL"
    assert error_line("nothing here") == ""
