"""FSDP (parallelism='fsdp', torch.distributed.fsdp.fully_shard) on two real gloo processes: the same
training as DDP, grid updates that keep the shards one consistent model, and checkpoints that resume."""

from __future__ import annotations

import json
import os

import pytest
import torch

from runhelp import final_params, max_abs_diff, tiny
from runners.launch import RunFailed, run

pytestmark = pytest.mark.usefixtures("no_process_left")


@pytest.mark.slow
@pytest.mark.parametrize("grid_updates", [0, 5], ids=["plain", "grid-updates"])
def test_fsdp_trains_what_ddp_trains(tmp_path, grid_updates):
    kw = dict(widths=(2, 8, 8, 1), steps=16, grid_update_every=grid_updates, grid_eps=0.5 if grid_updates else 0.02)
    ddp = run(tiny(tmp_path, **kw), echo=False, timeout_s=180)
    fsdp = run(tiny(tmp_path, parallelism="fsdp", **kw), echo=False, timeout_s=180)
    assert fsdp["parallelism"] == "fsdp" and ddp["parallelism"] == "ddp"
    assert fsdp["n_grid_updates"] == ddp["n_grid_updates"] == (3 if grid_updates else 0)  # steps 5, 10, 15
    assert fsdp["final_train_loss"] == pytest.approx(ddp["final_train_loss"], rel=1e-4)
    assert fsdp["final_val_loss"] == pytest.approx(ddp["final_val_loss"], rel=1e-4)
    p_ddp = final_params(tiny(tmp_path, **kw))
    p_fsdp = final_params(tiny(tmp_path, parallelism="fsdp", **kw))  # full tensors, gathered from the shards
    assert max_abs_diff(p_ddp, p_fsdp) < 1e-4
    if grid_updates:  # the refit grid is non-uniform, and every shard was cut from one refit
        g = p_fsdp["layers.0.grid"][0]
        assert not torch.allclose(g[1:] - g[:-1], (g[1] - g[0]).expand(g.numel() - 1))


@pytest.mark.slow
def test_fsdp_preempted_run_resumes_from_its_full_checkpoint(tmp_path, monkeypatch):
    kw = dict(widths=(2, 8, 8, 1), parallelism="fsdp", warmup_steps=10)
    reference = run(tiny(tmp_path / "ref", **kw), echo=False, timeout_s=180)
    monkeypatch.setenv("KANLIB_FAULT", "term@0:7")
    cfg = tiny(tmp_path, **kw)
    with pytest.raises(RunFailed) as e:
        run(cfg, echo=False, timeout_s=180)
    assert e.value.status == "preempted"
    assert json.load(open(os.path.join(cfg.run_dir(), "preempted.json")))["step"] == 8
    monkeypatch.delenv("KANLIB_FAULT")
    rec = run(cfg, echo=False, timeout_s=180)
    assert rec["resumed_from_step"] == 8
    assert rec["final_val_loss"] == pytest.approx(reference["final_val_loss"], rel=1e-6)
    assert max_abs_diff(final_params(cfg), final_params(tiny(tmp_path / "ref", **kw))) <= 1e-6
