"""The collective benchmark: its config, the NCCL debug-output parser, record checks, and real runs on
2 gloo processes (1x2 under one torchrun; 2x1 as two torchruns joined by one rendezvous)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import pytest

from kanlib import collbench
from kanlib.analysis import load
from kanlib.collbench import BenchConfig, bench_configs, nccl_choice, parse_nccl_tuning
from kanlib.records import check_bench_record
from kanlib.config import ConfigError


def launch_bench(cfg: BenchConfig, timeout_s: float = 300) -> dict:
    """Run ``cfg`` with torchrun on this machine (``nnodes`` torchruns joined by one c10d rendezvous
    when ``nnodes > 1``) and return its record (runners.launch.run takes RunConfig only for now)."""
    from runners.launch import check_environment, launch_env, torchrun_command
    from runners.multinode import free_port

    check_environment(cfg)
    run_dir = cfg.run_dir()
    os.makedirs(run_dir, exist_ok=True)
    entry = ["-m", BenchConfig.ENTRY]
    if cfg.nnodes == 1:
        cmd = torchrun_command(cfg, entry=entry)
    else:
        cmd = torchrun_command(cfg, standalone=False, rdzv_endpoint=f"127.0.0.1:{free_port()}",
                               rdzv_id=uuid.uuid4().hex[:12], entry=entry)
    env = launch_env(cfg, "local" if cfg.nnodes == 1 else "multinode")
    logs = [os.path.join(run_dir, f"launch-node{i}.log") for i in range(cfg.nnodes)]
    procs = []
    for path in logs:
        with open(path, "w") as log:
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    path = os.path.join(run_dir, "record.json")
    if codes != [0] * len(procs) or not os.path.exists(path):
        tails = "\n".join(open(log, errors="replace").read()[-3000:] for log in logs)
        raise AssertionError(f"collbench {cfg.placement} exited with {codes}:\n{tails}")
    with open(path) as f:
        return json.load(f)


def small(tmp_path, **kw) -> BenchConfig:
    base = dict(out_dir=str(tmp_path), device="cpu", backend="gloo", nproc_per_node=2, min_bytes=8,
                max_bytes=4 * 1024 * 1024, size_factor=4, iters=10, warmup_iters=2, pg_timeout_s=60.0)
    return BenchConfig(**{**base, **kw})


# -- config -------------------------------------------------------------------------------------------
def test_config_round_trips_and_refuses_bad_values(tmp_path):
    cfg = small(tmp_path, emulate_latency_s=0.005, nnodes=2, nproc_per_node=1)
    assert BenchConfig.from_cli(cfg.to_cli()) == cfg
    assert cfg.world_size == 2 and cfg.placement == "2x1" and cfg.emulated_link
    assert not small(tmp_path, emulate_latency_s=0.005).emulated_link  # one node: nothing to emulate
    assert cfg.run_key() != small(tmp_path, nnodes=2, nproc_per_node=1).run_key()
    for changes, message in [
        (dict(min_bytes=2), "^min_bytes: 2 is less than one float32 element"),
        (dict(max_bytes=4), "^max_bytes: 4 is smaller than min_bytes=8"),
        (dict(size_factor=1), "^size_factor: must be at least 2"),
        (dict(iters=0), "^iters: must be positive"),
        (dict(rounds=11), "^rounds: 11 is more than iters=10"),
        (dict(nccl_algo="Tree"), "^nccl_algo: 'Tree' is an NCCL setting, but backend='gloo'"),
        (dict(nccl_proto="fast", backend="auto", device="auto"), "^nccl_proto: unknown value 'fast'"),
        (dict(emulate_latency_s=-1.0), "^emulate_latency_s: must be >= 0"),
        (dict(study="../x"), "^study: '../x' is not a name"),
    ]:
        with pytest.raises(ConfigError, match=message):
            small(tmp_path, **changes)
    with pytest.raises(ConfigError, match="^iters: cannot read 'x' as int"):
        BenchConfig.from_cli(["--iters=x"])


def test_sizes_run_from_min_to_max_by_the_factor():
    assert BenchConfig(min_bytes=8, max_bytes=100, size_factor=4).sizes() == [8, 32, 100]
    assert BenchConfig(min_bytes=8, max_bytes=128, size_factor=2).sizes() == [8, 16, 32, 64, 128]
    assert BenchConfig(min_bytes=6, max_bytes=6, dtype="bfloat16").sizes() == [6]
    assert BenchConfig(min_bytes=7, max_bytes=17).sizes() == [4, 12, 16]  # 7, 14, 17 in whole float32 elements


def test_default_sizes_run_past_the_largest_bucket():
    """The benchmark stopped at 4 MiB while DDP's default bucket is 25 MiB: the link model's bandwidth at the bucket
    was an extrapolation. By default two sizes lie past DDP's default bucket cap, at a size factor of 2 or 4."""
    from kanlib.config import RunConfig

    bucket = RunConfig.bucket_cap_mb * 2**20
    for factor in (2, 4):
        past = [s for s in BenchConfig(size_factor=factor).sizes() if s > bucket]
        assert len(past) >= 2, (factor, past)


