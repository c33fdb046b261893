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
configs = plans.compounding(base, placements=placements, impls=impls, repeats=repeats)
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
