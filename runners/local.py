"""The local launcher: one torchrun on this machine, its output written to ``<run_dir>/launch.log``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from runners.command import launch_env, torchrun_command, worker_program
from runners.supervisor import Job, end_process_tree

_BUSY_PORT = re.compile(r"address already in use|EADDRINUSE", re.IGNORECASE)


def _resolve_prctl():
    """libc's prctl, looked up once in this process (not in the forked child, where loading a library
    could deadlock on a lock another thread held at fork time); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _resolve_prctl()
_PR_SET_PDEATHSIG = 1


def events_of(plan: str | None) -> str | None:
    """The events file of the worker group whose plan is ``plan`` (kanlib.worker), or None."""
    if not plan:
        return None
    from kanlib.worker import EVENTS_NAME

    return os.path.join(os.path.dirname(plan), EVENTS_NAME)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the launching process dies (Linux), so a killed sweep does not
    leave its run behind; the run then checkpoints and stops like a preemption."""
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def start_torchrun(cmd: list[str], env: dict, log_path: str) -> subprocess.Popen:
    """Start ``cmd`` in a process group of its own, its output appended to ``log_path`` (no pipe: nothing
    to drain, nothing to block on), with the parent-death signal armed."""
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True,
                                preexec_fn=_die_with_parent if _PRCTL is not None else None)


class LocalJob(Job):
    """One torchrun with ``nproc_per_node`` processes, rendezvous on 127.0.0.1 (a port the OS picks).

    With ``plan`` (a worker group's plan file, kanlib.worker) the workers run every run of the plan and the
    log, ``launch.log``, goes beside the plan; without, they run ``cfg`` alone, logging into its folder."""

    launcher = "local"

    def __init__(self, cfg, *, max_restarts: int = 0, python: str = sys.executable, plan: str | None = None):
        self.cfg, self.max_restarts, self.python, self.plan = cfg, max_restarts, python, plan
        where = os.path.dirname(plan) if plan else cfg.run_dir()
        self.log = os.path.join(where, "launch.log")
        self.proc: subprocess.Popen | None = None

    def events_path(self) -> str | None:
        return events_of(self.plan)

    def start(self) -> None:
        cmd = torchrun_command(self.cfg, python=self.python, max_restarts=self.max_restarts,
                               program=worker_program(self.plan) if self.plan else None)
        self.proc = start_torchrun(cmd, launch_env(self.cfg, "local"), self.log)

    def poll(self) -> int | None:
        return self.proc.poll()

    def cancel(self, grace_s: float) -> None:
        if self.proc is not None:
            end_process_tree(self.proc, grace_s)

    def log_paths(self) -> list[str]:
        return [self.log]

    def retry(self, attempt_log: str) -> bool:
        # A port taken between torchrun picking it and binding it: relaunching picks another.
        return bool(_BUSY_PORT.search(attempt_log))
