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
# # 08 Compounding: does a faster KAN kernel multiply with the data-parallel speedup?
#
# Crosses the KAN layer implementation (`impls`: reference Cox-de Boor, fast closed form, compiled closed form)
# with placement: one run per kernel, placement and repeat, the same model, batch and steps. The analysis
# (`08_compounding_analysis`) sets the kernel speedup, the DDP speedup, their product and the measured
# combination side by side, grouped by the kernel path that actually ran (`kan_path`: a compiled run that fell
# back to the eager path is counted as what ran), and shows whether a faster kernel exposes communication and
# lowers the parallel efficiency. On CPU the compiled path compiles in every process (tens of seconds per run,
# `compile_s` in the record). Records go to `out_dir/compounding/`.

# %% tags=["parameters"]
placements: list[str] = ["1x1"]  # N nodes x P processes per node (e.g. add "2x1")
impls: list[str] = ["reference", "fast"]  # KAN kernels: reference | fast | compiled
widths: list[int] = [2, 32, 32, 1]  # layer widths, input first
grid_size: int = 5  # spline grid intervals
task: str = "exp_sin"  # exp_sin | highdim | product | digits | diabetes | feynman:<name> | file
global_batch: int = 1024  # samples per step summed over all processes
steps: int = 10  # optimizer steps, warm-up included
warmup_steps: int = 3  # steps excluded from timing (compilation happens in the first)
optimizer: str = "adam"  # adam | sgd | lbfgs; this study times steps, not a converged model (README: recipes)
lr: float = 0.001  # learning rate (adam, sgd; lbfgs: 1.0)
repeats: int = 1  # separate runs per point
n_train: int = 16384  # training samples generated from the seed (task file: at most this many rows)
n_val: int = 2048  # held-out validation samples (digits: below 1797, diabetes: below 442)
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
configs = studies.compounding(base, placements=placements, impls=impls, repeats=repeats)
print(f"{len(configs)} runs: {len(impls)} kernels x {len(placements)} placements x {repeats} repeats")

# %%
result = run_sweep(configs, launcher=launcher, launcher_opts=launcher_opts, timeout_s=timeout_s,
                   rerun_disturbed=rerun_disturbed)

# %%
summary = pd.DataFrame(result.records)
summary[[c for c in SUMMARY_COLUMNS if c in summary]]

# %%
if result.failures:
    raise RuntimeError(f"{len(result.failures)} of {len(configs)} runs failed: "
                       + "; ".join(m.splitlines()[0] for _, m in result.failures))
