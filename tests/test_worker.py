"""Worker groups: one launch runs many runs (kanlib.worker, runners/group.py), each as independent as in a process
of its own, faults contained to the run that has them, rounds ordered, peak memory per run. Real processes."""

from __future__ import annotations

import csv
import os

import pytest
import torch

from kanlib import records
from runhelp import final_params, manifest_rows, tiny
from kanlib.manifest import read_jsonl
from runners.sweep import run_sweep

pytestmark = [pytest.mark.usefixtures("no_process_left"), pytest.mark.slow]


def launches(cfg) -> list[dict]:
    return read_jsonl(os.path.join(cfg.out_dir, cfg.study, records.LAUNCHES_NAME))


def losses(cfg) -> list[str]:
    """The per-step training losses as written (text: equal text is equal bits)."""
    with open(os.path.join(cfg.run_dir(), records.STEPS_NAME), newline="") as f:
        return [row["loss"] for row in csv.DictReader(f)]


def test_a_run_in_a_reused_group_equals_a_run_in_a_fresh_process(tmp_path):
    # the compiled default kernel: the second run of the group reuses what the first traced
    kw = dict(nproc_per_node=1, kan_impl="compiled", steps=12)
    first, second = tiny(tmp_path / "group", seed=1, **kw), tiny(tmp_path / "group", seed=2, lr=3e-3, **kw)
    res = run_sweep([first, second], progress=False, rerun_disturbed=False, timeout_s=300)
    assert res.ok and res.launches == 1
    by_key = {r["run_key"]: r for r in res.records}
    alone = tiny(tmp_path / "alone", seed=2, lr=3e-3, **kw)
    solo = run_sweep([alone], progress=False, rerun_disturbed=False, timeout_s=300).records[0]
    grouped = by_key[second.run_key()]
    assert grouped["runs_before_in_launch"] == 1 and solo["runs_before_in_launch"] == 0
    assert grouped["launch_id"] == by_key[first.run_key()]["launch_id"] != solo["launch_id"]
    assert grouped["kan_path"] == solo["kan_path"] == "compiled"
    assert grouped["compile_s"] == 0.0 < by_key[first.run_key()]["compile_s"]  # traced once per shape per group
    assert losses(second) == losses(alone)  # to the bit
    a, b = final_params(second), final_params(alone)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("fault", ["raise@0:3", "kill@1:3", "hang@1:3"])
def test_a_failing_run_fails_alone_and_a_fresh_group_carries_on(tmp_path, monkeypatch, fault):
    a, b, c = (tiny(tmp_path, seed=s, steps=10) for s in (1, 2, 3))
    marker = b.run_key()[-10:]
    monkeypatch.setenv("KANLIB_FAULT", f"{fault}#{marker}")
    res = run_sweep([a, b, c], progress=False, rerun_disturbed=False, timeout_s=120)
    assert [cfg.run_key() for cfg, _ in res.failures] == [b.run_key()]
    why = res.failures[0][1]
    expected = {"raise": "InjectedFault", "kill": "killed by SIGKILL", "hang": "Timed out"}[fault.split("@")[0]]
    assert why.startswith("failed: ") and expected.lower() in why.lower(), why
    assert [(r["run_key"], r["status"]) for r in manifest_rows(a)] == [
        (a.run_key(), "ok"), (b.run_key(), "failed"), (c.run_key(), "ok")]
    recs = {r["run_key"]: r for r in res.records}
    assert recs[a.run_key()]["launch_id"] != recs[c.run_key()]["launch_id"]
    assert recs[c.run_key()]["runs_before_in_launch"] == 0  # a fresh group
    rows = launches(a)
    assert len(rows) == 2 and rows[0]["n_began"] == 2 and rows[0]["exit_code"] not in (0, None)
    # the failed run's own log holds its error, and none of the runs after it
    log = open(os.path.join(b.run_dir(), "launch.log")).read()
    assert f"kanlib: run {b.run_key()} begins" in log and c.run_key() not in log