def test_bench_configs_always_include_nccls_own_choice(tmp_path):
    base = BenchConfig(out_dir=str(tmp_path), device="cuda")
    cfgs = bench_configs(["1x2", "2x1"], base, algos=("Ring", "Tree"), protos=("Simple",), repeats=2)
    assert len(cfgs) == 2 * 2 * 3 * 2
    assert {(c.nccl_algo, c.nccl_proto) for c in cfgs} == {(a, p) for a in ("", "Ring", "Tree") for p in ("", "Simple")}
    assert {c.placement for c in cfgs} == {"1x2", "2x1"} and {c.repeat for c in cfgs} == {0, 1}
    assert len({c.run_key() for c in cfgs}) == len(cfgs)
    with pytest.raises(ConfigError, match=r"^placements: '2-1' is not 'NxP'"):
        bench_configs(["2-1"], base)
    with pytest.raises(ConfigError, match="^placements: '0x2'"):
        bench_configs(["0x2"], base)


# -- NCCL's debug output -------------------------------------------------------------------------------
# Lines as NCCL prints them: "%s:%d:%d [%d] NCCL INFO " + the format of each version (src/debug.cc,
# src/enqueue.cc, src/scheduler/symmetric_sched.cc).
NCCL_LOG = "\n".join([
    "gpu01:4242:4242 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
    "gpu01:4242:4242 [0] NCCL INFO NCCL_ALGO set by environment to allreduce:tree",
    # 2.20-2.22: "%ld Bytes -> Algo %d proto %d time %f"
    "gpu01:4242:4300 [0] NCCL INFO 1024 Bytes -> Algo 1 proto 0 time 12.345000",
    # 2.23: "%s: %ld Bytes -> Algo %d proto %d time %f"
    "gpu01:4242:4300 [0] NCCL INFO AllReduce: 4194304 Bytes -> Algo 0 proto 2 time 101.250000",
    # 2.24+: "%s: %ld Bytes -> Algo %s proto %s channel{Lo..Hi}={%d..%d}"
    "gpu01:4242:4300 [0] NCCL INFO AllReduce: 33554432 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..31}",
    "[2026-01-05 10:11:12] gpu01:4242:4300 [0] NCCL INFO AllReduce: 33554432 Bytes -> Algo RING proto LL128 "
    "channel{Lo..Hi}={0..15}",
    "gpu01:4242:4300 [0] NCCL INFO AllGather: 160 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}",
    "gpu01:4242:4300 [0] NCCL INFO AllReduce: 4 Bytes -> Algo TREE proto LL channel{Lo..Hi}={0..0}",
    # 2.27+: "%s [Symmetric]: %ld Bytes -> Kernel %s nchannels %d nthreads %d nWorks %d"
    "gpu01:4242:4300 [0] NCCL INFO AllReduce [Symmetric]: 65536 Bytes -> Kernel AllReduce_AGxLL_R nchannels 4 "
    "nthreads 512 nWorks 1",
])


def test_nccl_tuning_lines_of_every_version_are_parsed():
    entries = parse_nccl_tuning(NCCL_LOG)
    assert entries[0] == {"func": None, "bytes": 1024, "algo": "RING", "proto": "LL"}  # codes translated
    assert entries[1] == {"func": "AllReduce", "bytes": 4194304, "algo": "TREE", "proto": "SIMPLE"}
    assert entries[2] == {"func": "AllReduce", "bytes": 33554432, "algo": "RING", "proto": "SIMPLE"}
    assert entries[-1] == {"func": "AllReduce", "bytes": 65536, "algo": "SYMMETRIC", "proto": "AllReduce_AGxLL_R"}
    assert len(entries) == 7  # the version and environment lines are not choices
    assert nccl_choice(entries, 33554432) == ("RING", "LL128+SIMPLE")  # two choices seen for one size
    assert nccl_choice(entries, 1024) == ("RING", "LL")
    assert nccl_choice(entries, 160) == (None, None)  # an all-gather, not an all-reduce
    assert nccl_choice(entries, 8) == (None, None)


def test_nccl_debug_goes_to_a_file_per_rank(tmp_path):
    env = collbench.nccl_debug_env(str(tmp_path), 3)
    assert env["NCCL_DEBUG"] == "INFO" and "TUNING" in env["NCCL_DEBUG_SUBSYS"].split(",")
    assert env["NCCL_DEBUG_FILE"] == os.path.join(str(tmp_path), "nccl-debug.rank3.log")


# -- records ------------------------------------------------------------------------------------------
def _record(**changes):
    from kanlib.records import SCHEMA_VERSION

    row = {"size_bytes": 8, "count": 2, "time_s": 1e-4, "time_s_p10": 9e-5, "time_s_p90": 2e-4,
           "algbw_bytes_per_s": 8e4, "busbw_bytes_per_s": 8e4, "emulated_s": 0.0}
    rec = {"schema_version": SCHEMA_VERSION, "record_kind": "collbench", "status": "ok", "world_size": 2,
           "nnodes": 1, "nproc_per_node": 2, "rows": [row]}
    rec.update(changes)
    return rec


