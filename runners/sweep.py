"""Run a list of configs one after another, with progress, and collect their records.

A sweep is resumable: a run whose ``record.json`` says ``status: ok`` is skipped (it is not
run again and gets no new manifest row); any other run is launched, and resumes from its last
committed checkpoint when it has one. A failing run is recorded in the study's manifest
(``out_dir/<study>/manifest.jsonl``, by :func:`runners.launch.run`) and the sweep carries on;
the failures are reported at the end. Killing the sweep and starting it again completes only
what is missing (a run in flight when the sweep dies gets SIGTERM and checkpoints).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from dataclasses import dataclass, field

from kanlib.config import ConfigError, RunConfig
from runners.launch import RunFailed, read_record, run


# Columns a launch notebook shows for the runs of a sweep.
SUMMARY_COLUMNS = ["study", "model", "widths", "world_size", "nnodes", "nproc_per_node", "global_batch", "repeat",
                   "comm_hook", "bucket_cap_mb", "n_params", "step_time_s", "samples_per_s", "forward_s",
                   "backward_s", "optimizer_s", "comm_total_s", "peak_mem_bytes", "final_val_loss", "launcher"]


@dataclass
class SweepResult:
    """What a sweep produced: the records of finished runs and the failures (config, message).

    Each failure message starts with the attempt's manifest status (failed, timeout, preempted).
    """

    records: list[dict] = field(default_factory=list)
    failures: list[tuple[RunConfig, str]] = field(default_factory=list)
    skipped: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures


def run_sweep(configs: list[RunConfig], *, launcher: str = "local", launcher_opts: dict | None = None,
              timeout_s: float | None = None, skip_done: bool = True, progress: bool = True,
              echo=False, max_restarts: int = 0) -> SweepResult:
    """Run each config (skipping those with an ok record already, when ``skip_done``), carry on
    past failures, and report them at the end. ``echo`` streams the runs' output (False: quiet).
    ``timeout_s`` is each run's deadline; ``max_restarts`` is passed to torchrun. SIGTERM to
    the sweep (or Ctrl-C) stops the run in flight gracefully (it checkpoints and is recorded as
    preempted) and raises :class:`SweepInterrupted` (KeyboardInterrupt for Ctrl-C)."""

    result = SweepResult()
    t0 = time.monotonic()
    with _sigterm_interrupts():
        _sweep(configs, result, launcher=launcher, launcher_opts=launcher_opts, timeout_s=timeout_s,
               skip_done=skip_done, progress=progress, echo=echo, max_restarts=max_restarts)
    elapsed = time.monotonic() - t0
    print(f"sweep: {len(result.records)} ok ({result.skipped} already done), "
          f"{len(result.failures)} failed, {elapsed:.1f} s")
    for cfg, msg in result.failures:
        print(f"FAILED {cfg.run_key()}: {msg.splitlines()[0]}")
    return result


class SweepInterrupted(KeyboardInterrupt):
    """The sweep process got SIGTERM; the run in flight was stopped (checkpointed) and recorded
    as preempted."""


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM to the sweep process raises :class:`SweepInterrupted` (main thread only), so the
    run in flight is ended gracefully and its attempt recorded, as for Ctrl-C."""
    def handle(signum, frame):
        raise SweepInterrupted("the sweep got SIGTERM")

    try:
        prev = signal.signal(signal.SIGTERM, handle)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, prev)


def _sweep(configs, result: SweepResult, *, launcher, launcher_opts, timeout_s, skip_done, progress,
           echo, max_restarts) -> None:
    from tqdm.auto import tqdm

    bar = tqdm(total=len(configs), desc="sweep", unit="run", disable=not progress, file=sys.stdout)
    for cfg in configs:
        bar.set_postfix_str(f"{cfg.study} ws={cfg.world_size} r={cfg.repeat}")
        done = _ok_record(cfg) if skip_done else None
        if done is not None:
            result.records.append(done)
            result.skipped += 1
        else:
            try:
                result.records.append(run(cfg, launcher=launcher, launcher_opts=launcher_opts,
                                          timeout_s=timeout_s, echo=None if echo else False,
                                          max_restarts=max_restarts))
            except RunFailed as e:
                result.failures.append((cfg, f"{e.status}: {e.error or str(e).splitlines()[0]}"))
            except ConfigError as e:
                result.failures.append((cfg, f"failed: ConfigError: {e}"))
        bar.update(1)
    bar.close()


def _ok_record(cfg: RunConfig) -> dict | None:
    """The run's record when it completed ok; None when missing, unreadable or not ok."""
    try:
        rec = read_record(cfg)
    except (OSError, ValueError):  # a garbage record counts as not done
        return None
    return rec if isinstance(rec, dict) and rec.get("status") == "ok" else None
