"""Checkpoints: atomic commit, RNG round trip, resume after a crash mid-write, and refusal of
truncated or malicious files (kanlib.checkpoint)."""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import pytest
import torch

from kanlib import checkpoint
from kanlib.checkpoint import CheckpointError
from runhelp import final_params, manifest_rows, max_abs_diff, reference_params, tiny
from runners.launch import RunFailed, run

pytestmark = pytest.mark.usefixtures("no_process_left")


def _state(v: float) -> dict:
    return {"model": {"w": torch.full((3,), v)}, "optimizer": {"state": {}, "param_groups": []},
            "rng": [checkpoint.rng_state()], "run_key": "k", "world_size": 1}


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    checkpoint.save(str(tmp_path), _state(1.0), 5)
    expect = (torch.rand(4), np.random.rand(4), [random.random() for _ in range(4)])
    ck = checkpoint.load_latest(str(tmp_path))  # weights_only=True inside
    checkpoint.set_rng_state(ck["rng"][0])
    again = (torch.rand(4), np.random.rand(4), [random.random() for _ in range(4)])
    assert torch.equal(expect[0], again[0]) and np.array_equal(expect[1], again[1]) and expect[2] == again[2]
    assert ck["step"] == 5 and torch.equal(ck["model"]["w"], torch.full((3,), 1.0))


def test_uncommitted_and_temporary_checkpoints_are_ignored(tmp_path):
    run_dir = str(tmp_path)
    checkpoint.save(run_dir, _state(1.0), 5)
    ckdir = checkpoint.checkpoint_dir(run_dir)
    with open(os.path.join(ckdir, "ckpt-00000010.pt.tmp"), "wb") as f:
        f.write(b"half a checkpoint")  # a crash before the rename
    shutil.copy(os.path.join(ckdir, "ckpt-00000005.pt"), os.path.join(ckdir, "ckpt-00000015.pt"))  # never committed
    assert checkpoint.load_latest(run_dir)["step"] == 5
    assert checkpoint.clean_uncommitted(run_dir) == ["ckpt-00000010.pt.tmp", "ckpt-00000015.pt"]
    assert sorted(os.listdir(ckdir)) == ["ckpt-00000005.pt", "latest"]


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    for step in (5, 10, 15):
        checkpoint.save(str(tmp_path), _state(float(step)), step)
    assert checkpoint.committed_names(str(tmp_path)) == ["ckpt-00000010.pt", "ckpt-00000015.pt"]
    assert checkpoint.load_latest(str(tmp_path))["model"]["w"][0].item() == 15.0


@pytest.mark.slow
def test_kill_between_checkpoint_write_and_rename_resumes_from_previous(tmp_path, monkeypatch):
    # Rank 0 dies after writing ckpt-10.pt.tmp and before renaming it; torchrun restarts both
    # ranks, which ignore the temporary file and resume from step 5.
    monkeypatch.setenv("KANLIB_FAULT", "ckptkill@0:10")
    cfg = tiny(tmp_path, checkpoint_every=5)
    rec = run(cfg, echo=False, timeout_s=180, max_restarts=1)
    assert rec["resumed_from_step"] == 5 and rec["attempt"] == 1
    log = open(os.path.join(cfg.run_dir(), "launch.log")).read()
    assert "resumed from step 5" in log and "ckpt-00000005.pt" in log
    assert max_abs_diff(final_params(cfg), reference_params()) <= 1e-6


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory):
    """A run that failed at step 12 after committing checkpoints 5 and 10 (shared, copied per test)."""
    root = tmp_path_factory.mktemp("crashed")
    mp = pytest.MonkeyPatch()
    mp.setenv("KANLIB_FAULT", "raise@1:12")
    try:
        with pytest.raises(RunFailed):
            run(tiny(root, checkpoint_every=5), echo=False, timeout_s=120)
    finally:
        mp.undo()
    assert checkpoint.latest_name(tiny(root, checkpoint_every=5).run_dir()) == "ckpt-00000010.pt"
    return root


def _copy_of(crashed_run, tmp_path):
    shutil.copytree(crashed_run, tmp_path, dirs_exist_ok=True)
    cfg = tiny(tmp_path, checkpoint_every=5)
    return cfg, os.path.join(checkpoint.checkpoint_dir(cfg.run_dir()), "ckpt-00000010.pt")


@pytest.mark.slow
def test_a_truncated_latest_checkpoint_falls_back_to_the_older_one(crashed_run, tmp_path):
    """Issue 23: a truncated latest checkpoint failed every rerun; the older kept one is now tried (and named)."""
    cfg, path = _copy_of(crashed_run, tmp_path)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(CheckpointError, match="unreadable \\(truncated or corrupt\\)"):
        checkpoint.load_file(path)
    rec = run(cfg, echo=False, timeout_s=120)
    assert rec["resumed_from_step"] == 5
    log = open(os.path.join(cfg.run_dir(), "launch.log")).read()
    assert "ckpt-00000010.pt: unreadable (truncated or corrupt)" in log and "resumed from step 5" in log
    assert max_abs_diff(final_params(cfg), reference_params()) <= 1e-6


@pytest.mark.slow
def test_every_kept_checkpoint_truncated_fails_naming_the_file(crashed_run, tmp_path):
    cfg, path = _copy_of(crashed_run, tmp_path)
    for p in (path, path.replace("00000010", "00000005")):
        with open(p, "r+b") as f:
            f.truncate(os.path.getsize(p) // 2)
    with pytest.raises(RunFailed) as e:
        run(cfg, echo=False, timeout_s=120)
    assert e.value.status == "failed"
    assert f"CheckpointError: checkpoint {path}" in e.value.error or \
        f"CheckpointError: checkpoint {os.path.abspath(path)}" in e.value.error
    assert "truncated or corrupt" in e.value.error


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.slow
def test_malicious_pickle_checkpoint_is_refused(crashed_run, tmp_path):
    cfg, path = _copy_of(crashed_run, tmp_path)
    marker = tmp_path / "pwned"
    torch.save({"step": 10, "model": _Evil(marker), "optimizer": {}, "rng": []}, path)
    with pytest.raises(RunFailed) as e:
        run(cfg, echo=False, timeout_s=120)
    assert "refused: it is not a weights-only checkpoint" in e.value.error and path in e.value.error
    assert not marker.exists(), "the pickle's payload ran"
    assert [r["status"] for r in manifest_rows(cfg)][-1] == "failed"
