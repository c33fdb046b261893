"""The torchrun command builder, and real multi-process gloo runs under torchrun."""

import glob
import json
import os
import re
import tempfile
import pytest
import torch

from kanlib import records
from kanlib.config import ConfigError, RunConfig
from runners.launch import check_environment, run, torchrun_command



def tiny(tmp_path, **kw) -> RunConfig:
    base = dict(widths=(2, 8, 1), grid_size=4, global_batch=64, steps=12, warmup_steps=2,
                n_train=1024, n_val=256, out_dir=str(tmp_path), study="t", kan_impl="fast", optimizer="adam", lr=1e-3)
    base.update(kw)
    return RunConfig(**base)


def test_command_builder_local_and_multinode(tmp_path):
    cfg = tiny(tmp_path, nproc_per_node=2)
    cmd = torchrun_command(cfg, python="/py")
    assert cmd[:3] == ["/py", "-m", "torch.distributed.run"]
    # a private rendezvous bound to loopback, on a port the OS picks
    assert {"--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0"} <= set(cmd)
    assert "--nproc-per-node=2" in cmd
    i = cmd.index("kanlib.train")
    assert cmd[i - 1] == "-m"
    assert RunConfig.from_cli(cmd[i + 1:]) == cfg
    # torchrun's own folder goes with the run (a worker group's: beside its plan), never a new /tmp/torchelastic_*
    assert f"--log-dir={os.path.join(cfg.run_dir(), 'torchrun')}" in cmd
    plan = os.path.join(str(tmp_path), "launches", "a b", "plan.json")
    cmd = torchrun_command(cfg, program=["-m", "kanlib.worker", f"--plan={plan}"])
    assert f"--log-dir={os.path.join(os.path.dirname(plan), 'torchrun')}" in cmd
    assert f"--log-dir={tmp_path}" in torchrun_command(cfg, log_dir=str(tmp_path))
    multi = tiny(tmp_path, nnodes=2)
    cmd = torchrun_command(multi, standalone=False, rdzv_endpoint="node1:29501", rdzv_id="42")
    assert {"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=node1:29501", "--rdzv-id=42"} <= set(cmd)
    with pytest.raises(ConfigError, match="^nnodes:"):
        torchrun_command(multi)
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        torchrun_command(multi, standalone=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without GPUs")
def test_cuda_requests_are_refused_before_launch(tmp_path):
    with pytest.raises(ConfigError, match="^device: 'cuda' needs CUDA"):
        check_environment(tiny(tmp_path, device="cuda"))
    with pytest.raises(ConfigError, match="^backend: 'nccl' needs CUDA"):
        check_environment(tiny(tmp_path, backend="nccl"))


@pytest.mark.slow
@pytest.mark.smoke  # the one real 2-process run of make test-fast
def test_two_process_run_writes_a_complete_record(tmp_path):
    from dataclasses import fields

    cfg = tiny(tmp_path, nproc_per_node=2, comm_hook="timed")
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "torchelastic_*")))
    rec = run(cfg, echo=False)
    # torchrun's per-rank folders went into the launch's folder; it left nothing in the temporary directory
    assert glob.glob(os.path.join(str(tmp_path), "t", "launches", "*", "torchrun", "*"))
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "torchelastic_*"))) <= before
    assert rec["world_size"] == 2 and rec["backend"] == "gloo" and rec["status"] == "ok"
    required = {"schema_version", "run_id", "study", "world_size", "nnodes", "backend", "device",
                "torch_version", "git_sha", "hostname", "started_at", "n_params", "step_time_s",
                "step_time_s_p10", "step_time_s_p90", "forward_s", "backward_s", "optimizer_s",
                "samples_per_s", "peak_mem_bytes", "final_train_loss", "final_val_loss", "status"}
    required |= {f.name for f in fields(RunConfig)}
    assert required <= set(rec)
    # a record has exactly the fields kanlib.records declares (docs/schema.md is generated from them)
    from kanlib.records import MEASUREMENT_FIELDS, Provenance

    declared = {f.name for f in fields(RunConfig)} | set(MEASUREMENT_FIELDS) | {f.name for f in fields(Provenance)}
    assert set(rec) == declared
    assert rec["step_time_s_p10"] <= rec["step_time_s"] <= rec["step_time_s_p90"]
    assert rec["comm_total_s"] > 0 and rec["n_buckets"] >= 1
    assert rec["samples_per_s"] == pytest.approx(64 / rec["step_time_s"])
    run_dir = cfg.run_dir()
    with open(os.path.join(run_dir, "record.json")) as f:
        assert json.load(f) == rec
    with open(os.path.join(run_dir, "steps.csv")) as f:
        rows = f.read().strip().splitlines()
    assert len(rows) == 1 + cfg.steps and rows[0] == ",".join(records.STEP_COLUMNS)


