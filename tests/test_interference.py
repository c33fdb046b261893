"""An instrument that knows when the machine was busy: a CPU hog pinned to one of a sweep's CPUs during one run
flags that run, the sweep keeps its record and runs it again at the end of its round. Real processes. Nothing here
assumes the machine is otherwise quiet: the machine itself may flag any other run (and its rerun), and the tests
hold either way."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from kanlib import manifest
from kanlib.disturbance import disturbance
from kanlib.metrics import InterferenceProbe, combine_interference
from runhelp import manifest_rows, tiny
from runners.sweep import run_sweep

pytestmark = pytest.mark.usefixtures("no_process_left")


class HogDuring(threading.Thread):
    """Runs a busy loop pinned to ``cpu`` from the first ``begin`` of run ``key`` in the sweep's launch events to
    its first ``end`` (a rerun of the run later does not meet it)."""

    def __init__(self, out_dir: str, study: str, key: str, cpu: int):
        super().__init__(daemon=True)
        self.pattern = os.path.join(out_dir, study, "launches", "*", "events.jsonl")
        self.key, self.cpu = key, cpu
        self.hog: subprocess.Popen | None = None
        self.ran_s = 0.0
        self.done = threading.Event()

    def _seen(self, what: str) -> bool:
        return any(e.get("run_key") == self.key and e.get("event") == what
                   for path in glob.glob(self.pattern) for e in manifest.read_events(path))

    def run(self) -> None:
        while not self._seen("begin") and not self.done.is_set():
            time.sleep(0.01)
        t0 = time.monotonic()
        self.hog = subprocess.Popen(["taskset", "-c", str(self.cpu), sys.executable, "-c", "while True: pass"])
        while not self._seen("end") and not self.done.is_set():
            time.sleep(0.01)
        self.hog.kill()
        self.hog.wait()
        self.ran_s = time.monotonic() - t0

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=30)
        if self.hog is not None and self.hog.poll() is None:
            self.hog.kill()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2, reason="needs taskset, 2 CPUs")
def test_a_cpu_hog_during_one_run_flags_it_and_the_sweep_runs_it_again_after_its_round(tmp_path):
    # three 2-process runs of ~1.5 s of measured steps each; a busy loop on CPU 1 during the second only
    cfgs = [tiny(tmp_path, seed=s, steps=300, warmup_steps=5) for s in (1, 2, 3)]
    hog = HogDuring(str(tmp_path), cfgs[1].study, cfgs[1].run_key(), cpu=1)
    hog.start()
    try:
        res = run_sweep(cfgs, progress=False, timeout_s=120)
    finally:
        hog.stop()
    assert res.ok and hog.ran_s > 0.5
    recs = {r["run_key"]: r for r in res.records}
    before, hit, after = (recs[c.run_key()] for c in cfgs)
    # the run the hog overlapped was flagged (a whole CPU of two: ~50%; a busier machine only adds to it), its
    # record kept, and the run made once more: exactly one earlier attempt, whatever the rerun met
    [first] = hit["earlier_attempts"]
    assert "other processes took" in first["disturbed"] and first["foreign_cpu_frac"] > 0.3, first
    assert os.path.exists(os.path.join(cfgs[1].run_dir(), manifest.ATTEMPTS_DIR, f"{first['run_id']}.json"))
    # The machine itself may flag any run (CI's shared VM took over 10% of a run's CPUs; a 2-core VM with a 15%
    # bursty load flagged a run beside the hog's and its rerun too): a run beside the hog's is run again exactly
    # when its first record was flagged, and at most once.
    for rec in (before, after):
        earlier = rec.get("earlier_attempts") or []
        assert len(earlier) <= 1 and all(a["disturbed"] for a in earlier), rec
    # every run ends with an ok row; the hog's run has its disturbed row, then its rerun's ok row
    rows = [(r["run_key"], r["status"]) for r in manifest_rows(cfgs[0])]
    assert rows[:3] == [(cfgs[0].run_key(), "ok"), (cfgs[1].run_key(), "ok"), (cfgs[2].run_key(), "ok")]
    assert [st for k, st in rows[3:] if k == cfgs[1].run_key()] == ["disturbed", "ok"], rows
    # at the end of its round: the rerun begins after every run of the round has ended
    events = sorted((e for path in glob.glob(hog.pattern) for e in manifest.read_events(path)),
                    key=lambda e: e["at"])
    begins = [e["at"] for e in events if e["event"] == "begin" and e["run_key"] == cfgs[1].run_key()]
    assert len(begins) == 2, events
    first_ends = [min(e["at"] for e in events if e["event"] == "end" and e["run_key"] == c.run_key()) for c in cfgs]
    assert begins[1] > max(first_ends), events
    # the sweep's counts say what the records say
    assert res.rerun == 1 + sum(1 for r in (before, after) if r.get("earlier_attempts"))
    assert res.disturbed == sum(1 for r in (before, hit, after) if disturbance(r))
    if res.rerun > 1 or res.disturbed:
        print(f"the machine itself disturbed {res.rerun - 1} run(s) besides the hog's; "
              f"{res.disturbed} still after rerun")


def test_interference_of_overlapping_cpu_sets_counts_every_rank_as_its_own():
    """Two unpinned ranks on the same two CPUs: each other's CPU time is not 'other processes'."""
    host = {"host": "h", "window_s": 1.0, "cpus": [0, 1], "steal_s": {0: 0.0, 1: 0.0}, "nivcsw": 3,
            "load_start": 1.0, "load_end": 1.0}
    a = {**host, "busy_s": {0: 1.0, 1: 0.9}, "own_cpu_s": 0.95, "main_wait_s": 0.01}
    b = {**host, "busy_s": {0: 1.0, 1: 0.9}, "own_cpu_s": 0.9, "main_wait_s": 0.02}
    out = combine_interference([a, b])
    assert out["foreign_cpu_frac"] == pytest.approx((1.9 - 1.85) / 2.0)
    assert out["runqueue_wait_frac"] == pytest.approx(0.02)
    # pinned ranks on CPUs of their own are judged one by one: the busier CPU decides
    c = {**host, "cpus": [0], "busy_s": {0: 1.0}, "steal_s": {0: 0.0}, "own_cpu_s": 0.5, "main_wait_s": 0.0}
    d = {**host, "cpus": [1], "busy_s": {1: 1.0}, "steal_s": {1: 0.0}, "own_cpu_s": 0.98, "main_wait_s": 0.0}
    assert combine_interference([c, d])["foreign_cpu_frac"] == pytest.approx(0.5)
    # unreadable counters are unknown, not zero
    assert combine_interference([{**c, "own_cpu_s": None}])["foreign_cpu_frac"] is None
    assert combine_interference([{**c, "own_cpu_s": None}])["foreign_wait_frac"] is None


