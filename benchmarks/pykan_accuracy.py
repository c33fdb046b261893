"""Accuracy against pykan: pykan 0.2.8's recipe and kanlib's on pykan's examples, same data for both.

Run ``python -m benchmarks.pykan_accuracy`` (``--quick``: one task, one seed, 10 steps per grid size). Needs
pykan 0.2.8 beside the pinned torch (``make bench-pykan`` installs it with ``--no-deps``).

Per task (exp_sin = pykan's hello world f(x, y) = exp(sin(pi x) + y^2), and two Feynman equations), per seed:
the same 1000 training and 1000 test samples (kanlib.data, from the seed) for both libraries, width
``[d, 5, 1]``, cubic splines, grid sizes 5 -> 10 -> 20 with ``STEPS`` full-batch L-BFGS steps at each.

- pykan: ``KAN(width, grid=5, k=3, seed=seed)``, then per grid size ``model.refine(G)`` (after the first) and
  ``model.fit(dataset, opt="LBFGS", steps=STEPS)`` with fit's defaults (grid updates every 5 steps of the first
  50, from step 0; the test loss every step). One process, one thread.
- kanlib: one ``kanlib.train`` run (torchrun) with ``optimizer=lbfgs`` (pykan's settings), ``grid_extension=(10,
  20)``, ``grid_update_every=5``, ``grid_update_until=30`` (never at step 0: kanlib.grids), ``kan_impl=fast``,
  at 1 and 2 processes (DDP, gloo, one thread each), evaluated at the end of each grid size.

Measured: the test RMSE at the end of each grid size; ``train_s``, the training loop's wall time (pykan: its
refine and fit calls; kanlib: first step's start to the last step's end, grid changes included); ``total_s``,
the whole process from launch to exit (imports, data, model; for kanlib torchrun and the process group too).
Runs are interleaved per seed (pykan, kanlib 1, kanlib 2), so load on the machine hits all alike. The JSON
goes to ``outputs/benchmarks/pykan_accuracy-<UTC timestamp>.json``; the Markdown table is printed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/pykan_accuracy.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
TASKS = {"exp_sin": (2, 5, 1), "feynman:I.6.2": (2, 5, 1), "feynman:I.16.6": (3, 5, 1)}
SIZES = (5, 10, 20)
STEPS = 50  # per grid size, as pykan's examples
N = 1000  # training and test samples
SCHEMA_VERSION = 1


def kanlib_config(task: str, seed: int, nproc: int, steps: int, out_dir: str):
    from kanlib.config import RunConfig

    return RunConfig(study="pykan_accuracy", task=task, widths=TASKS[task], grid_size=SIZES[0],
                     grid_extension=SIZES[1:], steps=steps * len(SIZES), warmup_steps=2, n_train=N, n_val=N,
                     global_batch=N, optimizer="lbfgs", lr=1.0, grid_update_every=5, grid_update_until=30,
                     eval_every=steps, seed=seed, nproc_per_node=nproc, device="cpu", backend="gloo", threads=1,
                     kan_impl="fast", pg_timeout_s=120.0, out_dir=out_dir)


def data(task: str, seed: int):
    """The training and test tensors both libraries train on (kanlib's generator, float32)."""
    from kanlib.data import make_dataset

    d = make_dataset(kanlib_config(task, seed, 1, STEPS, "unused"))
    return d.x_train, d.y_train, d.x_val, d.y_val


def pykan_worker(task: str, seed: int, steps: int) -> dict:
    """pykan's recipe in this process (call it in a fresh one): RMSE per grid size, training wall time."""
    import torch

    torch.set_num_threads(1)
    from kan import KAN

    xt, yt, xv, yv = data(task, seed)
    dataset = {"train_input": xt, "train_label": yt, "test_input": xv, "test_label": yv}
    rmse, t0 = [], time.perf_counter()
    model = KAN(width=list(TASKS[task]), grid=SIZES[0], k=3, seed=seed, auto_save=False)
    for i, size in enumerate(SIZES):
        if i:
            model = model.refine(size)
            model.auto_save = False  # refine turns pykan's checkpoint writing back on; fit need not write
        model.fit(dataset, opt="LBFGS", steps=steps, log=steps + 1)
        with torch.no_grad():
            rmse.append(math.sqrt(float(torch.mean((model(xv) - yv) ** 2))))
    return {"rmse": rmse, "train_s": time.perf_counter() - t0}


def run_pykan(task: str, seed: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as cwd:  # pykan writes ./model/ (its history and checkpoints)
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "benchmarks.pykan_accuracy", "--pykan-worker", task, str(seed),
                              str(steps)], cwd=cwd, capture_output=True, text=True, timeout=3600,
                             env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"))
        total = time.perf_counter() - t0
    if out.returncode:
        raise RuntimeError(f"pykan {task} seed {seed} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    return {"library": "pykan", "task": task, "seed": seed, "processes": 1, **row, "total_s": total}


def run_kanlib(task: str, seed: int, nproc: int, steps: int, out_dir: str) -> dict:
    from kanlib.analysis import load as results
    from runners.launch import run

    cfg = kanlib_config(task, seed, nproc, steps, out_dir)
    t0 = time.perf_counter()
    rec = run(cfg, echo=False, timeout_s=3600)
    total = time.perf_counter() - t0
    s = results.load_steps(cfg.run_dir())
    evaluated = s.val_loss.dropna().tolist()  # after the last step of each grid size but the last
    rmse = [math.sqrt(v) for v in evaluated] + [math.sqrt(rec["final_val_loss"])]
    first = s.iloc[0]
    train_s = float(s.time_unix_s.iloc[-1] - (first.time_unix_s - first.step_time_s))
    return {"library": "kanlib", "task": task, "seed": seed, "processes": nproc, "rmse": rmse, "train_s": train_s,
            "total_s": total, "evals_per_step": rec["evals_per_step"], "kan_path": rec["kan_path"],
            "run_key": rec["run_key"]}


def table(rows: list[dict]) -> str:
    """Markdown: per task and grid size, the median test RMSE (min-max over seeds) of each library and process
    count, and the median wall times."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["task"], r["library"], r["processes"]), []).append(r)
    runs = [("pykan", 1), ("kanlib", 1), ("kanlib", 2)]
    head = ("| task | grid | " + " | ".join(f"{lib} {n}p RMSE" for lib, n in runs)
            + " | kanlib 1p / pykan | kanlib 2p / pykan |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    fmt = "{:.2g}".format
    for task in TASKS:
        if (task, "pykan", 1) not in groups:
            continue
        for i, size in enumerate(SIZES):
            cells, med = [], {}
            for key in runs:
                vals = [r["rmse"][i] for r in groups.get((task, *key), [])]
                if not vals:
                    cells.append("-")
                    continue
                med[key] = statistics.median(vals)
                cells.append(f"{fmt(med[key])} ({fmt(min(vals))}-{fmt(max(vals))})")
            ratios = [f"{med[k] / med[runs[0]]:.2f}" if k in med and runs[0] in med else "-" for k in runs[1:]]
            lines.append(f"| {task} | {size} | " + " | ".join(cells + ratios) + " |")
    lines += ["", "| task | " + " | ".join(f"{lib} {n}p train s (total s)" for lib, n in runs) + " |",
              "|---|" + "---|" * len(runs)]
    for task in TASKS:
        cells = []
        for key in runs:
            g = groups.get((task, *key), [])
            cells.append(f"{statistics.median(r['train_s'] for r in g):.1f} "
                         f"({statistics.median(r['total_s'] for r in g):.1f})" if g else "-")
        if any(c != "-" for c in cells):
            lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one task, one seed, 10 steps per grid size")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tasks", type=str, default=",".join(TASKS))
    ap.add_argument("--out-dir", type=str, default="outputs/benchmarks")
    ap.add_argument("--pykan-worker", nargs=3, metavar=("TASK", "SEED", "STEPS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.pykan_worker:
        task, seed, steps = args.pykan_worker
        print(json.dumps(pykan_worker(task, int(seed), int(steps))))
        return 0
    import kan  # noqa: F401  (fail early, before any run, when pykan is missing)
    import torch

    tasks = args.tasks.split(",")[:1] if args.quick else args.tasks.split(",")
    seeds = range(1 if args.quick else args.seeds)
    steps = 10 if args.quick else STEPS
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs_dir = tempfile.mkdtemp(prefix="pykan_accuracy-")
    rows = []
    for seed in seeds:
        for task in tasks:
            for job in (lambda: run_pykan(task, seed, steps), lambda: run_kanlib(task, seed, 1, steps, runs_dir),
                        lambda: run_kanlib(task, seed, 2, steps, runs_dir)):
                row = job()
                rows.append(row)
                print(f"{row['library']} {row['processes']}p {task} seed {seed}: RMSE "
                      + " ".join(f"{v:.2e}" for v in row["rmse"])
                      + f"  train {row['train_s']:.1f} s, total {row['total_s']:.1f} s", flush=True)
    import kan as _kan

    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    record = {"schema_version": SCHEMA_VERSION, "benchmark": "pykan_accuracy", "at": stamp,
              "host": socket.gethostname(), "platform": platform.platform(), "cpus": os.cpu_count(),
              "torch": torch.__version__, "pykan": getattr(_kan, "__version__", "0.2.8"),
              "git_sha": _git_sha(), "steps_per_grid_size": steps, "grid_sizes": list(SIZES), "samples": N,
              "tasks": {t: list(TASKS[t]) for t in tasks}, "rows": rows}
    path = out_dir / f"pykan_accuracy-{stamp}.json"
    path.write_text(json.dumps(record, indent=1))
    print(table(rows))
    print(f"record: {path}")
    return 0


def _git_sha() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout
        return sha.strip() + ("-dirty" if dirty.strip() else "")
    except OSError:
        return ""


if __name__ == "__main__":
    sys.exit(main())
