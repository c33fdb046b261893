"""Launch a training run through torchrun and collect its record.

``torchrun_command`` is a pure function (config in, argv out); ``run`` executes it, streams
its output to the console and to ``<run_dir>/launch.log``, and returns the run's record, or
raises :class:`RunFailed` with the tail of the log when the run fails.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time

import torch

from kanlib import results
from kanlib.config import ConfigError, RunConfig

ENTRY = ["-m", "kanlib.train"]


class RunFailed(RuntimeError):
    """A launched run exited without a record. ``returncode`` and ``log_tail`` say why."""

    def __init__(self, message: str, returncode: int | None = None, log_tail: str = "", run_dir: str = ""):
        super().__init__(message)
        self.returncode, self.log_tail, self.run_dir = returncode, log_tail, run_dir


def check_environment(cfg: RunConfig) -> None:
    """Refuse, before any process starts, a config this machine cannot run (names the field)."""
    wants_cuda = cfg.device == "cuda" or cfg.backend == "nccl"
    if wants_cuda and not torch.cuda.is_available():
        field = "device" if cfg.device == "cuda" else "backend"
        raise ConfigError(f"{field}: {getattr(cfg, field)!r} needs CUDA, but no GPU is visible here")
    uses_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if uses_cuda and cfg.nproc_per_node > torch.cuda.device_count():
        raise ConfigError(f"nproc_per_node: {cfg.nproc_per_node} processes per node but only "
                          f"{torch.cuda.device_count()} CUDA devices are visible")


def torchrun_command(cfg: RunConfig, *, python: str = sys.executable, standalone: bool = True,
                     rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
                     max_restarts: int = 0, entry: list[str] | None = None) -> list[str]:
    """The torchrun command line of one run (one torchrun per node).

    ``standalone`` runs a single-node job with a private rendezvous on a free local port;
    otherwise a c10d rendezvous at ``rdzv_endpoint`` (``host:port``) with id ``rdzv_id`` joins
    ``cfg.nnodes`` torchrun invocations.
    """
    cmd = [python, "-m", "torch.distributed.run"]
    if standalone:
        if cfg.nnodes != 1:
            raise ConfigError(f"nnodes: a standalone (local) launch has one node, got {cfg.nnodes}")
        cmd += ["--standalone", "--nnodes=1"]
    else:
        if not rdzv_endpoint or not rdzv_id:
            raise ValueError("a multi-node launch needs rdzv_endpoint (host:port) and rdzv_id")
        cmd += [f"--nnodes={cfg.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                f"--rdzv-id={rdzv_id}"]
    cmd += [f"--nproc-per-node={cfg.nproc_per_node}", f"--max-restarts={max_restarts}"]
    cmd += (entry or ENTRY) + cfg.to_cli()
    return cmd


def launch_env(cfg: RunConfig, launcher: str = "local", base: dict | None = None) -> dict:
    """The environment of a launched run: one OpenMP thread pool of ``cfg.threads`` per process."""
    env = dict(os.environ if base is None else base)
    env["OMP_NUM_THREADS"] = str(cfg.threads)
    env["KANLIB_LAUNCHER"] = launcher
    env.setdefault("PYTHONUNBUFFERED", "1")
    # The launched processes import kanlib from this checkout even when it is not installed.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def read_record(cfg: RunConfig) -> dict | None:
    """The record of a completed run, or None when the run has none yet."""
    path = os.path.join(cfg.run_dir(), results.RECORD_NAME)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def run_command(cmd: list[str], env: dict, log_path: str, *, timeout_s: float | None = None,
                echo=None, tail_lines: int = 200) -> tuple[int, str]:
    """Run ``cmd`` in its own process group, streaming output to ``echo`` and ``log_path``.

    Returns ``(returncode, tail)``. Past ``timeout_s`` the whole group is killed and the return
    code is None.
    """
    echo = sys.stdout if echo is None else echo
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1, start_new_session=True)
        os.set_blocking(proc.stdout.fileno(), False)
        timed_out = False
        while True:
            line = proc.stdout.readline()
            if line:
                log.write(line)
                log.flush()
                tail.append(line)
                if echo:
                    echo.write(line)
                continue
            if proc.poll() is not None:
                rest = proc.stdout.read() or ""
                for ln in rest.splitlines(keepends=True):
                    log.write(ln)
                    tail.append(ln)
                    if echo:
                        echo.write(ln)
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                _kill_group(proc)
                break
            time.sleep(0.05)
        proc.stdout.close()
    return (None if timed_out else proc.returncode), "".join(tail)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the run's process group, then SIGKILL what is left after a grace period."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


LAUNCHERS = ("local", "multinode", "slurm")


def run(cfg: RunConfig, *, launcher: str = "local", launcher_opts: dict | None = None,
        timeout_s: float | None = None, echo=None, max_restarts: int = 0) -> dict:
    """Launch ``cfg`` and return its record.

    ``launcher='local'`` runs one torchrun with ``nproc_per_node`` processes on this machine;
    ``launcher='multinode'`` runs ``nnodes`` torchruns here joined by one c10d rendezvous;
    ``launcher='slurm'`` submits it to SLURM (see runners/slurm.py; ``launcher_opts`` are its
    site settings).
    """
    if launcher not in LAUNCHERS:
        raise ConfigError(f"launcher: unknown value {launcher!r}; choose one of {', '.join(LAUNCHERS)}")
    if launcher == "slurm":
        from runners.slurm import run_slurm

        return run_slurm(cfg, timeout_s=timeout_s, echo=echo, **(launcher_opts or {}))
    if launcher == "multinode":
        from runners.multinode import run_multinode

        return run_multinode(cfg, timeout_s=timeout_s, echo=echo, **(launcher_opts or {}))
    check_environment(cfg)
    run_dir = cfg.run_dir()
    os.makedirs(run_dir, exist_ok=True)
    cmd = torchrun_command(cfg, max_restarts=max_restarts)
    rc, tail = run_command(cmd, launch_env(cfg, "local"), os.path.join(run_dir, "launch.log"),
                           timeout_s=timeout_s, echo=echo)
    record = read_record(cfg)
    if rc == 0 and record is not None:
        return record
    why = "timed out" if rc is None else f"exited with code {rc}"
    raise RunFailed(f"run {cfg.run_key()} (world size {cfg.world_size}) {why}; log: "
                    f"{os.path.join(run_dir, 'launch.log')}\n{summarize_failure(tail)}",
                    returncode=rc, log_tail=tail, run_dir=run_dir)


def summarize_failure(log: str, n_errors: int = 8, n_last: int = 12) -> str:
    """The workers' own error lines (not torchrun's summary) and the last lines of a failed run's log."""
    lines = log.splitlines()
    errors = [ln for ln in lines if re.search(r"(Error|Exception|error:)", ln)
              and "torch/distributed/elastic" not in ln and "elastic/errors.html" not in ln]
    out = []
    if errors:
        out += ["--- errors ---"] + errors[:n_errors]
    out += ["--- last lines ---"] + lines[-n_last:]
    return "\n".join(out)