def test_a_wait_counts_only_as_far_as_other_processes_ran_on_the_ranks_cpu():
    """A pinned rank's training thread waits behind its own threads (gloo's) and behind other processes: only as
    much as other processes ran on its one CPU is theirs; on a shared set of CPUs all of theirs may be."""
    host = {"host": "h", "window_s": 1.0, "steal_s": {0: 0.0, 1: 0.0}, "nivcsw": 3, "load_start": 1.0, "load_end": 1.0}
    # a quiet VM's background: 6% of each CPU to other processes, waits of 15% behind gloo's threads
    a = {**host, "cpus": [0], "busy_s": {0: 1.0}, "own_cpu_s": 0.94, "main_wait_s": 0.15}
    b = {**host, "cpus": [1], "busy_s": {1: 1.0}, "own_cpu_s": 0.94, "main_wait_s": 0.12}
    quiet = combine_interference([a, b])
    assert quiet["foreign_wait_frac"] == pytest.approx(0.06) and quiet["runqueue_wait_frac"] == pytest.approx(0.15)
    rec = {**quiet, "world_size": 2, "threads": 1}
    assert disturbance(rec) == ""
    # the old bound (twice foreign_cpu_frac, records without the field) flagged it
    assert "waited for a CPU 15%" in disturbance({**rec, "foreign_wait_frac": None})
    # a busy loop on CPU 1 takes half of it, and rank 1 waits for it
    hog = combine_interference([a, {**b, "own_cpu_s": 0.5, "main_wait_s": 0.45}])
    assert hog["foreign_wait_frac"] == pytest.approx(0.45) and hog["foreign_cpu_frac"] == pytest.approx(0.5)
    assert "other processes took 50%" in disturbance({**hog, "world_size": 2, "threads": 1})
    # unpinned ranks on two CPUs: the other processes' 0.12 CPU-s may all have been on the CPU one waited for
    u = {**host, "cpus": [0, 1], "busy_s": {0: 1.0, 1: 1.0}}
    shared = combine_interference([{**u, "own_cpu_s": 0.94, "main_wait_s": 0.15},
                                   {**u, "own_cpu_s": 0.94, "main_wait_s": 0.05}])
    assert shared["foreign_cpu_frac"] == pytest.approx(0.06) and shared["foreign_wait_frac"] == pytest.approx(0.12)
    assert "waited for a CPU 15%" in disturbance({**shared, "world_size": 2, "threads": 1})


def test_a_busy_loop_on_this_process_cpus_shows_as_foreign_time():
    """The probe itself, against a real busy process sharing this process's one CPU."""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    os.sched_setaffinity(0, {cpu})
    try:
        probe = InterferenceProbe()
        hog = subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.3)
            probe.start()
            end = time.monotonic() + 1.0
            while time.monotonic() < end:  # this process wants the CPU too
                pass
            out = combine_interference([probe.stop()])
        finally:
            hog.kill()
            hog.wait()
    finally:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    assert out["foreign_cpu_frac"] > 0.25 and out["runqueue_wait_frac"] > 0.25, out