def test_a_group_killed_between_two_runs_loses_nothing_and_a_fresh_group_carries_on(tmp_path, monkeypatch):
    a, b, c = (tiny(tmp_path, seed=s, steps=10) for s in (1, 2, 3))
    # rank 0 is SIGKILLed after run a, before run b begins: the launch dies between two runs
    monkeypatch.setenv("KANLIB_FAULT", f"kill@0:-1#{b.run_key()[-10:]}")
    res = run_sweep([a, b, c], progress=False, rerun_disturbed=False, timeout_s=120)
    assert res.ok and len(res.records) == 3
    assert [(r["run_key"], r["status"]) for r in manifest_rows(a)] == [
        (a.run_key(), "ok"), (b.run_key(), "ok"), (c.run_key(), "ok")]
    first, second = launches(a)
    assert first["n_began"] == 1 and first["n_ok"] == 1 and first["exit_code"] not in (0, None)
    assert second["n_began"] == 2 and second["n_ok"] == 2
    # what the first launch's run wrote is intact
    assert records.read_record(os.path.join(a.run_dir(), records.RECORD_NAME))["launch_id"] == first["launch_id"]


def test_a_run_past_its_deadline_times_out_alone(tmp_path):
    a, b, c = tiny(tmp_path, seed=1, steps=10), tiny(tmp_path, seed=2, steps=10 ** 6), tiny(tmp_path, seed=3, steps=10)
    # the deadline counts a launch's start-up: a 2-process run of 12 steps took 19 s from the command at a load of 8
    # on this 2-core machine, so 60 s leaves a and c (each the first run of its group) room on a busy one
    res = run_sweep([a, b, c], progress=False, rerun_disturbed=False, timeout_s=60)
    assert [(cfg.run_key(), msg.split(":")[0]) for cfg, msg in res.failures] == [(b.run_key(), "timeout")]
    assert {r["run_key"] for r in res.records} == {a.run_key(), c.run_key()}
    assert [r["status"] for r in manifest_rows(a)] == ["ok", "timeout", "ok"]


@pytest.mark.parametrize("keep_groups", [True, False])
def test_rounds_run_every_point_before_the_next_repeat(tmp_path, keep_groups):
    """Kept groups: one launch per placement serves every round (it waits between its parts); without: one launch
    per placement and round. Either way every point's repeat 0 ends before any repeat 1 starts."""
    configs = [tiny(tmp_path, nproc_per_node=p, seed=s, repeat=r, steps=6)
               for r in range(2) for p in (1, 2) for s in (1, 2)]
    res = run_sweep(list(reversed(configs)), progress=False, rerun_disturbed=False,  # the order given does not matter
                    timeout_s=120, keep_groups=keep_groups)
    rows = launches(configs[0])
    if keep_groups:
        assert res.ok and res.launches == 2
        assert sorted((row["placement"], row["n_ok"], row["n_parts"]) for row in rows) == [("1x1", 4, 2),
                                                                                          ("1x2", 4, 2)]
        assert all(row["exit_code"] == 0 and row["waiting_s"] > 0 for row in rows)
    else:
        assert res.ok and res.launches == 4
        assert [(row["placement"], row["n_ok"], row["n_parts"]) for row in rows] == [("1x2", 2, 1), ("1x1", 2, 1)] * 2
    repeat_of = {c.run_key(): c.repeat for c in configs}
    events = sorted((e for row in rows for e in read_jsonl(os.path.join(
        str(tmp_path), configs[0].study, "launches", row["launch_id"], "events.jsonl"))), key=lambda e: e["at"])
    assert [repeat_of[e["run_key"]] for e in events if e["event"] == "begin"] == [0] * 4 + [1] * 4
    assert (max(e["at"] for e in events if e["event"] == "end" and repeat_of[e["run_key"]] == 0)
            < min(e["at"] for e in events if e["event"] == "begin" and repeat_of[e["run_key"]] == 1))
    recs = res.records
    assert sorted(r["runs_before_in_launch"] for r in recs) == ([0, 0, 1, 1, 2, 2, 3, 3] if keep_groups
                                                                else [0, 0, 0, 0, 1, 1, 1, 1])
    [sweep_row] = read_jsonl(os.path.join(str(tmp_path), configs[0].study, records.SWEEPS_NAME))
    assert sweep_row["n_launches"] == res.launches and sweep_row["n_ok"] == 8 and sweep_row["duration_s"] > 0


