"""The GPU path checked on CPU where it can be: every collective of the runtime goes through helpers that
move its tensor to ``info.device`` (an nccl group takes CUDA tensors only), per-node GPU slices for
multinode on one host, and NCCL's algorithm limited to all-reduce."""

from __future__ import annotations

import ast
import os

import pytest
import torch

from kanlib import distributed
from kanlib.distributed import DistInfo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIVES = {"all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "broadcast", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "gather", "scatter", "reduce", "send", "recv"}
# Calls outside kanlib/distributed.py whose tensors are on the device by construction.
ALLOWED = {
    ("hooks.py", "all_reduce"): "DDP's gradient bucket, which lives on the device",
    ("grids.py", "all_gather"): "grid update: the batch x, on the device, and sizes created on x.device",
    ("grids.py", "broadcast"): "grid update: the layer's buffers and parameters, on the device",
    ("collbench.py", "all_reduce"): "the benchmark's message, allocated on info.device",
    ("optim.py", "all_reduce"): "L-BFGS's scalars under FSDP: reductions of its flat vectors, on the parameters' device",
}


def _collective_calls(path: str) -> list[tuple[str, int]]:
    tree = ast.parse(open(path).read())
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in COLLECTIVES
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "dist"):
            out.append((node.func.attr, node.lineno))
    return out


def test_no_collective_takes_a_tensor_off_the_device():
    bad = []
    kanlib = os.path.join(ROOT, "kanlib")
    for name in sorted(os.listdir(kanlib)):
        if not name.endswith(".py") or name == "distributed.py":
            continue
        for op, line in _collective_calls(os.path.join(kanlib, name)):
            if (name, op) not in ALLOWED:
                bad.append(f"kanlib/{name}:{line}: dist.{op} (use kanlib.distributed's helpers)")
    assert not bad, "\n".join(bad)
    # and the helpers move what they are given to the device
    src = open(os.path.join(kanlib, "distributed.py")).read()
    for fn in ("def all_reduce", "def all_gather", "def broadcast"):
        body = src.split(fn, 1)[1].split("\ndef ", 1)[0]
        assert ".to(info.device)" in body, fn


def test_helpers_reduce_gather_and_broadcast_in_one_process():
    info = DistInfo(0, 0, 1, torch.device("cpu"), None)
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(distributed.all_reduce(t, info, "max"), t)
    assert distributed.all_gather(t, info).shape == (1, 2)
    assert torch.equal(distributed.broadcast(t, info), t)


def test_multinode_gives_each_node_its_own_gpus():
    from runners.multinode import node_devices

    assert node_devices(0, 2, None, 4) == "0,1" and node_devices(1, 2, None, 4) == "2,3"
    assert node_devices(1, 1, "5,7", 2) == "7"
    with pytest.raises(RuntimeError, match="node 1 needs 2 GPUs, only 2 are visible"):
        node_devices(1, 2, "0,1", 2)


def test_multinode_on_one_host_refuses_more_processes_than_devices(tmp_path):
    from kanlib.config import ConfigError, RunConfig
    from runners.command import available_cpus, check_environment

    cfg = RunConfig(nnodes=available_cpus(), nproc_per_node=2, global_batch=64 * available_cpus(), device="cpu",
                    out_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=rf"^nproc_per_node: {available_cpus()} x 2 processes on this host"):
        check_environment(cfg, "multinode")


def test_nccl_algorithm_applies_to_all_reduce_only(monkeypatch):
    monkeypatch.setattr(distributed, "_nccl_version", lambda: (2, 27, 3))
    assert distributed.nccl_env("Tree", "LL128") == {"NCCL_ALGO": "allreduce:Tree", "NCCL_PROTO": "allreduce:LL128"}
    assert distributed.nccl_env("", "") == {}
    monkeypatch.setattr(distributed, "_nccl_version", lambda: (2, 18, 1))
    with pytest.warns(UserWarning, match="applies to every collective"):
        assert distributed.nccl_env("Ring", "") == {"NCCL_ALGO": "Ring"}


# -- CPU placement (kanlib.distributed.pin_cpus), in real processes that hold their claims ----------------
_PIN = """
import os, sys, types
from kanlib.distributed import pin_cpus
cfg = types.SimpleNamespace(cpu_affinity=sys.argv[1], threads=int(sys.argv[2]))
mine = pin_cpus(cfg, sys.argv[3])
print(",".join(map(str, mine)) or "-", ",".join(map(str, sorted(os.sched_getaffinity(0)))), flush=True)
sys.stdin.read()  # hold the claim until the test closes stdin
"""


