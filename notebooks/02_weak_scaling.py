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
repeats: int = 1  # separate runs per point
config: dict = {}  # RunConfig fields not swept (kanlib/config.py), over base_config; e.g. {"steps": 40}
base_config: dict = {"widths": [2, 32, 32, 1], "steps": 10, "warmup_steps": 3, "optimizer": "adam", "lr": 0.001,
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
configs = plans.weak_scaling(world_sizes or None, base, per_process_batches=per_process_batches, repeats=repeats,
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