def test_a_group_killed_while_it_waits_is_replaced_by_a_fresh_one(tmp_path, monkeypatch):
    """A kept group whose processes die between two rounds (here: killed as its second part begins, before the
    run) does not take the next round's runs down with it: a fresh launch runs them."""
    configs = [tiny(tmp_path, nproc_per_node=2, seed=s, repeat=r, steps=6) for r in range(2) for s in (1, 2)]
    monkeypatch.setenv("KANLIB_FAULT", f"kill@0:-1#{configs[2].run_key()[-10:]}")
    res = run_sweep(configs, progress=False, rerun_disturbed=False, timeout_s=120)
    assert res.ok, res.failures
    rows = launches(configs[0])
    assert len(rows) == 2 and res.launches == 2
    assert {r["run_key"] for r in res.records} == {c.run_key() for c in configs}
    assert sorted(row["n_ok"] for row in rows) == [2, 2]
    assert all(r["status"] == "ok" for r in manifest_rows(configs[0]))  # the run that never began has no row


def test_peak_memory_is_each_runs_own_in_a_group(tmp_path):
    big = tiny(tmp_path, nproc_per_node=1, seed=1, steps=6, n_train=4_000_000, global_batch=65536)
    small = tiny(tmp_path, nproc_per_node=1, seed=2, steps=6)
    res = run_sweep([big, small], progress=False, rerun_disturbed=False, timeout_s=300)
    assert res.ok and res.launches == 1
    r = {x["run_key"]: x for x in res.records}
    assert r[big.run_key()]["peak_mem_kind"] == r[small.run_key()]["peak_mem_kind"] == "cpu_peak_rss"
    # 4M samples (48 MB of data) and a 65536 batch held by the first run are not the second run's peak
    assert r[small.run_key()]["peak_mem_bytes"] < r[big.run_key()]["peak_mem_bytes"] - 40 * 2 ** 20
    # the steady host allocator (kanlib.metrics.steady_host_allocator) was on in both, and the records say so
    assert r[big.run_key()]["host_malloc"] == r[small.run_key()]["host_malloc"] == "steady"
    assert all(isinstance(x["minor_page_faults"], int) for x in res.records)


_ALLOC_LOOP = """
import json, resource, sys, torch
from kanlib import metrics
mode = metrics.steady_host_allocator()
def loop(n):
    for _ in range(n):
        x = torch.ones(2 * 1024 * 1024)  # 8 MB, touched: a fresh mapping faults in 2048 pages
        y = torch.ones(10 * 1024 * 1024)  # 40 MB: above glibc's largest mmap threshold
        z = x * 2
        del x, y, z
loop(5)
a = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
loop(100)
print(json.dumps({"mode": mode, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - a}))
"""


def _alloc_loop(env_value: str | None) -> dict:
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "KANLIB_HOST_MALLOC"}
    if env_value is not None:
        env["KANLIB_HOST_MALLOC"] = env_value
    p = subprocess.run([sys.executable, "-c", _ALLOC_LOOP], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 or env_value not in (None, "steady", "system"), p.stderr
    return json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr}


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="glibc on Linux")
def test_the_steady_host_allocator_keeps_a_steps_memory_mapped():
    """Tensors of 8 and 40 MB allocated and freed 100 times: from the steady heap they fault next to nothing in
    (glibc's defaults map the 40 MB ones afresh every time: 10240 pages each); the variable's opt-out is taken; a
    wrong value is refused, naming the variable."""
    steady = _alloc_loop(None)
    assert steady["mode"] == "steady"
    # at most a few heap growths over 300 allocations (one was seen: 12288 pages, once), not 10240 pages a time
    assert steady["faults"] < 100 * 10240 // 20, steady
    system = _alloc_loop("system")
    assert system["mode"] == "system" and system["faults"] > 100 * 10240 // 2
    bad = _alloc_loop("fast")
    assert "KANLIB_HOST_MALLOC='fast'" in bad["error"] and "steady" in bad["error"]
