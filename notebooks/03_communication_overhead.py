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
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 Communication overhead: total, exposed and overlapped all-reduce time
#
# Each point runs twice: once with a communication hook that times every DDP bucket's all-reduce, once with
# a no-op hook (same bucketing, no network). Exposed communication = T_allreduce - T_noop. Points are
# placements (`"NxP"`; `1x2` and `2x1` put the same 2 processes on one node and across two), bucket sizes
# and, on NCCL, `nccl_algos` (`NCCL_ALGO`; every `NCCL_*` variable is recorded). With `emulate_latency_s` /
# `emulate_bandwidth_bytes_per_s` the multi-node runs go through an emulated inter-node link of that
# latency and bandwidth (a known cost added in the hook, for calibration and what-if questions).

# %% tags=["parameters"]
placements: list[str] = ["1x2", "2x1"]  # N nodes x P processes per node (communication needs 2+ processes)
world_sizes: list[int] = []  # instead of placements: N processes as N / procs_per_node nodes
procs_per_node: int = 0  # with world_sizes: 0 puts all processes on one node
bucket_caps_mb: list[float] = [0.05, 25.0]  # DDP bucket sizes in MiB
nccl_algos: list[str] = [""]  # e.g. ["Ring", "Tree"] on NCCL; "" lets NCCL choose
comm_hooks: list[str] = ["timed"]  # timed | bf16 | fp16 | powersgd (each run beside a no-op run)
emulate_latency_s: float = 0.0  # emulated inter-node latency per message (s; multi-node runs only)
emulate_bandwidth_bytes_per_s: float = 0.0  # emulated inter-node bandwidth (0: no limit)
model: str = "kan"  # kan | kan_rbf | kan_cheb | mlp
kan_impl: str = "fast"  # compiled | fast | reference
widths: list[int] = [2, 64, 64, 1]  # layer widths, input first
grid_size: int = 5  # spline grid intervals
task: str = "exp_sin"  # exp_sin | highdim | product | file (widths[0] must match its inputs)
global_batch: int = 256  # samples per step summed over all processes
steps: int = 25  # optimizer steps, warm-up included
warmup_steps: int = 5  # steps excluded from timing
repeats: int = 2  # separate runs per point
n_train: int = 16384  # training samples generated from the seed (task file: at most this many rows)
data_path: str = ""  # task file: a CSV (header, numeric columns) or .npz (x, y) of real data
target: str = ""  # task file, CSV: the target column (default: the last one)
threads: int = 1  # torch threads per process
backend: str = "auto"  # auto (nccl on GPU, gloo on CPU) | gloo | nccl
device: str = "auto"  # auto | cpu | cuda
launcher: str = "local"  # local (torchrun here; NxP with N > 1 runs N torchruns here) | multinode | slurm
launcher_opts: dict = {}  # slurm site settings, e.g. {"partition": "gpu", "gpus_per_node": 4, "time_limit": "00:30:00"}
out_dir: str = "../outputs"  # records go to out_dir/<study>/<run_key>/
timeout_s: float = 900.0  # per-run deadline in seconds

# %%
import pandas as pd

from runners import notebook, studies
from runners.sweep import SUMMARY_COLUMNS, run_sweep

params = notebook.check_parameters(globals())
base = notebook.base_config(params, emulate_latency_s=0.0, emulate_bandwidth_bytes_per_s=0.0)
configs = studies.communication(world_sizes or None, base, bucket_caps_mb=bucket_caps_mb, nccl_algos=nccl_algos,
                                repeats=repeats, procs_per_node=procs_per_node,
                                placements=None if world_sizes else placements, comm_hooks=comm_hooks,
                                emulate_latency_s=emulate_latency_s,
                                emulate_bandwidth_bytes_per_s=emulate_bandwidth_bytes_per_s)
print(f"{len(configs)} runs")

# %%
result = run_sweep(configs, launcher=launcher, launcher_opts=launcher_opts, timeout_s=timeout_s)

# %%
summary = pd.DataFrame(result.records)
summary[[c for c in SUMMARY_COLUMNS if c in summary]]

# %%
if result.failures:
    raise RuntimeError(f"{len(result.failures)} of {len(configs)} runs failed: "
                       + "; ".join(m.splitlines()[0] for _, m in result.failures))
