"""The recipe's step on data-adaptive knots against the same step on a uniform grid, side by side.

``python -m benchmarks.adaptive_grid`` times pykan's recipe step (kanlib's L-BFGS, ``max_iter=5``, full batch of
exp_sin, ``[2, 5, 1]``, cubic splines) at each grid size of the recipe (5, 10, 20) on:

- ``uniform/compiled``: the initial uniform grid, the compiled closed form (the baseline);
- ``adaptive/compiled``: the knots after a grid update (``grid_eps=0.02``, pykan's), the compiled kernels for any
  knots (Cox-de Boor on each basis's support);
- ``uniform/fast``, ``adaptive/fast``: the same two on the eager kernels;
- ``adaptive/reference``: the Cox-de Boor path over all knots, which these grids ran before the kernels for any
  knots existed.

The variants run interleaved (one step of each in turn, ``--rounds`` times, after warm-up steps that compile),
one thread, so that a busy machine slows them alike; each row gives the median step time and evaluations per
step, and the ratios to ``uniform/compiled`` are medians over the rounds of the per-round ratios, per step and per
evaluation (L-BFGS's line search takes a different number of evaluations on different knots). Target:
``adaptive/compiled`` within 1.3x of ``uniform/compiled`` per evaluation. The kernel paths each variant ran are
recorded (``kernel_paths``). A JSON record goes to ``outputs/benchmarks/adaptive_grid-<UTC timestamp>.json``.
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import write_record  # noqa: E402
from kanlib import records  # noqa: E402
from kanlib.config import RunConfig  # noqa: E402
from kanlib.data import make_dataset  # noqa: E402
from kanlib.model import KAN, kernel_paths, reset_kernel_paths  # noqa: E402
from kanlib.optim import LBFGS  # noqa: E402

BASELINE = "uniform/compiled"
VARIANTS = [BASELINE, "adaptive/compiled", "uniform/fast", "adaptive/fast", "adaptive/reference"]
TARGET = 1.3  # adaptive/compiled per evaluation, at most this times uniform/compiled


def _models(grid_size: int, x: torch.Tensor, dtype: torch.dtype) -> dict[str, KAN]:
    """The five variants of one initial model: uniform knots, or knots refit to the model's inputs on ``x``."""
    torch.manual_seed(0)
    uniform = KAN([2, 5, 1], grid_size=grid_size, impl="compiled").to(dtype)
    adaptive = copy.deepcopy(uniform)
    adaptive.update_grid(x.to(dtype))  # grid_eps=0.02: quantiles of the data, not uniform
    assert not any(layer.grid_is_uniform for layer in adaptive.layers)
    out = {}
    for name in VARIANTS:
        grid, impl = name.split("/")
        m = copy.deepcopy(uniform if grid == "uniform" else adaptive)
        for layer in m.layers:
            layer.impl = impl
        out[name] = m
    return out


def _step(model: KAN, opt: LBFGS, x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
    """One recipe step (its first evaluation included, as the trainer's); ``(seconds, evaluations)``."""
    def closure():
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss.detach()

    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = closure()
    opt.step(closure, loss=loss)
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0, opt.last_evals


def measure(grid_size: int, batch: int, rounds: int, warmup: int, dtype: torch.dtype) -> dict:
    """Rows (one per variant) and ratios to the baseline at one grid size and batch."""
    data = make_dataset(RunConfig(task="exp_sin", widths=(2, 5, 1), n_train=batch, n_val=batch, global_batch=batch))
    x, y = data.shard(0, batch, 0, 1)
    x, y = x.to(dtype), y.to(dtype)
    models = _models(grid_size, x, dtype)
    opts = {n: LBFGS(m.parameters(), lr=1.0, max_iter=5) for n, m in models.items()}
    times = {n: [] for n in VARIANTS}
    evals = {n: [] for n in VARIANTS}
    for r in range(warmup + rounds):
        if r == warmup:
            for m in models.values():
                reset_kernel_paths(m)  # from here: what the timed steps ran
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]  # neither variant always runs first
        for n in order:
            s, e = _step(models[n], opts[n], x, y)
            if r >= warmup:
                times[n].append(s)
                evals[n].append(e)
    rows = []
    base_t, base_e = times[BASELINE], evals[BASELINE]
    for n in VARIANTS:
        per_step = [a / b for a, b in zip(times[n], base_t)]
        per_eval = [(a / ea) / (b / eb) for a, ea, b, eb in zip(times[n], evals[n], base_t, base_e)]
        rows.append({"variant": n, "grid_size": grid_size, "batch": batch, "kan_path": "+".join(kernel_paths(models[n])),
                     "step_ms": 1e3 * statistics.median(times[n]), "evals_per_step": statistics.median(evals[n]),
                     "ms_per_eval": 1e3 * statistics.median(t / e for t, e in zip(times[n], evals[n])),
                     "step_vs_uniform_compiled": statistics.median(per_step),
                     "eval_vs_uniform_compiled": statistics.median(per_eval)})
    return {"grid_size": grid_size, "batch": batch, "rows": rows}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid-sizes", type=str, default="5,10,20", help="the recipe's grid sizes")
    ap.add_argument("--batches", type=str, default="1000", help="full batches (the recipe: n_train)")
    ap.add_argument("--rounds", type=int, default=20, help="timed steps of each variant")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps of each variant (compilation)")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out-dir", type=str, default="outputs/benchmarks")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    results = []
    print(f"{'grid':>4} {'batch':>6} {'variant':<20} {'kan_path':<10} {'step ms':>8} {'evals':>5} {'ms/eval':>8} "
          f"{'step x':>7} {'eval x':>7}")
    for batch in (int(b) for b in args.batches.split(",")):
        for g in (int(s) for s in args.grid_sizes.split(",")):
            res = measure(g, batch, args.rounds, args.warmup, dtype)
            results.append(res)
            for r in res["rows"]:
                print(f"{g:>4} {batch:>6} {r['variant']:<20} {r['kan_path']:<10} {r['step_ms']:>8.2f} "
                      f"{r['evals_per_step']:>5.1f} {r['ms_per_eval']:>8.3f} {r['step_vs_uniform_compiled']:>7.2f} "
                      f"{r['eval_vs_uniform_compiled']:>7.2f}", flush=True)
    checks = {f"grid {res['grid_size']} batch {res['batch']}": r["eval_vs_uniform_compiled"]
              for res in results for r in res["rows"] if r["variant"] == "adaptive/compiled"}
    print(f"\nadaptive/compiled per evaluation vs uniform/compiled (target <= {TARGET}):")
    for k, v in checks.items():
        print(f"  {'PASS' if v <= TARGET else 'FAIL'}  {k}: {v:.2f}x")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    record = {"benchmark": "adaptive_grid", "timestamp_utc": stamp, "git_sha": records.git_sha(),
              "torch_version": torch.__version__, "python": platform.python_version(), "hostname": socket.gethostname(),
              "cpu_count": os.cpu_count(), "threads": args.threads, "dtype": args.dtype, "rounds": args.rounds,
              "warmup": args.warmup, "widths": [2, 5, 1], "spline_order": 3, "optimizer": "lbfgs max_iter=5",
              "target_eval_ratio": TARGET, "results": results,
              "acceptance": {k: {"ratio": v, "pass": v <= TARGET} for k, v in checks.items()}}
    write_record(args.out_dir, "adaptive_grid", stamp, record)
    return record


if __name__ == "__main__":
    main()
