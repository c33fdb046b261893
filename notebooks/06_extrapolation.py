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
# # 06 Extrapolation: predicted scaling to thousands of GPUs
#
# The performance model of `kanlib.analysis.commmodel` (DDP's buckets, overlap with backward, ring or tree all-reduce
# over intra- and inter-node links) predicts strong-scaling efficiency and the exposed share of the step from
# 1 to `max_world_size` GPUs for each KAN size of `kan_sizes`, each bucket size and each algorithm. The links
# come from the collective-benchmark fit of `out_dir` (notebook 03) and the compute from its single-process
# runs (notebook 01) when they exist (`source="auto"`), otherwise from the hardware preset `preset`
# (specifications, marked as a preset, not a measurement). With measured links the measured strong-scaling
# points are overlaid beside the model's prediction for the same configuration. Also: where tree all-reduce
# overtakes ring per message size, and which sizes stay at or above `target_efficiency` at `at_world_size`
# GPUs. With measured links a step waits for the slowest of N ranks: each rank's compute varies as the no-op runs'
# (or, without them, the one-process runs') per-step times did, a lognormal beyond what was measured, slowed by the
# contention the DDP runs showed; the shaded band spans the spread's bootstrap interval and the model's largest
# leave-one-out error on those DDP runs, and the thin lines are the optimistic bound without stragglers or
# contention. Neither has congestion or NIC sharing. When the model failed its leave-one-out check the message says
# so: read the curves as a what-if, not guidance. With preset links no stragglers are assumed (the optimistic
# bound). The report (05) shows the same analysis with these parameters (they are kept in
# `out_dir/extrapolation.json`).

# %% tags=["parameters"]
out_dir: str = "../outputs"  # records of the studies (collbench and strong-scaling runs)
fig_dir: str = ""  # offline HTML figures go here; empty: <out_dir>/figures
code: str = "newest"  # code versions: newest | all | one code_version
source: str = "auto"  # auto (measured when the folder has benchmark records) | measured | preset
preset: str = "h100-ndr"  # hardware preset: a100-hdr | h100-ndr | h200-ndr
kan_sizes: list[list[int]] = [[64, 256, 256, 1], [64, 1024, 1024, 1], [256, 4096, 4096, 1]]  # KAN widths to predict
bucket_caps_mb: list[float] = [1.0, 25.0]  # DDP bucket sizes in MiB
algos: list[str] = ["ring", "tree"]  # all-reduce algorithms: ring | tree
global_batch: int = 65536  # global batch of the strong-scaling prediction
max_world_size: int = 4096  # largest world size predicted (a power of two)
gpus_per_node: int = 0  # processes per node (0: the preset's, or the most the benchmark ran on one node)
target_efficiency: float = 0.8  # efficiency a size must keep
at_world_size: int = 1024  # the world size at which sizes are checked against the target
bench_time_col: str = "time_s_p10"  # benchmark time fitted: time_s_p10 (lower decile) | time_s (median)

# %%
from runners import notebook

params = notebook.check_parameters(globals())

# %%
from kanlib import report

a = report.extrapolation(out_dir, code=code, preset_name=preset, kan_sizes=kan_sizes, bucket_caps_mb=bucket_caps_mb,
                         algos=algos, target_efficiency=target_efficiency, at_world_size=at_world_size,
                         max_world_size=max_world_size, global_batch=global_batch, gpus_per_node=gpus_per_node,
                         source=source, bench_time_col=bench_time_col, remember=True)
a.show()

# %%
a.save_figures(fig_dir)
