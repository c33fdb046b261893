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
# region) reaches `target_val_loss`, or `steps` run out (`RunConfig` fields, set in `config` over the tiny
# `base_config`); the record keeps the steps, samples and training wall time to the target, and `steps.csv` the
# validation-loss curve. `modes`: `strong` keeps the config's `global_batch` at every placement (the time-to-target
# speedup should equal the step speedup); `weak` gives each process `per_process_batch` samples, so the global
# batch grows with N and may cost statistical efficiency; each learning-rate rule of `lr_rules` (none, linear,
# sqrt: lr scaled by the global batch over `per_process_batch`, after the config's `lr_warmup_steps` of warm-up) is
# a series of its own. `task` picks the data: `exp_sin`, `highdim`, `product` (synthetic regression), `digits`
# (classification: widths from 64 to 10, `n_val` below 1797, the target a cross-entropy), `diabetes` (10 inputs),
# `feynman:<name>` or `file`. Records go to `out_dir/time_to_accuracy/`; analysis in `07_time_to_accuracy_analysis`.
#
# `optimizer` and the grid fields choose the recipe. The defaults (and the `study` set) time Adam to a loose
# target, cheap enough for CI and the 10-minute study. pykan's recipe, which reaches KAN-quality errors, is L-BFGS
# on the full batch with grid extension (RunConfig's defaults, so `base_config` is emptied: lbfgs, lr 1.0, 1024
# samples in one batch): time to RMSE 1e-3 (`target_val_loss` 1e-6, the mean squared error of a standardised
# target) on Feynman I.6.2, at one and two processes: `papermill -p base_config '{}' -p config '{"task":
# "feynman:I.6.2", "widths": [2, 5, 1], "n_val": 1024, "grid_extension": [10, 20], "grid_update_every": 5,
# "grid_update_until": 30, "steps": 150, "warmup_steps": 2, "eval_every": 5, "target_val_loss": 1e-6, "kan_impl":
# "fast"}' -p modes strong -p placements 1x1,1x2 ...`. On the 2-core machine both runs reached it at step 55 (the
# fifth step at grid 10), after 4.3 s of training at 1x1 and 8.8 s at 1x2 (a latency-bound model: every
# line-search evaluation all-reduces), 24 s for the whole notebook (docs/measurement.md).

# %% tags=["parameters"]
placements: list[str] = ["1x1"]  # N nodes x P processes per node (e.g. add "2x1")
modes: list[str] = ["strong"]  # strong (config's global batch) | weak (per_process_batch per process)
per_process_batch: int = 64  # weak mode: samples per process per step
lr_rules: list[str] = ["none", "linear"]  # weak mode: none | linear | sqrt
repeats: int = 1  # separate runs per point
config: dict = {}  # RunConfig fields not swept (kanlib/config.py), over base_config; e.g. {"steps": 40}
base_config: dict = {"task": "digits", "widths": [64, 16, 10], "global_batch": 128, "steps": 300, "optimizer": "adam",
                     "lr": 0.01, "n_train": 16384, "n_val": 360, "target_val_loss": 0.5,
                     "eval_every": 10}  # under config: tiny, for CI; a parameter set's launch.yaml replaces them all
launcher: str = "local"  # local (torchrun here; NxP with N > 1 runs N torchruns here) | multinode | slurm
launcher_opts: dict = {}  # slurm site settings, e.g. {"partition": "gpu", "gpus_per_node": 4, "time_limit": "00:30:00"}
out_dir: str = "../outputs"  # records go to out_dir/<study>/<run_key>/
timeout_s: float = 900.0  # per-run deadline in seconds
rerun_disturbed: bool = True  # run once more, at the end of its round, a run whose machine was busy during it

# %%
import pandas as pd

from runners import notebook, plans  # runners/plans.py: the config builders of each study
from runners.sweep import SUMMARY_COLUMNS, run_sweep

notebook.check_parameters(globals())
base = plans.settings(base_config, config, out_dir=out_dir)  # RunConfig fields; the plan builds the configs
configs = [c for mode in modes for c in plans.time_to_accuracy(
    base, placements=placements, mode=mode, per_process_batch=per_process_batch, lr_rules=lr_rules, repeats=repeats)]
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
