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
# # 04 Model-size scaling: KAN against a matched-parameter MLP, DDP against FSDP
#
# Sweeps hidden width, depth and grid size; each KAN runs beside an MLP with (as near as possible) the same
# parameter count, under each of `parallelisms`: DDP (replicated parameters) and FSDP
# (`torch.distributed.fsdp.fully_shard`: parameters, gradients and optimizer state sharded over the
# processes of each placement). The analysis sets peak memory per process and step time of both side by side and
# names the size from which FSDP pays (or says the data show none). Records go to `out_dir/model_size/`.

# %% tags=["parameters"]
hidden_widths: list[int] = [8]  # hidden layer widths (input and output: config's widths, first and last)
depths: list[int] = [2]  # numbers of hidden layers
grid_sizes: list[int] = [5]  # spline grid intervals
with_mlp: bool = True  # add a matched-parameter MLP per KAN
parallelisms: list[str] = ["ddp"]  # ddp | fsdp (each size under each)
placements: list[str] = ["1x2"]  # N nodes x P processes per node; FSDP shards over all N x P processes
repeats: int = 1  # separate runs per point
config: dict = {}  # RunConfig fields not swept (kanlib/config.py), over base_config; e.g. {"steps": 40}
base_config: dict = {"global_batch": 256, "steps": 10, "warmup_steps": 3, "optimizer": "adam", "lr": 0.001,
                     "n_train": 16384}  # under config: tiny, for CI; a parameter set's launch.yaml replaces them all
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
configs = plans.model_size(hidden_widths, base, grid_sizes=grid_sizes, depths=depths, with_mlp=with_mlp,
                           repeats=repeats, parallelisms=parallelisms, placements=placements)
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
