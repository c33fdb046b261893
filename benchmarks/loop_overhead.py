"""What kanlib's training loop costs beyond a bare DDP loop: wall time per step, side by side.

``python -m benchmarks.loop_overhead`` runs, in interleaved pairs (bare, kanlib, then kanlib, bare, ...),
the same config twice under torchrun: once through ``kanlib.train`` (phase timing, per-step rows, fault
handling, the asynchronous stop flag, finiteness check) and once through :func:`bare_main` below - a
plain DDP loop of the same model, optimizer, data shards and batch, with no instrumentation beyond one
clock read before and after the measured steps. Both report the wall time per measured step (everything
between the steps included); kanlib's comes from its record (``global_batch / wall_samples_per_s``).
The ratio kanlib / bare (median over pairs) is printed for the default study's size and a compute-bound
size, and written to ``outputs/benchmarks/loop_overhead-<UTC>.json``. Target: at most 1.03.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = {  # name -> RunConfig overrides
    "default study (latency-bound)": dict(widths=(2, 32, 32, 1), global_batch=512, steps=520, warmup_steps=20),
    "compute-bound": dict(widths=(64, 256, 256, 1), task="highdim", global_batch=4096, steps=24, warmup_steps=4,
                          n_train=16384),
}
QUICK = {"quick": dict(widths=(2, 16, 1), global_batch=128, steps=40, warmup_steps=5)}


def bare_main(argv: list[str]) -> None:
    """A bare DDP loop (torchrun entry): same config, no instrumentation; rank 0 prints the wall time per step."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from kanlib.config import RunConfig
    from kanlib.data import make_dataset
    from kanlib.distributed import pin_cpus
    from kanlib.model import build_model
    from kanlib.train import _buffer_sync, make_optimizer

    cfg = RunConfig.from_cli(argv)
    pin_cpus(cfg, "cpu")  # placed like kanlib.train's processes, so the pair differs only in the loop
    torch.set_num_threads(cfg.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    data = make_dataset(cfg)
    model = build_model(cfg)
    ddp = DDP(model, bucket_cap_mb=cfg.bucket_cap_mb, **_buffer_sync(cfg.broadcast_buffers))
    opt, _ = make_optimizer(model, cfg)
    t0 = None
    for step in range(cfg.steps):
        if step == cfg.warmup_steps:
            t0 = time.perf_counter()
        x, y = data.shard(step, cfg.global_batch, rank, world)
        loss = data.loss(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
    wall = (time.perf_counter() - t0) / (cfg.steps - cfg.warmup_steps)
    if rank == 0:
        print(f"BARE_WALL_S_PER_STEP {wall!r}", flush=True)
    dist.destroy_process_group()


def _bare(cfg) -> float:
    from runners.command import launch_env, torchrun_command

    cmd = torchrun_command(cfg, entry=["-m", "benchmarks.loop_overhead", "--bare"])
    out = subprocess.run(cmd, env=launch_env(cfg), capture_output=True, text=True, timeout=900)
    for line in out.stdout.splitlines():
        if line.startswith("BARE_WALL_S_PER_STEP "):
            return float(line.split()[1])
    raise RuntimeError(f"the bare loop failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def _kanlib(cfg) -> tuple[float, dict]:
    from runners.launch import run

    rec = run(cfg, echo=False, timeout_s=900)
    return cfg.global_batch / rec["wall_samples_per_s"], rec


def measure(sizes: dict, pairs: int, nproc: int, kan_impl: str) -> list[dict]:
    from kanlib.config import RunConfig

    rows = []
    with tempfile.TemporaryDirectory(prefix="kanlib-loop-") as out:
        for name, over in sizes.items():
            bare, kan, recs = [], [], []
            for i in range(pairs):
                cfg = RunConfig(study="loop_overhead", nproc_per_node=nproc, device="cpu", backend="gloo",
                                kan_impl=kan_impl, repeat=i, out_dir=out, optimizer="adam", lr=1e-3,
                                n_train=16384, **over)  # the recipe the scaling studies time
                order = (_bare, _kanlib) if i % 2 == 0 else (_kanlib, _bare)
                for fn in order:
                    if fn is _bare:
                        bare.append(_bare(cfg))
                    else:
                        t, rec = _kanlib(cfg)
                        kan.append(t)
                        recs.append(rec)
            ratio = statistics.median(k / b for k, b in zip(kan, bare))
            rows.append({"size": name, "config": over, "nproc": nproc, "kan_impl": kan_impl, "pairs": pairs,
                         "bare_wall_s_per_step": bare, "kanlib_wall_s_per_step": kan,
                         "kanlib_step_time_s": [r["step_time_s"] for r in recs],
                         "ratio_median": ratio, "target": 1.03, "pass": ratio <= 1.03})
            print(f"{name:32s} bare {statistics.median(bare) * 1e3:8.2f} ms  kanlib "
                  f"{statistics.median(kan) * 1e3:8.2f} ms  ratio {ratio:.3f}  "
                  f"{'PASS' if ratio <= 1.03 else 'FAIL'} (<= 1.03)", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=8, help="interleaved (bare, kanlib) pairs per size")
    ap.add_argument("--nproc", type=int, default=2, help="gloo processes per run")
    ap.add_argument("--kan-impl", default="fast", help="kan_impl of both loops")
    ap.add_argument("--quick", action="store_true", help="a smoke run: one small size, 2 pairs")
    ap.add_argument("--out", default="outputs/benchmarks", help="folder for the JSON result")
    args = ap.parse_args()
    rows = measure(QUICK if args.quick else SIZES, 2 if args.quick else args.pairs, args.nproc, args.kan_impl)
    os.makedirs(args.out, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = os.path.join(args.out, f"loop_overhead-{stamp}.json")
    import torch

    from kanlib.records import git_sha

    with open(path, "w") as f:
        json.dump({"benchmark": "loop_overhead", "at": stamp, "git_sha": git_sha(), "torch": torch.__version__,
                   "rows": rows}, f, indent=1)
    print(f"written: {path}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--bare":
        bare_main(sys.argv[2:])
    else:
        main()
