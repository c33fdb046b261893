"""pykan's recipe through the trainer on real gloo processes: L-BFGS under DDP and FSDP (one and two processes
take the same steps), grid extension mid-run (new buckets and shards, the ranks equal), checkpoints that resume
across a grid switch, the defaults that train, notebook 07 with the recipe, and the scaling studies on Adam."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from kanlib.analysis import load as results
from kanlib.config import RunConfig
from runhelp import final_params, max_abs_diff
from runners.launch import run

pytestmark = pytest.mark.usefixtures("no_process_left")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cfg(out_dir, **kw) -> RunConfig:
    """Full-batch L-BFGS (5 iterations per step) on 512 samples of exp_sin, [2, 5, 1], evaluated every step."""
    base = dict(study="recipe", optimizer="lbfgs", lr=1.0, widths=(2, 5, 1), grid_size=5, steps=6, warmup_steps=2,
                n_train=512, n_val=512, global_batch=512, lbfgs_max_iter=5, eval_every=1, device="cpu",
                backend="gloo", threads=1, kan_impl="fast", pg_timeout_s=60.0, out_dir=str(out_dir))
    return RunConfig(**{**base, **kw})


def _val_curve(cfg: RunConfig) -> list[float]:
    steps = results.load_steps(cfg.run_dir())
    return [v for v in steps.val_loss.tolist() if not math.isnan(v)]


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_lbfgs_one_and_two_processes_take_the_same_steps(tmp_path, parallelism):
    one = _cfg(tmp_path, parallelism=parallelism)
    two = _cfg(tmp_path, parallelism=parallelism, nproc_per_node=2)
    r1, r2 = run(one, echo=False, timeout_s=300), run(two, echo=False, timeout_s=300)
    a, b = _val_curve(one), _val_curve(two)
    assert len(a) == len(b) == 5 and a[-1] < 0.1 * a[0]  # it trains
    # The same steps up to float32 rounding of the loss and gradient sums (one process sums 512 samples, two
    # sum 256 each), which L-BFGS amplifies from ~1e-7 at the first step to ~3e-5 by the fifth here.
    for x, y in zip(a, b):
        assert y == pytest.approx(x, rel=2e-4)
    assert r1["evals_per_step"] == r2["evals_per_step"] and 1 < r2["evals_per_step"] <= 6
    assert r2["n_evals"] == r1["n_evals"] and r2["final_grid_size"] == 5


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_grid_extension_mid_run_on_two_processes(tmp_path, parallelism):
    kw = dict(parallelism=parallelism, steps=8, grid_extension=(10,), grid_update_every=2, grid_eps=1.0)
    one = _cfg(tmp_path, **kw)
    two = _cfg(tmp_path, nproc_per_node=2, **kw)
    r1, r2 = run(one, echo=False, timeout_s=300), run(two, echo=False, timeout_s=300)
    # stage 1 (grid 10) starts at step 4; updates at steps 2 and 6 (never at a stage's first step)
    assert r1["final_grid_size"] == r2["final_grid_size"] == 10 and r1["n_grid_updates"] == r2["n_grid_updates"] == 2
    assert r2["n_params"] == 2 * 5 * (2 + 13) + 5 * 1 * (2 + 13)  # base, scaler and 13 coefficients per edge
    a, b = _val_curve(one), _val_curve(two)
    assert a[4] < a[3]  # training goes on at the finer grid (step 4 is the first at grid 10)
    for x, y in zip(a[:5], b[:5]):  # to the first step at grid 10 (the DDP replicas are compared at the end)
        assert y == pytest.approx(x, rel=2e-3)


@pytest.mark.slow
@pytest.mark.parametrize("parallelism,kill_at,resumed_from", [("ddp", 5, 4), ("ddp", 7, 6), ("fsdp", 7, 6)],
                         ids=["checkpoint-before-switch", "checkpoint-after-switch", "fsdp-checkpoint-after-switch"])
def test_resume_across_a_grid_switch(tmp_path, monkeypatch, parallelism, kill_at, resumed_from):
    """A rank killed after the switch to grid 10 (step 4): resumed from a checkpoint written before it (step
    4, grid 5: the resumed run refines at step 4 on the same batch) or after it (step 6, grid 10: the model is
    built at grid 5 and takes the finer state; L-BFGS its history, under FSDP each rank its shards of it), the
    run ends where an uninterrupted one does."""
    kw = dict(nproc_per_node=2, steps=8, grid_extension=(10,), checkpoint_every=2, grid_update_every=3,
              parallelism=parallelism)
    reference = _cfg(tmp_path / "ref", **kw)
    run(reference, echo=False, timeout_s=300)
    monkeypatch.setenv("KANLIB_FAULT", f"kill@1:{kill_at}")
    cfg = _cfg(tmp_path / "killed", **kw)
    rec = run(cfg, echo=False, timeout_s=300, max_restarts=1)
    assert rec["resumed_from_step"] == resumed_from and rec["attempt"] == 1 and rec["final_grid_size"] == 10
    assert max_abs_diff(final_params(cfg), final_params(reference)) <= 1e-6


@pytest.mark.slow
def test_the_defaults_train_exp_sin(tmp_path):
    """`python -m kanlib.train --task=exp_sin --widths=2,5,1` and nothing else: test RMSE <= 1e-2."""
    out = subprocess.run([sys.executable, "-m", "kanlib.train", "--task=exp_sin", "--widths=2,5,1",
                          f"--out_dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 0, out.stdout + out.stderr
    path = out.stdout.strip().splitlines()[-1].split("record=")[1]
    with open(path) as f:
        rec = json.load(f)
    assert rec["optimizer"] == "lbfgs" and rec["global_batch"] == rec["n_train"]
    assert math.sqrt(rec["final_val_loss"]) <= 1e-2, rec["final_val_loss"]


def _cli(tmp_path, *args: str) -> tuple[dict, list[float]]:
    """Run ``python -m kanlib.train ARGS --out_dir=tmp_path``; its record and training losses."""
    out = subprocess.run([sys.executable, "-m", "kanlib.train", *args, f"--out_dir={tmp_path}"], cwd=REPO,
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 0, out.stdout + out.stderr
    path = out.stdout.strip().splitlines()[-1].split("record=")[1]
    with open(path) as f:
        rec = json.load(f)
    return rec, results.load_steps(os.path.dirname(path)).loss.tolist()


@pytest.mark.slow
def test_lbfgs_on_mini_batches_of_digits_does_not_diverge(tmp_path):
    """Issue 34's case: L-BFGS (the default) on mini-batches of 256 of digits' 1024 training rows stopped with a
    non-finite loss (at step 17 here, 119 in the issue) as its line search followed a NaN trial; it trains now."""
    rec, losses = _cli(tmp_path, "--task=digits", "--widths=64,32,10", "--global_batch=256", "--steps=150")
    assert rec["optimizer"] == "lbfgs" and rec["global_batch"] == 256 and rec["n_skipped_steps"] == 0
    assert len(losses) == 150 and all(math.isfinite(v) for v in losses)
    assert math.isfinite(rec["final_val_loss"]) and rec["final_val_accuracy"] > 0.9


@pytest.mark.slow
@pytest.mark.parametrize("task,widths,batch", [("digits", "64,10", 256), ("diabetes", "10,1", 64),
                                               ("feynman:I.6.2", "2,5,1", 256), ("exp_sin", "2,16,16,1", 256)])
def test_the_defaults_train_every_task_on_mini_batches(tmp_path, task, widths, batch):
    """Every bundled task with the defaults (L-BFGS) at a mini-batch of its training set: finite losses that fall.
    The fast kernel computes what the default compiled one does, without its compilation (most of such a run)."""
    rec, losses = _cli(tmp_path, f"--task={task}", f"--widths={widths}", f"--global_batch={batch}", "--steps=10",
                       "--warmup_steps=2", "--kan_impl=fast")
    assert rec["optimizer"] == "lbfgs" and rec["global_batch"] == batch < min(rec["n_train"], 1024)
    assert all(math.isfinite(v) for v in losses) and math.isfinite(rec["final_val_loss"])
    assert max(losses[-3:]) < losses[0], losses
    if rec["final_val_accuracy"] is not None:
        assert rec["final_val_accuracy"] > rec["chance_accuracy"] + 0.5


@pytest.mark.slow
def test_fp64_trains_in_float64_on_one_and_two_processes(tmp_path):
    """precision=fp64: data, parameters, loss, L-BFGS's state and DDP's all-reduce (gloo) in float64. One and two
    processes take the same steps to float64's rounding (float32's differ by up to 2e-4 after five L-BFGS steps,
    test_lbfgs_one_and_two_processes_take_the_same_steps); the records say fp64 and the parameters are float64."""
    one = _cfg(tmp_path, precision="fp64", task="feynman:I.6.2")
    two = _cfg(tmp_path, precision="fp64", task="feynman:I.6.2", nproc_per_node=2)
    r1, r2 = run(one, echo=False, timeout_s=300), run(two, echo=False, timeout_s=300)
    for rec, cfg in ((r1, one), (r2, two)):
        assert rec["precision"] == "fp64" and rec["param_dtype"] == "float64" and rec["world_size"] == cfg.world_size
        assert {str(v.dtype) for v in final_params(cfg).values()} == {"torch.float64"}  # the grids too
    a, b = _val_curve(one), _val_curve(two)
    assert len(a) == len(b) == 5 and a[-1] < 0.1 * a[0]
    for x, y in zip(a, b):
        assert y == pytest.approx(x, rel=1e-9)


@pytest.mark.slow
def test_two_processes_lay_gradients_out_as_ddp_buckets_expect(tmp_path):
    """Issue 38: every 2-process run of the default (compiled) kernel warned "Grad strides do not match bucket view
    strides": a one-output layer's base_weight gradient was a (1, in) slice with strides ((1 + C) * in, 1)."""
    cfg = _cfg(tmp_path, nproc_per_node=2, kan_impl="compiled", steps=3, warmup_steps=1, eval_every=0)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
                          "kanlib.train", *cfg.to_cli()], cwd=REPO, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 0 and "world_size=2" in out.stdout, out.stdout + out.stderr
    assert "Grad strides" not in out.stderr, out.stderr