def test_check_bench_record_names_what_is_wrong():
    assert check_bench_record(_record()) is None
    assert check_bench_record({"x": 1}) == "not a run record (no schema_version)"
    assert check_bench_record(_record(record_kind="run")) == "record_kind is 'run', not 'collbench'"
    assert check_bench_record(_record(world_size=4)) == "world_size 4 is not nnodes x nproc_per_node = 1 x 2"
    assert check_bench_record(_record(rows=[])) == "rows is missing or empty"
    bad = _record()
    bad["rows"][0]["time_s"] = float("nan")
    assert check_bench_record(bad) == "rows[0].time_s is nan, outside its range (> 0, finite)"
    bad["rows"][0]["time_s"] = "fast"
    assert check_bench_record(bad) == "rows[0].time_s is 'fast', not a number"


# -- real runs ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_process_sweep_writes_a_record_with_nccl_tests_definitions(tmp_path):
    cfg = small(tmp_path, rounds=3)  # 10 timed all-reduces per size in sweeps of 4, 3 and 3
    rec = launch_bench(cfg)
    assert check_bench_record(rec) is None
    assert rec["record_kind"] == "collbench" and rec["backend"] == "gloo" and rec["placement"] == "1x2"
    assert rec["run_key"] == cfg.run_key() and rec["torch_version"] and rec["code_version"]
    rows = rec["rows"]
    assert [r["size_bytes"] for r in rows] == cfg.sizes()
    for r in rows:
        assert r["n_iters"] == cfg.iters and r["count"] * 4 == r["size_bytes"]
        assert r["time_s_p10"] <= r["time_s"] <= r["time_s_p90"]
        assert r["algbw_bytes_per_s"] == pytest.approx(r["size_bytes"] / r["time_s"])
        assert r["busbw_bytes_per_s"] == pytest.approx(r["algbw_bytes_per_s"] * 2 * (2 - 1) / 2)
        assert r["emulated_s"] == 0.0 and r["nccl_algo_used"] is None  # gloo: no NCCL choice to read
    # moving 4 MiB takes longer than moving 8 bytes (the sweep measures transfers, not only overhead)
    assert rows[-1]["time_s"] > rows[0]["time_s"]
    df = load.load_bench(str(tmp_path))
    assert len(df) == len(rows) and set(df["placement"]) == {"1x2"}
    assert list(df["size_bytes"]) == cfg.sizes() and (df["record_kind"] == "collbench").all()


@pytest.mark.slow
def test_emulated_latency_adds_to_every_2x1_all_reduce(tmp_path):
    cfg = small(tmp_path, nnodes=2, nproc_per_node=1, emulate_latency_s=0.005, max_bytes=1024, iters=5)
    rec = launch_bench(cfg)
    assert rec["placement"] == "2x1" and rec["world_size"] == 2
    for r in rec["rows"]:
        assert r["emulated_s"] == pytest.approx(2 * 0.005)
        assert r["time_s"] >= r["emulated_s"]  # the delay is inside every timed all-reduce


def test_load_bench_skips_bad_records_and_other_kinds(tmp_path):
    good = tmp_path / "collbench" / "a"
    good.mkdir(parents=True)
    (good / "record.json").write_text(json.dumps(_record(run_key="a", env={"NCCL_DEBUG": "INFO"})))
    broken = tmp_path / "collbench" / "b"
    broken.mkdir()
    (broken / "record.json").write_text(json.dumps(_record(rows=[])))
    other = tmp_path / "strong_scaling" / "c"
    other.mkdir(parents=True)
    (other / "record.json").write_text(json.dumps({"schema_version": 2, "step_time_s": 1.0}))
    with pytest.warns(UserWarning, match="rows is missing or empty"):
        recs = load.read(str(tmp_path))
    df = recs.bench()
    assert list(df["run_key"]) == ["a"] and df["env.NCCL_DEBUG"].tolist() == ["INFO"]
    assert [p for p, _ in recs.bench_bad] == [str(broken / "record.json")]


def foreign_underscore_names(path: str) -> list[str]:
    """``module._name`` a source file takes from another kanlib module: imported (``from kanlib.x import _name``) or
    reached as an attribute of an imported kanlib module (``x._name``); dunders do not count."""
    import ast

    tree = ast.parse(open(path).read())
    modules, out = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kanlib"):
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    out.append(f"{node.module}.{a.name}")
                modules.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            modules.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("kanlib"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            out.append(f"{node.value.id}.{node.attr}")
    return out


def test_collbench_takes_nothing_private_from_another_module():
    """The spin rate of the GPU clock comes through hooks' public name (it was ``hooks._spin_cycles_per_s``)."""
    assert foreign_underscore_names(collbench.__file__) == []
    from kanlib import hooks
    assert callable(hooks.spin_cycles_per_s)
