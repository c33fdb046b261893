"""Fault injection for tests: make one rank fail in a chosen way at a chosen step.

Off unless the environment variable ``KANLIB_FAULT`` is set. Its value is a comma-separated
list of ``mode@rank:step[#text]`` items, for example ``KANLIB_FAULT=kill@1:12`` or
``KANLIB_FAULT=nan@1:3,nan@0:7``. With ``#text`` the fault fires only in runs whose run key contains
``text`` (a worker group runs many runs in one process: ``raise@0:3#-r1-`` fails the repeat 1 runs only).
Step ``-1`` is before the run starts: a worker group (kanlib.worker) fires a ``kill`` or ``raise`` due
there between the previous run and this one (only when its processes ran a run before: a fresh launch starts
its first run undisturbed). Modes:

- ``raise``     the rank raises ``InjectedFault`` at the start of that step.
- ``kill``      the rank sends itself SIGKILL at the start of that step.
- ``hang``      the rank stops taking part (sleeps forever) at the start of that step; its
                SIGTERM handler is reset to the default, as for a rank stuck in native code, so
                the launcher's teardown still ends it.
- ``nan``       the rank's loss of that step becomes NaN (the gradients too).
- ``term``      at the start of that step the rank sends SIGTERM to its launcher (torchrun,
                which passes it on to every worker) and to itself, as a scheduler does on
                preemption; the ranks then stop together after that step.
- ``ckptkill``  rank 0 is killed (SIGKILL) while writing the checkpoint of that step: after the
                temporary file is written and synced, before it is renamed into place.

A fault fires only in the first attempt of a run (``TORCHELASTIC_RESTART_COUNT`` unset or 0),
so that a run restarted by ``torchrun --max-restarts`` proceeds undisturbed and can be
compared with an uninterrupted one. See docs/faults.md.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

ENV = "KANLIB_FAULT"
MODES = ("raise", "kill", "hang", "nan", "term", "ckptkill")


class InjectedFault(RuntimeError):
    """Raised by the ``raise`` fault."""


@dataclass(frozen=True)
class Fault:
    mode: str
    rank: int
    step: int
    run: str = ""  # fires only in runs whose key contains this ('' = every run)


def parse(spec: str | None) -> list[Fault]:
    """``'kill@1:12,nan@0:3'`` -> faults; an empty or missing spec is no fault. Bad items raise."""
    out = []
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        try:
            item, _, run = item.partition("#")
            mode, where = item.split("@", 1)
            rank, step = where.split(":", 1)
            fault = Fault(mode.strip(), int(rank), int(step), run.strip())
        except ValueError:
            raise ValueError(f"{ENV}: cannot read {item!r}; expected mode@rank:step[#run], e.g. kill@1:12") from None
        if fault.mode not in MODES:
            raise ValueError(f"{ENV}: unknown mode {fault.mode!r} in {item!r}; choose one of {', '.join(MODES)}")
        out.append(fault)
    return out


def first_attempt() -> bool:
    """True in the first attempt of a torchrun job (and outside torchrun)."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def active(run_key: str = "") -> list[Fault]:
    """The faults of this process's environment that may fire now in the run ``run_key`` (none after a
    restart)."""
    if not first_attempt():
        return []
    return [f for f in parse(os.environ.get(ENV)) if f.run in run_key]


def due(faults: list[Fault], mode: str, rank: int, step: int) -> bool:
    """Whether ``mode`` is scheduled for ``rank`` at ``step``."""
    return any(f.mode == mode and f.rank == rank and f.step == step for f in faults)


def between_runs(faults: list[Fault], rank: int) -> None:
    """Fire a ``kill`` or ``raise`` due at step -1: in a worker group, after the previous run and before this
    one begins (as a launch that dies between two runs)."""
    at_step_start(faults, rank, -1)


def at_step_start(faults: list[Fault], rank: int, step: int) -> None:
    """Fire the faults due at the start of ``step`` on ``rank`` (raise, kill, hang, term)."""
    if not faults:
        return
    if due(faults, "raise", rank, step):
        raise InjectedFault(f"{ENV}: injected failure on rank {rank} at step {step}")
    if due(faults, "kill", rank, step):
        os.kill(os.getpid(), signal.SIGKILL)
    if due(faults, "term", rank, step):
        # The scheduler signals every process of the job; this rank gets its own SIGTERM at once
        # (so the stop is agreed at this step, not whenever torchrun's copy arrives).
        os.kill(os.getppid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
    if due(faults, "hang", rank, step):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        while True:
            time.sleep(3600)
