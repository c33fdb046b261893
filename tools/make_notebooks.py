"""Writes the study notebooks under notebooks/ (run: python tools/make_notebooks.py notebooks).

The notebooks are thin drivers: a tagged parameters cell, then calls into kanlib and runners.
Edit them here, regenerate, and commit both, so all notebooks keep one shape."""
import nbformat as nbf
import os, sys
OUT = sys.argv[1]

def md(s): return nbf.v4.new_markdown_cell(s.strip())
def code(s, tags=None):
    c = nbf.v4.new_code_cell(s.strip())
    if tags: c.metadata["tags"] = tags
    return c

def save(name, cells):
    nb = nbf.v4.new_notebook()
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbf.write(nb, os.path.join(OUT, name))

COMMON_PARAMS = '''
n_train: int = 16384  # training samples generated from the seed (task="file": at most this many rows)
data_path: str = ""  # task="file": a CSV (header, numeric columns) or .npz (x, y) of real data
target: str = ""  # task="file", CSV: the target column (default: the last one)
threads: int = 1  # torch threads per process
backend: str = "auto"  # auto (nccl on GPU, gloo on CPU) | gloo | nccl
device: str = "auto"  # auto | cpu | cuda
launcher: str = "local"  # local (one torchrun here) | multinode (nnodes torchruns, c10d) | slurm (sbatch, waits)
launcher_opts: dict = {}  # slurm site settings, e.g. {"partition": "gpu", "gpus_per_node": 4, "time_limit": "00:30:00"}
procs_per_node: int = 0  # 0: all processes on one node; else world size = nodes x procs_per_node
out_dir: str = "../outputs"  # records go to out_dir/<study>/<run_key>/
timeout_s: float = 900.0  # per-run deadline in seconds
'''

LAUNCH_TAIL = [
    code('''
result = run_sweep(configs, launcher=launcher, launcher_opts=launcher_opts, timeout_s=timeout_s)
'''),
    code('''
summary = pd.DataFrame(result.records)
summary[[c for c in SUMMARY_COLUMNS if c in summary]]
'''),
    code('''
if result.failures:
    raise RuntimeError(f"{len(result.failures)} of {len(configs)} runs failed: " + "; ".join(m.splitlines()[0] for _, m in result.failures))
'''),
]

IMPORTS = '''
import pandas as pd

from kanlib.config import RunConfig
from runners import studies
from runners.sweep import SUMMARY_COLUMNS, run_sweep
'''

def base_cfg(extra=""):
    return f'''
base = RunConfig(model=model, widths=tuple(widths), grid_size=grid_size, kan_impl=kan_impl, task=task,
                 steps=steps, warmup_steps=warmup_steps, n_train=n_train, data_path=data_path, target=target,
                 threads=threads, backend=backend, device=device,
                 out_dir=out_dir{extra})
'''

# ---- 01 strong
save("01_strong_scaling.ipynb", [
    md('''
# 01 Strong scaling: fixed global batch, growing world size

Launches one `torchrun` job per world size and repeat through `runners` (locally, or on SLURM with
`launcher="slurm"`), and collects one record per run under `out_dir/strong_scaling/`. The companion
notebook `01_strong_scaling_analysis.ipynb` turns the records into speedup and efficiency figures.
Defaults are tiny (CPU, seconds per run); full-size parameters: `papermill -f strong_scaling_gpu.yaml`.
'''),
    code('''
world_sizes: list[int] = [1, 2]  # processes per run
model: str = "kan"  # kan | kan_rbf | kan_cheb | mlp
kan_impl: str = "fast"  # exact B-spline path: fast | reference
widths: list[int] = [2, 32, 32, 1]  # layer widths, input first
grid_size: int = 5  # spline grid intervals
task: str = "exp_sin"  # exp_sin | highdim | product | file (widths[0] must match its inputs)
global_batch: int = 512  # samples per step summed over all processes
steps: int = 25  # optimizer steps, warm-up included
warmup_steps: int = 5  # steps excluded from timing
repeats: int = 2  # separate runs per point
''' + COMMON_PARAMS, tags=["parameters"]),
    code(IMPORTS + base_cfg(", global_batch=global_batch") + '''
configs = studies.strong_scaling(world_sizes, base, repeats=repeats, procs_per_node=procs_per_node)
print(f"{len(configs)} runs: world sizes {world_sizes} x {repeats} repeats, global batch {global_batch}")
'''),
    *LAUNCH_TAIL,
])

