# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     notebook_metadata_filter: kernelspec,jupytext,-jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 Time to accuracy: how soon each placement reaches a target validation loss
#
# Each placement trains until the validation loss (evaluated every `eval_every` steps, outside the timed
# region) reaches `target_val_loss`, or `steps` run out; the record keeps the steps, samples and training wall
# time to the target, and `steps.csv` the validation-loss curve. `modes`: `strong` keeps the global batch
# `global_batch` at every placement (the time-to-target speedup should equal the step speedup); `weak` gives
# each process `per_process_batch` samples, so the global batch grows with N and may cost statistical
# efficiency; each learning-rate rule of `lr_rules` (none, linear, sqrt: lr scaled by the global batch over
# `per_process_batch`, after `lr_warmup_steps` of warm-up) is a series of its own. `task` picks the data:
# `exp_sin`, `highdim`, `product` (synthetic regression), `digits` (classification: widths from 64 to 10,
# `n_val` below 1797, the target a cross-entropy), `diabetes` (10 inputs), `feynman:<name>` or `file`. Records
# go to `out_dir/time_to_accuracy/`; analysis in `07_time_to_accuracy_analysis`.
#
# `optimizer` and the grid parameters choose the recipe. The defaults (and the `study` set) time Adam to a loose
# target, cheap enough for CI and the 10-minute study. pykan's recipe, which reaches KAN-quality errors, is L-BFGS
# on the full batch with grid extension: time to RMSE 1e-3 (`target_val_loss` 1e-6, the mean squared error of a
# standardised target) on Feynman I.6.2, at one and two processes: `papermill -p optimizer lbfgs -p lr 1.0
# -p task feynman:I.6.2 -p widths 2,5,1 -p n_train 1024 -p n_val 1024 -p global_batch 1024 -p grid_extension 10,20
# -p grid_update_every 5 -p grid_update_until 30 -p steps 150 -p warmup_steps 2 -p eval_every 5
# -p target_val_loss 1e-6 -p modes strong -p placements 1x1,1x2 -p kan_impl fast ...`. On the 2-core machine both
# runs reached it at step 55 (the fifth step at grid 10), after 4.3 s of training at 1x1 and 8.8 s at 1x2 (a
# latency-bound model: every line-search evaluation all-reduces), 24 s for the whole notebook (docs/measurement.md).

# %% tags=["parameters"]
placements: list[str] = ["1x1"]  # N nodes x P processes per node (e.g. add "2x1")
modes: list[str] = ["strong"]  # strong (fixed global batch) | weak (fixed per-process batch)
target_val_loss: float = 0.5  # stop once the validation loss is at most this (digits: cross-entropy; ln 10 is chance)
eval_every: int = 10  # evaluate every this many steps (outside the timed region)
per_process_batch: int = 64  # weak mode: samples per process per step
lr_rules: list[str] = ["none", "linear"]  # weak mode: none | linear | sqrt
lr_warmup_steps: int = 0  # steps of linear learning-rate warm-up
model: str = "kan"  # kan | kan_rbf | kan_cheb | mlp
kan_impl: str = "compiled"  # compiled (falls back to fast with a warning) | fast | reference
widths: list[int] = [64, 16, 10]  # layer widths, input first (digits: 64 in, 10 out)
grid_size: int = 5  # spline grid intervals
task: str = "digits"  # digits (real: 8x8 images, 10 classes) | exp_sin | highdim | product | diabetes | feynman:<name> | file
global_batch: int = 128  # strong mode: samples per step summed over all processes
steps: int = 300  # the most optimizer steps a run may take, warm-up included
warmup_steps: int = 5  # steps excluded from the step-time median
lr: float = 0.01  # learning rate (before lr_rule; lbfgs: 1.0, its first trial step)
optimizer: str = "adam"  # adam | sgd | lbfgs (L-BFGS as pykan: full batch, global_batch equal to n_train)
grid_extension: list[int] = []  # finer grid sizes a run moves to in turn after grid_size, e.g. [10, 20]
grid_update_every: int = 0  # refit the grids to the data every this many steps of each grid stage (pykan: 5)
grid_update_until: int = 0  # ... until this step of each stage (0: through the stage)
repeats: int = 1  # separate runs per point
n_train: int = 16384  # training samples generated from the seed (task file: at most this many rows)
n_val: int = 360  # held-out validation samples (digits: below 1797, diabetes: below 442)
data_path: str = ""  # task file: a CSV (header, numeric columns) or .npz (x, y) of real data
target: str = ""  # task file, CSV: the target column (default: the last one)
threads: int = 1  # torch threads per process
backend: str = "auto"  # auto (nccl on GPU, gloo on CPU) | gloo | nccl
device: str = "auto"  # auto | cpu | cuda
launcher: str = "local"  # local (torchrun here; NxP with N > 1 runs N torchruns here) | multinode | slurm
launcher_opts: dict = {}  # slurm site settings, e.g. {"partition": "gpu", "gpus_per_node": 4, "time_limit": "00:30:00"}
out_dir: str = "../outputs"  # records go to out_dir/<study>/<run_key>/
timeout_s: float = 900.0  # per-run deadline in seconds
rerun_disturbed: bool = True  # run once more, at the end of its round, a run whose machine was busy during it

# %%
import pandas as pd

from runners import notebook, plans as studies  # runners/plans.py: the config builders of each study
from runners.sweep import SUMMARY_COLUMNS, run_sweep

params = notebook.check_parameters(globals())
base = notebook.base_config(params)
configs = [c for mode in modes for c in studies.time_to_accuracy(
    base, placements=placements, target_val_loss=target_val_loss, eval_every=eval_every, mode=mode,
    per_process_batch=per_process_batch, lr_rules=lr_rules, lr_warmup_steps=lr_warmup_steps, repeats=repeats)]
print(f"{len({c.run_key() for c in configs})} runs")

# %%
result = run_sweep(configs, launcher=launcher, launcher_opts=launcher_opts, timeout_s=timeout_s,
                   rerun_disturbed=rerun_disturbed)

# %%
summary = pd.DataFrame(result.records)
summary[[c for c in SUMMARY_COLUMNS + ["lr_rule", "reached_target", "steps_to_target", "time_to_target_s",
                                       "final_val_accuracy"] if c in summary]]

# %%
if result.failures:
    raise RuntimeError(f"{len(result.failures)} of {len(configs)} runs failed: "
                       + "; ".join(m.splitlines()[0] for _, m in result.failures))
