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
# # 02 Weak scaling: fixed per-process batch, growing process count
#
# Global batch = per-process batch x N at each placement (`"NxP"`: N nodes x P processes per node). Records
# go to `out_dir/weak_scaling/`; analysis in `02_weak_scaling_analysis`. The published study saw efficiency
# drop from 1 to several GPUs, then stay stable: that needs at least two multi-process world sizes of one
# kind of placement (the cluster parameter file has them).

# %% tags=["parameters"]
placements: list[str] = ["1x1", "1x2"]  # N nodes x P processes per node
world_sizes: list[int] = []  # instead of placements: N processes as N / procs_per_node nodes
procs_per_node: int = 0  # with world_sizes: 0 puts all processes on one node
per_process_batches: list[int] = [64]  # samples per process per step
model: str = "kan"  # kan | kan_rbf | kan_cheb | mlp
kan_impl: str = "compiled"  # compiled (falls back to fast with a warning) | fast | reference
widths: list[int] = [2, 32, 32, 1]  # layer widths, input first
grid_size: int = 5  # spline grid intervals
task: str = "exp_sin"  # exp_sin | highdim | product | digits | diabetes | feynman:<name> | file
steps: int = 10  # optimizer steps, warm-up included
warmup_steps: int = 3  # steps excluded from timing
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
configs = studies.weak_scaling(world_sizes or None, base, per_process_batches=per_process_batches, repeats=repeats,
                               procs_per_node=procs_per_node, placements=None if world_sizes else placements)
print(f"{len(configs)} runs")

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