@pytest.mark.slow
def test_wall_throughput_is_the_elapsed_time_of_the_measured_steps(tmp_path):
    """wall_samples_per_s is what a user gets: samples over the elapsed time of the measured steps (rank 0's
    step-end clock in steps.csv gives it too), not the sum of each step's slowest rank, which adds the
    ranks' jitter of every step (about 25% on 5 ms steps, 350 ms here; more on a busy machine)."""
    import numpy as np

    from kanlib.analysis import load

    cfg = tiny(tmp_path, nproc_per_node=2, steps=300, warmup_steps=20)
    rec = run(cfg, echo=False)
    steps = load.load_steps(cfg.run_dir())
    ends = steps.time_unix_s.to_numpy()  # the end of each step on rank 0
    elapsed = ends[-1] - ends[cfg.warmup_steps - 1]  # from the end of the warm-up to the end of the run (s)
    span = cfg.global_batch * (cfg.steps - cfg.warmup_steps) / rec["wall_samples_per_s"]  # the record's (s)
    # The two spans differ by the bookkeeping at their two ends and the ranks' skew there, each about a step at
    # most: a busy machine stretches those as it stretches the steps, so the slack is 3 of the longest step on
    # rank 0's clock (at least 5% of the span, the bound of a quiet machine), not a fixed share.
    longest = float(np.diff(ends[cfg.warmup_steps - 1:]).max())
    assert abs(span - elapsed) <= max(0.05 * elapsed, 3 * longest), (span, elapsed, longest)


@pytest.mark.slow
def test_ddp_two_processes_equal_one_process_on_the_same_global_batch(tmp_path):
    one = run(tiny(tmp_path, nproc_per_node=1, steps=15), echo=False)
    two = run(tiny(tmp_path, nproc_per_node=2, steps=15), echo=False)
    assert one["world_size"] == 1 and two["world_size"] == 2
    assert two["final_train_loss"] == pytest.approx(one["final_train_loss"], rel=1e-5)
    assert two["final_val_loss"] == pytest.approx(one["final_val_loss"], rel=1e-5)
    p1 = torch.load(os.path.join(tiny(tmp_path, steps=15).run_dir(), "model.pt"), weights_only=True)
    p2 = torch.load(os.path.join(tiny(tmp_path, nproc_per_node=2, steps=15).run_dir(), "model.pt"),
                    weights_only=True)
    assert p1.keys() == p2.keys()
    for k in p1:
        assert torch.allclose(p1[k], p2[k], atol=1e-5, rtol=1e-5), k
    # and training moved the parameters: the comparison is not between two initialisations
    from kanlib.model import build_model

    torch.manual_seed(0)
    init = build_model(tiny(tmp_path)).state_dict()
    assert all(torch.equal(init[k], p1[k]) for k in p1 if k.endswith("grid"))
    assert max((init[k] - p1[k]).abs().max().item() for k in p1) > 1e-3


@pytest.mark.slow
def test_failed_run_raises_with_log_tail(tmp_path, monkeypatch):
    import runners.launch as launch
    from dataclasses import dataclass

    # Any Config subclass runs its own ENTRY module: here one whose ranks print and exit 3.
    (tmp_path / "failmod.py").write_text("import os, sys\nprint('boom from rank', os.environ['RANK'])\nsys.exit(3)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    @dataclass
    class FailingConfig(RunConfig):
        ENTRY = "failmod"  # a class attribute (no annotation: not a field)

    with pytest.raises(launch.RunFailed) as e:
        run(FailingConfig(**tiny(tmp_path, nproc_per_node=2).to_dict()), echo=False)
    assert "exited with code 1" in str(e.value) and "boom from rank" in e.value.log_tail
    assert e.value.returncode == 1


@pytest.mark.slow
def test_grid_updates_under_ddp_match_one_process(tmp_path):
    kw = dict(steps=12, grid_update_every=5, grid_eps=0.5)
    one = run(tiny(tmp_path, **kw), echo=False)
    two = run(tiny(tmp_path, nproc_per_node=2, **kw), echo=False)
    assert one["n_grid_updates"] == two["n_grid_updates"] == 2  # at steps 5 and 10
    # the update sees the union of both ranks' shards, i.e. the same global batch as one process
    assert two["final_val_loss"] == pytest.approx(one["final_val_loss"], rel=1e-4)
    p1 = torch.load(os.path.join(tiny(tmp_path, **kw).run_dir(), "model.pt"), weights_only=True)
    p2 = torch.load(os.path.join(tiny(tmp_path, nproc_per_node=2, **kw).run_dir(), "model.pt"), weights_only=True)
    grid0 = p1["layers.0.grid"][0]
    assert not torch.allclose(grid0[1:] - grid0[:-1], (grid0[1] - grid0[0]).expand(grid0.numel() - 1))  # refit
    for k in p1:
        assert torch.allclose(p1[k], p2[k], atol=1e-4, rtol=1e-4), k


@pytest.mark.slow
def test_the_default_run_is_compiled_and_says_so(tmp_path):
    """RunConfig's default kan_impl is the compiled path; the record says which path actually ran and how long
    this process compiled (a second process of the same shapes loads the kernels from the inductor cache)."""
    cfg = tiny(tmp_path, nproc_per_node=2, kan_impl=RunConfig().kan_impl)
    assert cfg.kan_impl == "compiled"
    rec = run(cfg, echo=False, timeout_s=300)
    assert rec["kan_path"] == "compiled" and rec["compile_s"] > 0
    assert rec["time_to_first_step_s"] > 0 and rec["wall_samples_per_s"] > 0
    again = run(cfg.replace(seed=1), echo=False, timeout_s=300)
    assert again["kan_path"] == "compiled"
