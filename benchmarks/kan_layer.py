"""KAN layer benchmark: kanlib's reference and fast paths, the variants, a matched MLP and PyPI peers.

Run ``python -m benchmarks.kan_layer`` (or ``python benchmarks/kan_layer.py``); ``--quick`` is a
smoke run (smaller configs, few repeats). One run measures, side by side and interleaved round
by round (so load on the machine hits every model alike):

- ``fwd_ms``: median wall time of a forward pass under ``torch.no_grad`` (inference);
- ``fwd_bwd_ms``: median wall time of forward + ``loss.backward()``, gradients reset to ``None``;
- ``step_ms``: median wall time of a whole SGD training step (zero_grad, forward, backward,
  ``optimizer.step()``), the number the acceptance checks use;
- ``saved_bytes``: activation memory of a training forward, measured as the bytes of the distinct
  storages of every tensor autograd saves for backward (``torch.autograd.graph.saved_tensors_hooks``),
  not counting parameters (they exist anyway), plus the output. This is what a training step
  keeps alive between forward and backward, the dominant term of its peak memory; it is
  device-independent, so it works on CPU where no allocator statistics exist. On CUDA the run
  also records ``cuda_peak_bytes`` = ``torch.cuda.max_memory_allocated`` during one step minus
  the memory allocated before it.

Times are medians over repeats after warm-up; CUDA is synchronised before each clock read.
Ratios are against the matched-parameter MLP (:func:`kanlib.model.matched_mlp`) of the same
config, threads and device, in the same run. Every kanlib row records ``kan_path``, the kernel
paths that actually ran during its timed repeats (:func:`kanlib.model.kernel_paths`): a row asked
for "compiled" that fell back to eager says so.

The compile cost is measured in two fresh processes sharing one new inductor cache folder
(``TORCHINDUCTOR_CACHE_DIR``): the first compiles (cold), the second loads the compiled kernels
from the FX graph and AOTAutograd caches (warm, what every run after the first of a sweep pays).
Each reports ``compile_s`` (:func:`kanlib.model.compile_seconds`) and its first-step time.

A JSON record goes to ``outputs/benchmarks/kan_layer-<UTC timestamp>.json``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/kan_layer.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import write_record
from kanlib.model import (KAN, ChebyKAN, RBFKAN, compile_seconds, count_params, kernel_paths, matched_mlp,
                          reset_kernel_paths)

SCHEMA_VERSION = 2  # 2: step_ms rows, kan_path per row, compile_cost, acceptance as ratios
GRID_SIZE, SPLINE_ORDER = 5, 3
CONFIGS = [((64, 256, 256, 1), 512), ((16, 64, 64, 1), 1024)]
QUICK_CONFIGS = [((16, 64, 64, 1), 256)]


# -- models ---------------------------------------------------------------------------------
def _peer_pykan(widths, device):
    from kan import KAN as PyKAN  # pykan

    return PyKAN(width=list(widths), grid=GRID_SIZE, k=SPLINE_ORDER, seed=0, auto_save=False,
                 device=str(device))


def _peer_flashkan(widths, device):
    from flashkan import KANNetwork

    return KANNetwork(list(widths), grid_size=GRID_SIZE, spline_order=SPLINE_ORDER).to(device)


def _peer_inkan(widths, device):
    from inkan import KANNetwork

    return KANNetwork(list(widths), grid_size=GRID_SIZE, spline_order=SPLINE_ORDER).to(device)


def model_factories(widths):
    """name -> (factory(widths, device) -> nn.Module, kind). kind: kanlib | baseline | peer.

    ``kan`` is ``KAN(widths)`` as a user writes it (the default, compiled path); ``kan_fast`` the
    eager closed form for platforms without a compiler; ``kan_reference`` the Cox-de Boor path.
    """
    return {
        "kan": (lambda w, d: KAN(w, GRID_SIZE, SPLINE_ORDER).to(d), "kanlib"),
        "kan_fast": (lambda w, d: KAN(w, GRID_SIZE, SPLINE_ORDER, impl="fast").to(d), "kanlib"),
        "kan_reference": (lambda w, d: KAN(w, GRID_SIZE, SPLINE_ORDER, impl="reference").to(d), "kanlib"),
        "kan_rbf": (lambda w, d: RBFKAN(w, GRID_SIZE + SPLINE_ORDER).to(d), "kanlib"),
        "kan_cheb": (lambda w, d: ChebyKAN(w, GRID_SIZE + SPLINE_ORDER - 1).to(d), "kanlib"),
        "mlp_matched": (lambda w, d: matched_mlp(list(w), GRID_SIZE, SPLINE_ORDER).to(d), "baseline"),
        "pykan": (_peer_pykan, "peer"),
        "flashkan": (_peer_flashkan, "peer"),
        "inkan": (_peer_inkan, "peer"),
    }


# -- measurements ---------------------------------------------------------------------------
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _zero_grads(model):
    for p in model.parameters():
        p.grad = None


def step_fwd(model, x):
    with torch.no_grad():
        return model(x)


def step_fwd_bwd(model, x):
    _zero_grads(model)
    y = model(x)
    y.float().square().mean().backward()


def step_train(model, x, opt):
    """One SGD training step: zero_grad, forward, backward, optimizer step."""
    opt.zero_grad(set_to_none=True)
    model(x).float().square().mean().backward()
    opt.step()


def saved_bytes(model, x) -> int:
    """Bytes of distinct non-parameter storages saved for backward by one forward, plus the output."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                seen[st.data_ptr()] = st.nbytes()
        return t

    if hasattr(torch, "_dynamo"):  # keep the hook out of compiled graphs (it would be traced)
        pack = torch._dynamo.disable(pack)
    _zero_grads(model)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = model(x)
    out = y.untyped_storage().nbytes() if y.untyped_storage().data_ptr() not in seen else 0
    del y
    return sum(seen.values()) + out


