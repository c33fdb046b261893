"""The host allocator's setting against glibc's defaults, side by side: one worker group runs the same one-process
KAN step (``[32, 128, 128, 1]``, compiled; the default study's one-process baselines: 2048 samples of weak scaling,
8192 of strong scaling) ``--runs`` times back to back, once with ``KANLIB_HOST_MALLOC=system`` and once with the
library's ``steady`` setting, alternating ``--pairs`` times per batch (so drift of the machine falls on both alike).

``python -m benchmarks.host_malloc [--batches 2048,8192] [--runs 8] [--pairs 1] [--steps 72]`` prints, per batch
and setting, each run's median step time, the spread of run medians (max / min), minor page faults, peak memory
and the system CPU time of the sweep, and writes them to ``outputs/benchmarks/host_malloc-<UTC>.json``, with the
ratios steady / system. docs/measurement.md ("Host allocator") says why.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

_CHILD = """
import json, sys
from runners import plans
from runners.sweep import run_sweep
from kanlib.config import RunConfig
runs, steps, out, batch = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
base = RunConfig(task="highdim", widths=[32, 128, 128, 1], kan_impl="compiled", optimizer="adam", steps=steps,
                 warmup_steps=4, n_train=max(16384, batch), n_val=2048, threads=1, out_dir=out)
configs = plans.weak_scaling(None, base, per_process_batches=[batch], repeats=runs, placements=["1x1"])
result = run_sweep(configs, launcher="local", timeout_s=900, rerun_disturbed=False, progress=False)
if result.failures:
    raise SystemExit("; ".join(m.splitlines()[0] for _, m in result.failures))
recs = sorted(result.records, key=lambda r: r["repeat"])
print(json.dumps([{k: r.get(k) for k in ("repeat", "step_time_s", "minor_page_faults", "host_malloc",
                                         "peak_mem_bytes", "disturbed")} for r in recs]))
"""


def one_sweep(mode: str, runs: int, steps: int, batch: int) -> dict:
    """One worker group of ``runs`` runs with KANLIB_HOST_MALLOC=mode, in a child process (its own allocator)."""
    env = dict(os.environ, KANLIB_HOST_MALLOC=mode,
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory(prefix="kanlib-malloc-") as out:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run([sys.executable, "-c", _CHILD, str(runs), str(steps), out, str(batch)], env=env,
                           cwd=str(ROOT), capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"sweep with KANLIB_HOST_MALLOC={mode} failed:\n{p.stderr[-3000:]}")
    rows = json.loads(p.stdout.strip().splitlines()[-1])
    times = [r["step_time_s"] for r in rows]
    return {"mode": mode, "batch": batch, "runs": rows,
            "peak_mem_mb": [round(r["peak_mem_bytes"] / 2**20) for r in rows],
            "step_time_ms": [round(t * 1e3, 2) for t in times],
            "spread_max_over_min": max(times) / min(times),
            "minor_page_faults": [r["minor_page_faults"] for r in rows],
            "system_cpu_s": after.ru_stime - before.ru_stime, "user_cpu_s": after.ru_utime - before.ru_utime}


def _summary(ss: list[dict]) -> dict:
    times = [t for s in ss for t in s["step_time_ms"]]
    mem = [m for s in ss for m in s["peak_mem_mb"]]
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
            "max_over_min": max(times) / min(times), "median_peak_mem_mb": statistics.median(mem),
            "median_minor_page_faults": statistics.median(f for s in ss for f in s["minor_page_faults"]),
            "system_cpu_s": sum(s["system_cpu_s"] for s in ss)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="2048,8192", help="samples per step, comma-separated (default 2048,8192)")
    ap.add_argument("--runs", type=int, default=8, help="runs per worker group (default 8)")
    ap.add_argument("--pairs", type=int, default=1, help="system/steady pairs per batch, alternating (default 1)")
    ap.add_argument("--steps", type=int, default=72, help="steps per run, 4 of them warm-up (default 72)")
    ap.add_argument("--out", default=str(ROOT / "outputs" / "benchmarks"), help="folder of the JSON result")
    a = ap.parse_args(argv)
    try:
        batches = [int(b) for b in a.batches.split(",")]
    except ValueError:
        ap.error(f"--batches {a.batches!r}: expected integers separated by commas")
    if a.runs < 2 or a.pairs < 1 or a.steps < 8 or min(batches) < 1:
        ap.error("--runs must be at least 2, --pairs at least 1, --steps at least 8, each batch at least 1")
    sweeps, summary = [], {}
    for batch in batches:
        for i in range(a.pairs):
            for mode in ("system", "steady"):
                s = one_sweep(mode, a.runs, a.steps, batch)
                sweeps.append(s)
                faults = s["minor_page_faults"]
                print(f"batch {batch} pair {i} {mode:6s}: step ms {s['step_time_ms']}  max/min "
                      f"{s['spread_max_over_min']:.2f}  faults {min(faults)}-{max(faults)}  peak MB "
                      f"{min(s['peak_mem_mb'])}-{max(s['peak_mem_mb'])}  system CPU {s['system_cpu_s']:.1f} s",
                      flush=True)
        by = {m: _summary([s for s in sweeps if s["mode"] == m and s["batch"] == batch]) for m in ("system", "steady")}
        by["steady_over_system"] = {k: by["steady"][k] / by["system"][k] for k in
                                    ("median_ms", "max_over_min", "median_peak_mem_mb") if by["system"][k]}
        summary[str(batch)] = by
        for mode in ("system", "steady"):
            m = by[mode]
            print(f"batch {batch} {mode:6s}: runs {m['min_ms']:.1f}-{m['max_ms']:.1f} ms (median {m['median_ms']:.1f}, "
                  f"max/min {m['max_over_min']:.2f}), peak {m['median_peak_mem_mb']:.0f} MB, "
                  f"system CPU {m['system_cpu_s']:.1f} s")
        r = by["steady_over_system"]
        print(f"batch {batch} steady / system: median step {r['median_ms']:.2f}, spread {r['max_over_min']:.2f}, "
              f"peak memory {r['median_peak_mem_mb']:.2f}")
    os.makedirs(a.out, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = os.path.join(a.out, f"host_malloc-{stamp}.json")
    with open(path, "w") as f:
        json.dump({"args": vars(a), "sweeps": sweeps, "summary": summary}, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
