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
# # 03 Communication overhead: total, exposed and overlapped all-reduce time; the link model; DDP options
#
# Each point runs twice: once with a communication hook that times every DDP bucket's all-reduce, once with
# a no-op hook (same bucketing, no network). Exposed communication = T_allreduce - T_noop. Points are
# placements (`"NxP"`; `1x2` and `2x1` put the same 2 processes on one node and across two), bucket sizes
# and, on NCCL, `nccl_algos` (`NCCL_ALGO`; every `NCCL_*` variable is recorded).
#
# **KAN against its matched-parameter MLP** (at `mlp_bucket_caps_mb`, every placement): the MLP with the KAN's
# input and output widths and the parameter count nearest the KAN's (`kanlib.model.matched_mlp`), so the all-reduce
# carries nearly the same gradient bytes, runs beside the KAN with the same global batch, its own no-op twin and the
# same repeats, in the same rounds. The analysis compares their exposed and total communication round by round:
# whether the overhead comes from the all-reduce and the link, whatever the model, or from KAN's gradients.
#
# **Data-parallel options** (at `option_placements` and `option_bucket_caps_mb`, each beside its own no-op
# twin and plain DDP): the compressed hooks of `comm_hooks` (bf16, fp16, PowerSGD with `powersgd_rank`) and the
# DDP settings of `options` (each a dict of config fields: `grad_accum_steps`, `gradient_as_bucket_view`,
# `static_graph`, `bucket_cap_mb`, ...). The analysis sets their step time, exposed communication and
# validation loss after the same samples beside plain DDP's.
#
# **Calibration**: the collective benchmark (`kanlib.collbench`, nccl-tests style: all-reduce after a barrier
# over message sizes) runs at `collbench_placements`, and again at `emulate_placements` through an emulated
# inter-node link of `emulate_latency_s` / `emulate_bandwidth_bytes_per_s`; the DDP runs at `emulate_placements`
# also run through it. The analysis fits each link's latency and bandwidth on the benchmark, checks that it
# recovers what was injected, and predicts every DDP run from it. Records: `out_dir/communication/` and
# `out_dir/collbench/`.

# %% tags=["parameters"]
placements: list[str] = ["1x2"]  # N nodes x P processes per node (communication needs 2+ processes)
world_sizes: list[int] = []  # instead of placements: N processes as N / procs_per_node nodes
procs_per_node: int = 0  # with world_sizes: 0 puts all processes on one node
bucket_caps_mb: list[float] = [25.0]  # DDP bucket sizes in MiB
nccl_algos: list[str] = [""]  # e.g. ["Ring", "Tree"] on NCCL; "" lets NCCL choose
repeats: int = 1  # separate runs per point
mlp_bucket_caps_mb: list[float] = [25.0]  # bucket sizes where the KAN runs beside its matched MLP ([] for none)
comm_hooks: list[str] = ["bf16"]  # compressed hooks beside plain DDP: bf16 | fp16 | powersgd (config's powersgd_rank)
options: list[dict] = []  # DDP settings beside plain DDP, e.g. {"static_graph": True}, {"grad_accum_steps": 2}
option_placements: list[str] = ["1x2"]  # where the hooks and options run
option_repeats: int = 1  # separate runs per option (their validation losses are deterministic)
option_bucket_caps_mb: list[float] = [25.0]  # bucket sizes of the option runs
emulate_latency_s: float = 0.005  # emulated inter-node latency per message (s) at emulate_placements (0 for none)
emulate_bandwidth_bytes_per_s: float = 0.0  # emulated inter-node bandwidth (0 for no limit)
emulate_placements: list[str] = []  # multi-node placements also run through the emulated link
emulate_bucket_caps_mb: list[float] = [25.0]  # bucket sizes of the emulated-link DDP runs
collbench_placements: list[str] = ["1x2"]  # collective-benchmark placements (the machine's own links)
collbench_repeats: int = 1  # benchmark runs per placement
config: dict = {}  # RunConfig fields not swept (kanlib/config.py), over base_config; e.g. {"steps": 40}
base_config: dict = {"widths": [2, 64, 64, 1], "global_batch": 256, "steps": 12, "warmup_steps": 3,
                     "optimizer": "adam", "lr": 0.001,
                     "n_train": 16384}  # under config: tiny, for CI; a parameter set's launch.yaml replaces them all
bench_config: dict = {"max_bytes": 67108864, "size_factor": 4, "iters": 10}  # BenchConfig fields (kanlib/collbench.py)
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
configs = plans.communication(world_sizes or None, base, bucket_caps_mb=bucket_caps_mb, nccl_algos=nccl_algos,
                              repeats=repeats, procs_per_node=procs_per_node,
                              placements=None if world_sizes else placements, mlp_bucket_caps_mb=mlp_bucket_caps_mb)
# the data-parallel options, each beside plain DDP and its no-op twin, after the same samples
configs += plans.communication_options(base, option_placements, option_bucket_caps_mb, comm_hooks, options,
                                       nccl_algos=nccl_algos, repeats=option_repeats)
# the known signal: DDP runs and the collective benchmark (bench_config, on the runs' machine settings) through an
# emulated inter-node link
emulated, bench = plans.calibration(base, bench_config, emulate_placements, emulate_latency_s,
                                    emulate_bandwidth_bytes_per_s, emulate_bucket_caps_mb, collbench_placements,
                                    nccl_algos=nccl_algos, repeats=repeats, bench_repeats=collbench_repeats)
configs += emulated
print(f"{len({c.run_key() for c in configs})} training runs and {len({c.run_key() for c in bench})} benchmark runs")

# %%
result = run_sweep(configs + bench, launcher=launcher, launcher_opts=launcher_opts, timeout_s=timeout_s,
                   rerun_disturbed=rerun_disturbed)

# %%
summary = pd.DataFrame([r for r in result.records if r.get("record_kind", "train") == "train"])
summary[[c for c in SUMMARY_COLUMNS + ["grad_accum_steps", "emulate_latency_s"] if c in summary]]

# %%
if result.failures:
    raise RuntimeError(f"{len(result.failures)} of {len(configs) + len(bench)} runs failed: "
                       + "; ".join(m.splitlines()[0] for _, m in result.failures))