def cuda_peak_bytes(model, x) -> int | None:
    if x.device.type != "cuda":
        return None
    _zero_grads(model)
    torch.cuda.synchronize(x.device)
    base = torch.cuda.memory_allocated(x.device)
    torch.cuda.reset_peak_memory_stats(x.device)
    step_fwd_bwd(model, x)
    torch.cuda.synchronize(x.device)
    return torch.cuda.max_memory_allocated(x.device) - base


STEPS = (("fwd", step_fwd), ("fwd_bwd", step_fwd_bwd), ("step", step_train))


def bench_config(widths, batch, threads, device, reps, warmup, budget_s, only=None):
    """Rows of one (widths, batch, threads, device): every model, interleaved repeat by repeat."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x = (torch.rand(batch, widths[0], device=device) * 2 - 1)
    rows, live = [], {}
    for name, (make, kind) in model_factories(widths).items():
        if only and name not in only:
            continue
        row = {"model": name, "kind": kind, "widths": list(widths), "batch": batch, "threads": threads,
               "device": device.type}
        try:
            torch.manual_seed(0)
            model = make(widths, device)
            opt = torch.optim.SGD(model.parameters(), lr=1e-4)  # small: the weights barely move
            row["params"] = count_params(model)
            t0 = time.perf_counter()
            for _ in range(warmup):  # includes torch.compile's compilation
                step_train(model, x, opt)
                step_fwd(model, x)
            _sync(device)
            row["warmup_s"] = round(time.perf_counter() - t0, 3)
            row["saved_bytes"] = saved_bytes(model, x)
            row["cuda_peak_bytes"] = cuda_peak_bytes(model, x)
            reset_kernel_paths(model)  # from here on: the paths the timed repeats run
            live[name] = (model, opt, row, {key: [] for key, _ in STEPS})
        except Exception as e:  # a peer that is not installed or fails: skip with a note
            row["skipped"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            if not isinstance(e, ImportError):
                row["traceback"] = traceback.format_exc(limit=3)
        rows.append(row)
    spent = {name: 0.0 for name in live}
    for r in range(reps):
        for name, (model, opt, row, times) in live.items():
            if r >= 3 and spent[name] > budget_s:  # slow models (pykan) stop after 3 repeats
                continue
            for key, fn in STEPS:
                _sync(device)
                t0 = time.perf_counter()
                fn(model, x, opt) if key == "step" else fn(model, x)
                _sync(device)
                dt = time.perf_counter() - t0
                times[key].append(dt)
                spent[name] += dt
    for name, (model, opt, row, times) in live.items():
        row["reps"] = len(times["step"])
        for key, _ in STEPS:
            row[f"{key}_ms"] = 1e3 * statistics.median(times[key])
        if row["kind"] == "kanlib":
            row["kan_path"] = "+".join(kernel_paths(model))  # empty for the RBF/Chebyshev variants
    mlp = next((r for r in rows if r["model"] == "mlp_matched" and "fwd_ms" in r), None)
    for row in rows:
        if mlp is not None and "fwd_ms" in row:
            for key, _ in STEPS:
                row[f"{key}_vs_mlp"] = row[f"{key}_ms"] / mlp[f"{key}_ms"]
            row["saved_bytes_vs_mlp"] = row["saved_bytes"] / mlp["saved_bytes"]
    return rows


# -- compile cost in fresh processes ------------------------------------------------------------
PROBE_WIDTHS, PROBE_BATCH = (64, 256, 256, 1), 512


def compile_probe(prepare: bool = False) -> dict:
    """In this (fresh) process: build ``KAN(PROBE_WIDTHS)``, run two training steps, report compile cost.

    ``prepare``: first run :func:`kanlib.compiling.prepare_compile` in the foreground (as a launcher
    would in the background during its start-up) and report its time apart, as ``prepare_s``.
    """
    from kanlib import compiling

    prepare_s = None
    if prepare:
        t = time.perf_counter()
        compiling.prepare_compile("cpu", background=False)
        prepare_s = time.perf_counter() - t
    t0 = time.perf_counter()
    torch.set_num_threads(1)
    model = KAN(list(PROBE_WIDTHS), GRID_SIZE, SPLINE_ORDER)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.rand(PROBE_BATCH, PROBE_WIDTHS[0]) * 2 - 1
    step_train(model, x, opt)
    first_step_s = time.perf_counter() - t0
    step_train(model, x, opt)
    from torch._dynamo.utils import counters

    return {"compile_s": compile_seconds(), "first_step_s": first_step_s, "prepare_s": prepare_s,
            "kan_path": "+".join(kernel_paths(model)),
            "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
            "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"],
            "autograd_cache_hit": counters["aot_autograd"]["autograd_cache_hit"],
            "autograd_cache_miss": counters["aot_autograd"]["autograd_cache_miss"]}


def compile_cost() -> dict:
    """Cold then warm compile of the default KAN in fresh processes sharing a new cache folder.

    ``cold``: the first process (empty cache); ``warm``: a second one, as every later run of a sweep;
    ``warm_prepared``: a third whose inductor set-up ran first (:func:`kanlib.compiling.prepare_compile`).
    """
    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="kanlib-inductor-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, OMP_NUM_THREADS="1",
                   PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        out = {}
        for which in ("cold", "warm", "warm_prepared"):
            flag = "--compile-probe-prepared" if which == "warm_prepared" else "--compile-probe"
            proc = subprocess.run([sys.executable, "-m", "benchmarks.kan_layer", flag], cwd=repo,
                                  env=env, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
            out[which] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["widths"], out["batch"] = list(PROBE_WIDTHS), PROBE_BATCH
    return out


# -- report ---------------------------------------------------------------------------------
def _git_sha() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except Exception:
        return None


def print_table(rows):
    head = (f"{'config':<22} {'thr':>3} {'dev':>4} {'model':<14} {'path':<16} {'params':>8} {'fwd ms':>8} "
            f"{'f+b ms':>8} {'step ms':>8} {'step/MLP':>8} {'saved MiB':>9} {'mem/MLP':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        cfg = f"{'x'.join(map(str, r['widths']))} b{r['batch']}"
        lead = f"{cfg:<22} {r['threads']:>3} {r['device']:>4} {r['model']:<14}"
        if "skipped" in r:
            print(f"{lead} skipped: {r['skipped']}")
            continue
        print(f"{lead} {r.get('kan_path', '') or '-':<16} {r['params']:>8} {r['fwd_ms']:>8.2f} "
              f"{r['fwd_bwd_ms']:>8.2f} {r['step_ms']:>8.2f} {r.get('step_vs_mlp', float('nan')):>8.2f} "
              f"{r['saved_bytes'] / 2**20:>9.2f} {r.get('saved_bytes_vs_mlp', float('nan')):>7.2f}")


TARGET = {"widths": [64, 256, 256, 1], "batch": 512, "threads": 1}


def acceptance(rows, compile_cost=None, device="cpu"):
    """The issue's targets at [64,256,256,1] batch 512, 1 thread: {check: (passed, what was compared)}.

    ``None`` where the MLP row is missing. Times are SGD training steps measured in this run.
    """
    sel = {r["model"]: r for r in rows if all(r[k] == v for k, v in TARGET.items())
           and r["device"] == device and "step_ms" in r}
    if "mlp_matched" not in sel:
        return None
    out = {}
    for name, label in (("kan", "default KAN(widths)"), ("kan_fast", "eager fast path")):
        if name in sel:
            f = sel[name]
            out[f"{label} within 1.3x of the matched MLP"] = (
                f["step_vs_mlp"] <= 1.3, f"{f['step_vs_mlp']:.2f}x ({f['kan_path']})")
    if "kan" in sel:
        for peer in ("flashkan", "inkan"):
            if peer in sel:
                ratio = sel["kan"]["step_ms"] / sel[peer]["step_ms"]
                out[f"default KAN faster than {peer}"] = (ratio < 1.0, f"{ratio:.2f}x {peer}'s step time")
    if compile_cost and "warm" in compile_cost:
        warm, cold = compile_cost["warm"], compile_cost["cold"]
        out["second process compiles in <= 2 s"] = (
            warm["compile_s"] <= 2.0, f"{warm['compile_s']:.2f} s warm vs {cold['compile_s']:.2f} s cold")
    return out


def _raise_recompile_limit() -> None:
    # One run compiles every (layer shape, threads, grad mode) of every compiled model; dynamo's
    # default limit of 8 entries per function would silently send later configs to eager code.
    cfg = getattr(getattr(torch, "_dynamo", None), "config", None)
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if cfg is not None and hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 512))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: small config, few repeats")
    ap.add_argument("--reps", type=int, default=None, help="timed repeats per model (default 30, quick 5)")
    ap.add_argument("--threads", type=str, default=None, help="comma list of thread counts (default 1,2)")
    ap.add_argument("--models", type=str, default=None, help="comma list of model names (default all)")
    ap.add_argument("--no-compile-cost", action="store_true", help="skip the two-process compile measurement")
    ap.add_argument("--compile-probe", action="store_true", help=argparse.SUPPRESS)  # children of compile_cost
    ap.add_argument("--compile-probe-prepared", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", type=str, default="outputs/benchmarks")
    args = ap.parse_args(argv)
    if args.compile_probe or args.compile_probe_prepared:
        print(json.dumps(compile_probe(prepare=args.compile_probe_prepared)))
        return {}
    _raise_recompile_limit()
    reps = args.reps or (5 if args.quick else 30)
    warmup = 2 if args.quick else 3
    budget_s = 2.0 if args.quick else 8.0  # per model and config: slow models get 3 repeats only
    threads = [int(t) for t in args.threads.split(",")] if args.threads else ([1] if args.quick else [1, 2])
    only = set(args.models.split(",")) if args.models else None
    configs = QUICK_CONFIGS if args.quick else CONFIGS
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    cost = None if (args.quick or args.no_compile_cost) else compile_cost()
    rows = []
    for device in devices:
        for widths, batch in configs:
            for t in (threads if device.type == "cpu" else [threads[0]]):
                rows += bench_config(widths, batch, t, device, reps, warmup, budget_s, only)
    print_table(rows)
    if cost and "warm" in cost:
        print(f"\ncompile of KAN({list(PROBE_WIDTHS)}) in a fresh process: cold {cost['cold']['compile_s']:.2f} s, "
              f"warm cache {cost['warm']['compile_s']:.2f} s (first step {cost['cold']['first_step_s']:.2f} s "
              f"-> {cost['warm']['first_step_s']:.2f} s); warm after prepare_compile() "
              f"({cost['warm_prepared']['prepare_s']:.2f} s, overlappable with start-up) "
              f"{cost['warm_prepared']['compile_s']:.2f} s")
    elif cost:
        print(f"\ncompile cost not measured: {cost['error']}")
    acc = {d.type: acceptance(rows, cost if d.type == "cpu" else None, d.type) for d in devices}
    for dev, checks in acc.items():
        if checks:
            print(f"\nacceptance at [64,256,256,1] batch 512, 1 thread, {dev}, SGD training steps:")
            for k, (ok, what) in checks.items():
                print(f"  {'PASS' if ok else 'FAIL'}  {k:<48} {what}")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    record = {
        "schema_version": SCHEMA_VERSION, "benchmark": "kan_layer", "timestamp_utc": stamp,
        "git_sha": _git_sha(), "torch_version": torch.__version__, "python": platform.python_version(),
        "hostname": socket.gethostname(), "cpu_count": os.cpu_count(),
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "quick": args.quick, "reps": reps, "warmup": warmup, "grid_size": GRID_SIZE,
        "spline_order": SPLINE_ORDER,
        "memory_method": "saved_bytes: distinct non-parameter storages saved for backward + output "
                         "(saved_tensors_hooks); cuda_peak_bytes: max_memory_allocated delta of one step",
        "rows": rows, "compile_cost": cost,
        "acceptance": {dev: ({k: {"pass": ok, "measured": what} for k, (ok, what) in checks.items()}
                             if checks else None) for dev, checks in acc.items()},
    }
    write_record(args.out_dir, "kan_layer", stamp, record)
    return record


if __name__ == "__main__":
    main()