def analysis(name, study, title, extra_cells):
    save(name, [
        md(f'''
# {title}: analysis

Loads the `{study}` records under `out_dir`, derives the table in `kanlib.results` (medians over
repeats with bootstrap 95% intervals) and draws the figures of `kanlib.plots`; each figure is also
written as a self-contained HTML file under `fig_dir` (opens offline). The explorer at the end needs a
live kernel.
'''),
        code('''
out_dir: str = "../outputs"  # where the launch notebook wrote records
fig_dir: str = ""  # offline HTML figures go here; empty: <out_dir>/figures
''', tags=["parameters"]),
        code(f'''
import os

import plotly.io as pio
from IPython.display import display

from kanlib import plots, report, results

pio.renderers.default = "notebook"  # embed plotly.js so exported notebooks render offline
fig_dir = fig_dir or os.path.join(out_dir, "figures")
a = report.analyze(out_dir, "{study}")
a.show()
'''),
        code('''
saved = a.save(fig_dir)
print("\\n".join(saved) if saved else "no figures written")
'''),
        *extra_cells,
        code('''
if not a.empty:
    display(plots.explorer(results.load_records(out_dir)))
'''),
    ])

analysis("01_strong_scaling_analysis.ipynb", "strong_scaling", "01 Strong scaling", [
    md("Amdahl's law fitted to the speedups, and the Karp-Flatt serial fraction per world size (rising with N means overhead that grows with N, such as communication)."),
    code('''
if not a.empty:
    s = results.fit_amdahl(a.table["world_size"], a.table["speedup"])
    print(f"Amdahl serial fraction s = {s:.4f}; predicted speedup at 8, 64, 1024 processes: "
          + ", ".join(f"{v:.2f}" for v in results.amdahl_speedup([8, 64, 1024], s)))
    display(a.table[["model", "world_size", "n_runs", "step_time_s", "speedup", "speedup_lo", "speedup_hi",
                     "efficiency", "karp_flatt"]])
'''),
])

# ---- 02 weak
save("02_weak_scaling.ipynb", [
    md('''
# 02 Weak scaling: fixed per-process batch, growing world size

Global batch = per-process batch x N. Records go to `out_dir/weak_scaling/`; analysis in
`02_weak_scaling_analysis.ipynb`.
'''),
    code('''
world_sizes: list[int] = [1, 2]  # processes per run
per_process_batches: list[int] = [64, 256]  # samples per process per step
model: str = "kan"  # kan | kan_rbf | kan_cheb | mlp
kan_impl: str = "fast"  # fast | reference
widths: list[int] = [2, 32, 32, 1]  # layer widths, input first
grid_size: int = 5  # spline grid intervals
task: str = "exp_sin"  # exp_sin | highdim | product | file (widths[0] must match its inputs)
steps: int = 25  # optimizer steps, warm-up included
warmup_steps: int = 5  # steps excluded from timing
repeats: int = 1  # separate runs per point
''' + COMMON_PARAMS, tags=["parameters"]),
    code(IMPORTS + base_cfg() + '''
configs = studies.weak_scaling(world_sizes, base, per_process_batches=per_process_batches, repeats=repeats,
                               procs_per_node=procs_per_node)
print(f"{len(configs)} runs")
'''),
    *LAUNCH_TAIL,
])
analysis("02_weak_scaling_analysis.ipynb", "weak_scaling", "02 Weak scaling", [
    md("Efficiency against N0 and against the first multi-process point: the published study saw a drop from 1 to several GPUs, then stable throughput."),
    code('''
if not a.empty:
    display(a.table[["local_batch", "world_size", "n_runs", "throughput", "per_process_throughput",
                     "weak_efficiency", "weak_efficiency_multi"]])
'''),
])

# ---- 03 comm
save("03_communication_overhead.ipynb", [
    md('''
# 03 Communication overhead: total, exposed and overlapped all-reduce time

Each point runs twice: once with an all-reduce hook that times every DDP bucket, once with a no-op
hook (same bucketing, no network). Exposed communication = T_allreduce - T_noop. On NCCL,
`nccl_algos` sets `NCCL_ALGO` (Ring, Tree); every `NCCL_*` variable is recorded.
'''),
    code('''
world_sizes: list[int] = [2]  # processes per run (communication needs N >= 2)
bucket_caps_mb: list[float] = [0.05, 25.0]  # DDP bucket sizes in MiB
nccl_algos: list[str] = [""]  # e.g. ["Ring", "Tree"] on NCCL; "" lets NCCL choose
model: str = "kan"  # kan | kan_rbf | kan_cheb | mlp
kan_impl: str = "fast"  # fast | reference
widths: list[int] = [2, 64, 64, 1]  # layer widths, input first
grid_size: int = 5  # spline grid intervals
task: str = "exp_sin"  # exp_sin | highdim | product | file (widths[0] must match its inputs)
global_batch: int = 256  # samples per step summed over all processes
steps: int = 25  # optimizer steps, warm-up included
warmup_steps: int = 5  # steps excluded from timing
repeats: int = 2  # separate runs per point
''' + COMMON_PARAMS, tags=["parameters"]),
    code(IMPORTS + base_cfg(", global_batch=global_batch") + '''
configs = studies.communication(world_sizes, base, bucket_caps_mb=bucket_caps_mb, nccl_algos=nccl_algos,
                                repeats=repeats, procs_per_node=procs_per_node)
print(f"{len(configs)} runs")
'''),
    *LAUNCH_TAIL,
])
analysis("03_communication_overhead_analysis.ipynb", "communication", "03 Communication overhead", [
    md("Per point: step time with and without the network, total bucket all-reduce time, exposed part, overlap."),
    code('''
if not a.empty:
    display(a.table[["world_size", "bucket_cap_mb", "nccl_algo", "n_runs", "t_allreduce_s", "t_noop_s",
                     "comm_total_s", "exposed_s", "exposed_clipped", "overlap_fraction", "overhead_fraction"]])
'''),
    md("An alpha-beta (latency-bandwidth) model of the ring all-reduce, fitted to the timed runs (`kanlib.commmodel`), extrapolates the best measured point to thousands of processes. Override `alpha_s` / `bandwidth_bytes_per_s` below to predict a cluster whose network you know."),
    code('''
if "comm_model" in a.extra:
    from kanlib import commmodel

    m, basis = a.extra["comm_model"], a.extra["basis"]
    print(f"fitted: alpha={m.alpha:.3g} s, beta={m.beta:.3g} s/byte (0: bandwidth not resolved), {m.n_points} runs, "
          f"relative error {m.rel_rmse:.0%}; basis: {basis}")
    display(a.extra["prediction"])
'''),
])