@pytest.mark.slow
def test_the_cli_gives_the_rmse_in_the_targets_units(tmp_path):
    """Issue 38: the CLI printed the validation MSE as "final_val_loss", and the record kept no target scale. The
    record has the mean and std the target was standardised with; the CLI prints MSE, RMSE and RMSE in units."""
    out = subprocess.run([sys.executable, "-m", "kanlib.train", "--task=feynman:I.6.2", "--widths=2,5,1",
                          "--n_train=512", "--steps=4", "--warmup_steps=1", "--kan_impl=fast", f"--out_dir={tmp_path}"],
                         cwd=REPO, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 0, out.stdout + out.stderr
    last = out.stdout.strip().splitlines()[-1]
    with open(last.split("record=")[1]) as f:
        rec = json.load(f)
    from kanlib.data import FeynmanRegression

    data = FeynmanRegression("feynman:I.6.2", 512, rec["n_val"], 0)
    assert (rec["target_mean"], rec["target_std"]) == (data.y_mean, data.y_std)
    fields = dict(kv.split("=", 1) for kv in last.split()[1:])
    rmse = math.sqrt(rec["final_val_loss"])
    assert float(fields["val_mse"]) == pytest.approx(rec["final_val_loss"], rel=1e-5)
    assert float(fields["val_rmse"]) == pytest.approx(rmse, rel=1e-5)
    assert float(fields["val_rmse_target_units"]) == pytest.approx(rmse * data.y_std, rel=1e-5)
    assert "final_val_loss" not in last


LAUNCH_NOTEBOOKS = ["01_strong_scaling", "02_weak_scaling", "03_communication_overhead", "04_model_size_scaling",
                    "07_time_to_accuracy", "08_compounding"]


def test_the_scaling_studies_keep_timing_adam():
    """The defaults changed to pykan's recipe; every launch notebook's tiny base_config and every parameter set's
    (launch.yaml) say Adam, each lr as before, and no notebook's own config changes the optimizer, so the studies
    time the steps they timed before."""
    import ast

    import papermill
    import yaml

    from runners import notebook

    for name in LAUNCH_NOTEBOOKS:
        base = ast.literal_eval(papermill.inspect_notebook(notebook.to_ipynb(name))["base_config"]["default"])
        assert (base["optimizer"], base["lr"]) == ("adam", 0.01 if name.startswith("07") else 0.001), name
    for path in sorted(__import__("glob").glob(os.path.join(REPO, "notebooks", "params", "*", "*.yaml"))):
        with open(path) as f:
            values = yaml.safe_load(f) or {}
        assert "optimizer" not in values and "optimizer" not in values.get("config", {}), path
        if os.path.basename(path) == "launch.yaml":
            assert (values["base_config"]["optimizer"], values["base_config"]["lr"]) == ("adam", 0.001), path
        elif os.path.basename(path).startswith("07"):
            assert values["config"]["lr"] == 0.01, path


@pytest.mark.slow
def test_time_to_accuracy_notebook_runs_pykans_recipe(tmp_path, monkeypatch):
    """Notebook 07 with L-BFGS, full batch and grid extension reaches a tight target (RMSE 3e-3 on Feynman
    I.6.2 at a small size here; its markdown gives the full command)."""
    import papermill

    from runners import notebook

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    config = dict(optimizer="lbfgs", lr=1.0, task="feynman:I.6.2", widths=[2, 5, 1], n_train=512, n_val=512,
                  global_batch=512, grid_extension=[10], grid_update_every=5, grid_update_until=10, steps=40,
                  warmup_steps=2, eval_every=4, target_val_loss=1e-5, kan_impl="fast")
    params = dict(out_dir=str(tmp_path), base_config={}, config=config, modes=["strong"], placements=["1x1"])
    papermill.execute_notebook(notebook.to_ipynb("07_time_to_accuracy", str(tmp_path / "nb")),
                               str(tmp_path / "out.ipynb"), parameters=params, cwd=notebook.NOTEBOOK_DIR,
                               progress_bar=False)
    (rec,) = results.load_records(str(tmp_path), "time_to_accuracy", disturbed="keep").to_dict("records")
    assert rec["optimizer"] == "lbfgs" and rec["reached_target"] and rec["evals_per_step"] > 1