def _pinned(tmp_path, n: int, affinity="auto", threads=1, device="cpu", rank=True, cpus=None):
    """Start ``n`` processes that call pin_cpus at once and hold their claims; their (pinned, allowed) CPUs."""
    import subprocess
    import sys

    env = dict(os.environ, KANLIB_CPU_SLOTS=str(tmp_path / "slots dir"), PYTHONPATH=ROOT)
    env.pop("RANK", None)
    if rank:
        env["RANK"] = "0"
    pre = ["taskset", "-c", cpus] if cpus else []
    procs = [subprocess.Popen(pre + [sys.executable, "-c", _PIN, affinity, str(threads), device], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        lines = [p.stdout.readline().split() for p in procs]
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=30)
    return [(a, b) for a, b in lines]


needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                                    reason="needs Linux CPU affinity and at least 2 CPUs")


@needs_affinity
def test_launched_processes_on_one_host_each_get_cpus_of_their_own(tmp_path):
    n_cpu = len(os.sched_getaffinity(0))
    got = _pinned(tmp_path, n_cpu + 1)  # one more process than CPUs
    pinned = [a for a, b in got if a != "-"]
    assert sorted(pinned, key=int) == [str(c) for c in sorted(os.sched_getaffinity(0))]  # each CPU once
    assert all(a == b for a, b in got if a != "-")  # a pinned process runs on its CPU only
    left = [b for a, b in got if a == "-"]
    assert len(left) == 1 and len(left[0].split(",")) == n_cpu  # no CPU free: the OS places it
    # The claims die with their processes: the next ones get CPUs again.
    assert all(a != "-" for a, b in _pinned(tmp_path, 2))


@needs_affinity
def test_cpus_are_claimed_in_blocks_of_threads_within_what_the_process_may_use(tmp_path):
    import shutil

    if not shutil.which("taskset"):
        pytest.skip("needs taskset (util-linux)")
    got = _pinned(tmp_path, 2, threads=2, cpus="0,1")
    assert sorted(a for a, b in got) == ["-", "0,1"]
    got = _pinned(tmp_path, 1, cpus="1")  # taskset/cgroups/SLURM: only the CPUs it may use
    assert got == [("1", "1")]


@needs_affinity
@pytest.mark.parametrize("why", ["none", "cuda", "not launched"])
def test_a_process_is_left_to_the_os_when_asked_on_cuda_or_when_not_launched(tmp_path, why):
    got = _pinned(tmp_path, 1, affinity="none" if why == "none" else "auto",
                  device="cuda" if why == "cuda" else "cpu", rank=why != "not launched")
    assert got[0][0] == "-" and len(got[0][1].split(",")) == len(os.sched_getaffinity(0))


def test_a_launch_of_another_world_size_stops_before_the_run_folder_exists(tmp_path):
    """Issue 38: `torchrun --nproc-per-node 2 -m kanlib.train` without `--nproc_per_node=2` stopped with a mismatch
    error, leaving the run's folder (its lock) with no record. Each rank now names the mismatch first."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
                          "kanlib.train", "--widths=2,5,1", "--steps=3", "--warmup_steps=1", "--kan_impl=fast",
                          "--device=cpu", f"--out_dir={tmp_path / 'out'}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode != 0
    assert ("ConfigError: nproc_per_node: the launcher started WORLD_SIZE=2 processes, but the config asks for nnodes "
            "x nproc_per_node = 1 x 1 = 1") in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()


def test_the_launch_check_in_one_process(monkeypatch):
    from kanlib.config import ConfigError, RunConfig

    monkeypatch.delenv("RANK", raising=False)
    distributed.check_launch(RunConfig())
    with pytest.raises(ConfigError, match="^nproc_per_node: nnodes x nproc_per_node = 1 x 2 processes, but this is "
                                          "one process without a launcher"):
        distributed.check_launch(RunConfig(nproc_per_node=2))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    distributed.check_launch(RunConfig(nnodes=2, nproc_per_node=2))
    with pytest.raises(ConfigError, match=r"^nproc_per_node: the launcher started WORLD_SIZE=4 processes, but the "
                                          r"config asks for nnodes x nproc_per_node = 2 x 4 = 8"):
        distributed.check_launch(RunConfig(nnodes=2, nproc_per_node=4))
