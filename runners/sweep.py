"""Run a list of configs one after another, with progress, and collect their records.

A sweep is resumable: a run whose ``record.json`` is a valid ``ok`` record is skipped (it is not run
again and gets no new manifest row); any other run is launched, and resumes from its last committed
checkpoint when it has one. A failing run is recorded in the study's manifest (by
:func:`runners.launch.run`) and the sweep carries on; the failures are reported at the end. Killing the
sweep and starting it again completes only what is missing (a run in flight when the sweep dies gets
SIGTERM and checkpoints). Two sweeps over the same folder never run one run twice: the run-folder lock
(runners/supervisor.py) makes the second wait, then skip what the first completed.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from dataclasses import dataclass, field

from kanlib.config import ConfigError
from runners.launch import RunFailed, read_record, run

# Columns a launch notebook shows for the runs of a sweep.
SUMMARY_COLUMNS = ["study", "model", "widths", "world_size", "nnodes", "nproc_per_node", "global_batch", "repeat",
                   "kan_impl", "kan_path", "comm_hook", "bucket_cap_mb", "n_params", "step_time_s", "samples_per_s",
                   "wall_samples_per_s", "forward_s", "backward_s", "optimizer_s", "comm_total_s", "compile_s",
                   "peak_mem_bytes", "final_val_loss", "launcher"]


@dataclass
class SweepResult:
    """What a sweep produced: the records of finished runs and the failures (config, message).

    Each failure message starts with the attempt's manifest status (failed, timeout, preempted).
    """

    records: list[dict] = field(default_factory=list)
    failures: list[tuple[object, str]] = field(default_factory=list)
    skipped: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures


class SweepInterrupted(KeyboardInterrupt):
    """The sweep process got SIGTERM; the run in flight was stopped (checkpointed) and recorded as preempted."""


def run_sweep(configs: list, *, launcher: str = "local", launcher_opts: dict | None = None,
              timeout_s: float | None = None, skip_done: bool = True, progress: bool = True,
              stream_output: bool = False, max_restarts: int = 0) -> SweepResult:
    """Run each config (skipping those with an ok record already, when ``skip_done``), carry on past
    failures, and report them at the end. ``stream_output`` echoes the runs' output to stdout.
    ``timeout_s`` is each run's deadline; ``max_restarts`` is passed to torchrun. SIGTERM to the sweep (or
    Ctrl-C) stops the run in flight gracefully (it checkpoints and is recorded as preempted) and raises
    :class:`SweepInterrupted` (KeyboardInterrupt for Ctrl-C)."""
    from tqdm.auto import tqdm

    result = SweepResult()
    t0 = time.monotonic()
    with _sigterm_interrupts():
        bar = tqdm(total=len(configs), desc="sweep", unit="run", disable=not progress, file=sys.stdout)
        for cfg in configs:
            bar.set_postfix_str(f"{cfg.study} {cfg.placement} r={cfg.repeat}")
            done = _ok_record(cfg) if skip_done else None
            if done is not None:
                result.records.append(done)
                result.skipped += 1
            else:
                try:
                    result.records.append(run(cfg, launcher=launcher, launcher_opts=launcher_opts,
                                              timeout_s=timeout_s, echo=None if stream_output else False,
                                              max_restarts=max_restarts))
                except RunFailed as e:
                    result.failures.append((cfg, f"{e.status}: {e.error or str(e).splitlines()[0]}"))
                except ConfigError as e:
                    result.failures.append((cfg, f"failed: ConfigError: {e}"))
            bar.update(1)
        bar.close()
    print(f"sweep: {len(result.records)} ok ({result.skipped} already done), "
          f"{len(result.failures)} failed, {time.monotonic() - t0:.1f} s")
    for cfg, msg in result.failures:
        print(f"FAILED {cfg.run_key()}: {msg.splitlines()[0]}")
    return result


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM to the sweep process raises :class:`SweepInterrupted` (main thread only), so the run in
    flight is ended gracefully and its attempt recorded, as for Ctrl-C."""
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


def _ok_record(cfg) -> dict | None:
    """The run's record when it completed ok (a valid record); None when missing, unreadable or invalid."""
    return read_record(cfg)