# ---- 04 model size
save("04_model_size_scaling.ipynb", [
    md('''
# 04 Model-size scaling: KAN against a matched-parameter MLP

Sweeps hidden width, depth and grid size; each KAN runs beside an MLP with (as near as possible) the same
parameter count. Records go to `out_dir/model_size/`.
'''),
    code('''
hidden_widths: list[int] = [8, 32, 64]  # hidden layer widths
depths: list[int] = [2]  # numbers of hidden layers
grid_sizes: list[int] = [5]  # spline grid intervals
with_mlp: bool = True  # add a matched-parameter MLP per KAN
world_size: int = 1  # processes per run
model: str = "kan"  # the KAN kind: kan | kan_rbf | kan_cheb
kan_impl: str = "fast"  # fast | reference
widths: list[int] = [2, 1]  # input and output width (hidden layers come from hidden_widths)
grid_size: int = 5  # unused here (grid_sizes sweeps it); kept for the shared base config
task: str = "exp_sin"  # exp_sin | highdim | product | file (widths[0] must match its inputs)
global_batch: int = 256  # samples per step
steps: int = 20  # optimizer steps, warm-up included
warmup_steps: int = 5  # steps excluded from timing
repeats: int = 1  # separate runs per point
''' + COMMON_PARAMS, tags=["parameters"]),
    code(IMPORTS + base_cfg(", global_batch=global_batch") + '''
configs = studies.model_size(hidden_widths, base, grid_sizes=grid_sizes, depths=depths, with_mlp=with_mlp,
                             repeats=repeats, world_size=world_size)
print(f"{len(configs)} runs")
'''),
    *LAUNCH_TAIL,
])
analysis("04_model_size_scaling_analysis.ipynb", "model_size", "04 Model-size scaling", [
    md("Parameters per byte of memory and time per parameter, KAN against matched MLP. On CPU, peak memory is the process's peak resident set (it includes the framework's fixed footprint); `params_per_state_byte` uses the analytic parameter + gradient + optimizer bytes."),
    code('''
if not a.empty:
    display(a.table[["model", "widths", "grid_size", "n_params", "step_time_s", "peak_mem_bytes",
                     "params_per_byte", "params_per_state_byte", "time_per_param_s"]])
'''),
])

# ---- 05 guidelines
save("05_guidelines.ipynb", [
    md('''
# 05 Deployment guidelines, computed from the records

For a target efficiency and a per-process memory and step-time budget: the largest world size and the
smallest per-process batch that reach the target, the bucket size that minimises exposed communication,
and the model size beyond which memory rather than time limits a process. Every answer is computed by
`kanlib.guidelines` from the records under `out_dir`; change the records and the answers change. Also
writes `out_dir/report.html`, which collects every study's tables and figures.
'''),
    code('''
out_dir: str = "../outputs"  # records of the studies
target_efficiency: float = 0.8  # parallel efficiency to reach
memory_budget_gib: float = 80.0  # memory per process (A100 80GB: 80)
step_time_budget_s: float = 1.0  # acceptable time per training step
''', tags=["parameters"]),
    code('''
from IPython.display import display

from kanlib import guidelines, report

g = guidelines.from_out_dir(out_dir, target_efficiency=target_efficiency,
                            memory_budget_bytes=memory_budget_gib * 2**30, step_time_budget_s=step_time_budget_s)
display(g.table)
print("\\n".join(g.sentences))
'''),
    code('''
path = report.build_report(out_dir, guidelines=g)
print(f"report: {path}")
'''),
])
