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
# # 01 Strong scaling: fixed global batch, growing process count
#
# Launches one `torchrun` job per placement, work size and repeat through `runners` (locally, or on SLURM
# with `launcher="slurm"`), and collects one record per run under `out_dir/strong_scaling/`. A placement
# `"NxP"` is N nodes x P processes per node: `1x2` and `2x1` are both 2 processes, on one node and across
# two (locally, `2x1` runs two torchruns on this host joined by one rendezvous). Several global batches and
# widths give several work sizes per process, from latency-bound to compute-bound. The companion notebook
# `01_strong_scaling_analysis` turns the records into speedup and efficiency figures. Defaults are tiny
# (CPU, seconds per run); full-size parameters for a GPU cluster: `make study PARAMS_SET=gpu_cluster`
# (notebooks/params/gpu_cluster/).
#
# The parameters cell declares what the study sweeps; `config` sets any other `RunConfig` field
# (`kanlib/config.py`; its defaults for the rest) over `base_config`, the tiny defaults, which time Adam steps,
# not a converged model (README: recipes). `task` picks the data (`kanlib.data`): synthetic regression (`exp_sin`,
# `highdim`, `product`: any input width, 1 output), scikit-learn's bundled sets (`digits`: 8x8 images, 10 classes,
# so widths from 64 to 10, with `n_val` below 1797 and a global batch within the training rows; `diabetes`: 10
# inputs, 1 output, `n_val` below 442), a Feynman equation (`feynman:I.6.2`, ...: as many inputs as the equation
# has variables) or a file (`task="file"`, `data_path`, `target`), e.g.
# `papermill -p config '{"task": "digits"}' -p widths_list '[[64, 32, 10]]' ...`.

# %% tags=["parameters"]
placements: list[str] = ["1x1", "1x2"]  # N nodes x P processes per node
world_sizes: list[int] = []  # instead of placements: N processes as N / procs_per_node nodes
procs_per_node: int = 0  # with world_sizes: 0 puts all processes on one node
global_batches: list[int] = [512]  # samples per step summed over all processes, one work size each
widths_list: list[list[int]] = [[2, 32, 32, 1]]  # layer widths (input first), one model size each
paired: bool = False  # True: the i-th of widths_list with the i-th of global_batches (else every pair)
repeats: int = 1  # separate runs per point
config: dict = {}  # RunConfig fields not swept (kanlib/config.py), over base_config; e.g. {"steps": 40}
base_config: dict = {"steps": 10, "warmup_steps": 3, "optimizer": "adam", "lr": 0.001,
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
configs = plans.strong_scaling(world_sizes or None, base, repeats=repeats, procs_per_node=procs_per_node,
                               placements=None if world_sizes else placements, global_batches=global_batches,
                               widths_list=widths_list, paired=paired)
print(f"{len(configs)} runs: {len({c.placement for c in configs})} placements x "
      f"{len({(c.global_batch, c.widths) for c in configs})} work sizes x {repeats} repeats")

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
