"""One-GPU check: calibrate the compute side and run the NCCL path end to end (issues 11.9 and 15).

``bash benchmarks/gpu_check.sh [OUT]`` (or ``python -m benchmarks.gpu_check --out OUT``) on a machine with one
CUDA GPU, in a few minutes, writes everything under one folder (default ``outputs/gpu_check``):

1. ``env.json``: the GPU, driver, CUDA, NCCL and torch versions (``nvidia-smi`` too, when present);
2. the KAN layer benchmark (benchmarks/kan_layer.py) on CPU and CUDA: kernel times, saved memory, the path
   that ran (``kan_path``) per row;
3. the collective benchmark under torchrun with NCCL on one process (``collbench/``): the launch-latency floor
   of an all-reduce and the NCCL algorithm/protocol NCCL reports;
4. one training run per model size under torchrun with NCCL (``gpu_check/`` records): the training loop's
   collectives on CUDA tensors, CUDA-event phase timing, peak, reserved and device memory, ``model.pt`` on CPU,
   and bf16 autocast at the middle size.

Each step's failure is recorded in ``summary.json`` and the others still run; the exit code is non-zero when
any step failed. Nothing here runs without a GPU: it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = [(64, 64, 64, 1), (64, 256, 256, 1), (64, 1024, 1024, 1)]


def environment(out: str) -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0)))}
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
        with open(os.path.join(out, "nvidia-smi.txt"), "w") as f:
            f.write(smi)
    except (OSError, subprocess.SubprocessError):
        pass
    with open(os.path.join(out, "env.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def kan_layer(out: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.kan_layer", "--threads", "1", "--reps", "10", "--no-compile-cost",
           "--out-dir", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    with open(os.path.join(out, "kan_layer.log"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode:
        raise RuntimeError(f"kan_layer exited {proc.returncode}: {proc.stderr[-2000:]}")
    return {"log": "kan_layer.log"}


def collbench(out: str) -> dict:
    from kanlib.collbench import BenchConfig
    from runners.launch import run

    cfg = BenchConfig(nnodes=1, nproc_per_node=1, device="cuda", backend="nccl", max_bytes=256 * 2**20,
                      iters=20, warmup_iters=5, out_dir=out)
    rec = run(cfg, echo=False, timeout_s=300)
    return {"record": os.path.relpath(os.path.join(cfg.run_dir(), "record.json"), out),
            "nccl_algo_used": rec.get("nccl_algo_used"), "nccl_proto_used": rec.get("nccl_proto_used")}


def training(out: str) -> dict:
    from kanlib.config import RunConfig
    from runners.launch import run

    done = {}
    cfgs = [RunConfig(study="gpu_check", widths=w, task="highdim", global_batch=8192, n_train=65536, steps=60,
                      warmup_steps=15, device="cuda", backend="nccl", kan_impl="compiled", optimizer="adam", lr=1e-3,
                      out_dir=out)
            for w in SIZES]
    cfgs.append(cfgs[1].replace(precision="bf16"))
    cfgs.append(cfgs[1].replace(model="mlp", widths=(64, 768, 768, 1)))
    for cfg in cfgs:
        rec = run(cfg, echo=False, timeout_s=300)
        done[cfg.run_key()] = {k: rec.get(k) for k in ("widths", "model", "precision", "kan_path", "step_time_s",
                                                       "compile_s", "peak_mem_bytes", "peak_reserved_bytes",
                                                       "device_used_bytes", "final_val_loss", "backend")}
    return done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="outputs/gpu_check", help="folder for every record and log")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU is visible here; nothing was run", file=sys.stderr)
        return 2
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    summary, failed = {}, False
    for name, step in (("environment", environment), ("kan_layer", kan_layer), ("collbench", collbench),
                       ("training", training)):
        t0 = time.monotonic()
        try:
            summary[name] = {"ok": True, "result": step(out)}
        except Exception as e:  # record it and go on: the other checks still tell something
            failed = True
            summary[name] = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        summary[name]["seconds"] = round(time.monotonic() - t0, 1)
        print(f"gpu_check: {name}: {'ok' if summary[name]['ok'] else 'FAILED ' + summary[name]['error']} "
              f"({summary[name]['seconds']} s)", flush=True)
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
