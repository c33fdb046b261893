"""Run a list of configs one after another, with progress, and collect their records."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from kanlib.config import RunConfig
from runners.launch import RunFailed, read_record, run


# Columns a launch notebook shows for the runs of a sweep.
SUMMARY_COLUMNS = ["study", "model", "widths", "world_size", "nnodes", "nproc_per_node", "global_batch", "repeat",
                   "comm_hook", "bucket_cap_mb", "n_params", "step_time_s", "samples_per_s", "forward_s",
                   "backward_s", "optimizer_s", "comm_total_s", "peak_mem_bytes", "final_val_loss", "launcher"]


@dataclass
class SweepResult:
    """What a sweep produced: the records of finished runs and the failures (config, message)."""

    records: list[dict] = field(default_factory=list)
    failures: list[tuple[RunConfig, str]] = field(default_factory=list)
    skipped: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures


def run_sweep(configs: list[RunConfig], *, launcher: str = "local", launcher_opts: dict | None = None,
              timeout_s: float | None = None, skip_done: bool = True, progress: bool = True,
              echo=False) -> SweepResult:
    """Run each config (skipping those with a record already, when ``skip_done``), carry on past
    failures, and report them at the end. ``echo`` streams the runs' output (False: quiet)."""
    from tqdm.auto import tqdm

    result = SweepResult()
    t0 = time.monotonic()
    bar = tqdm(total=len(configs), desc="sweep", unit="run", disable=not progress, file=sys.stdout)
    for i, cfg in enumerate(configs):
        bar.set_postfix_str(f"{cfg.study} ws={cfg.world_size} r={cfg.repeat}")
        done = read_record(cfg) if skip_done else None
        if done is not None and done.get("status") == "ok":
            result.records.append(done)
            result.skipped += 1
        else:
            try:
                result.records.append(run(cfg, launcher=launcher, launcher_opts=launcher_opts,
                                          timeout_s=timeout_s, echo=None if echo else False))
            except RunFailed as e:
                result.failures.append((cfg, str(e)))
        bar.update(1)
    bar.close()
    elapsed = time.monotonic() - t0
    print(f"sweep: {len(result.records)} ok ({result.skipped} already done), "
          f"{len(result.failures)} failed, {elapsed:.1f} s")
    for cfg, msg in result.failures:
        print(f"FAILED {cfg.run_key()}: {msg.splitlines()[0]}")
    return result
