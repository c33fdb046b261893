"""Launch a training run through torchrun and collect its record.

``torchrun_command`` is a pure function (config in, argv out); ``run`` executes it, streams
its output to the console and to ``<run_dir>/launch.log``, and returns the run's record, or
raises :class:`RunFailed` with the tail of the log when the run fails.

Every attempt ``run`` makes is appended to the study's manifest
(``out_dir/<study>/manifest.jsonl``, kanlib.records.append_manifest) with its status: ok,
failed, timeout (the run-level deadline ``timeout_s`` passed) or preempted (the training
processes were sent SIGTERM and checkpointed; see kanlib.train). Local runs rendezvous on
127.0.0.1, port 0 (the OS picks a free one); a launch that still reports an address in use is
relaunched (docs/faults.md).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import torch

from kanlib import records
from kanlib.config import ConfigError, RunConfig

ENTRY = ["-m", "kanlib.train"]
SHUTDOWN_GRACE_S = 15  # SIGTERM to SIGKILL, for torchrun's workers (a preempted run checkpoints)
LAUNCHERS = ("local", "multinode", "slurm")
LOG_TAIL_LINES = 200


class RunFailed(RuntimeError):
    """A launched run exited without a record. ``returncode`` and ``log_tail`` say why."""

    def __init__(self, message: str, returncode: int | None = None, log_tail: str = "", run_dir: str = "",
                 status: str = "failed", error: str = ""):
        super().__init__(message)
        self.returncode, self.log_tail, self.run_dir = returncode, log_tail, run_dir
        self.status = status  # failed | timeout | preempted (as in the manifest)
        self.error = error  # the root-cause line found in the log, or a summary


def available_cpus() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


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
    if not uses_cuda and cfg.nproc_per_node > available_cpus():
        raise ConfigError(f"nproc_per_node: {cfg.nproc_per_node} CPU processes per node but only "
                          f"{available_cpus()} CPU cores are available to this process (the "
                          f"processes would share cores and the timings would mean nothing)")


def torchrun_command(cfg: RunConfig, *, python: str = sys.executable, standalone: bool = True,
                     rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
                     max_restarts: int = 0, entry: list[str] | None = None) -> list[str]:
    """The torchrun command line of one run (one torchrun per node).

    ``standalone`` runs a single-node job with a private c10d rendezvous on the loopback
    address: ``rdzv_endpoint`` defaults to ``127.0.0.1:0`` (the store binds a port the OS
    picks, so a busy port cannot collide; a fixed port that is taken would make torchrun wait
    as a client of whatever holds it) and ``rdzv_id`` to a fresh uuid. Otherwise a c10d
    rendezvous at ``rdzv_endpoint`` (``host:port``) with id ``rdzv_id`` joins ``cfg.nnodes``
    torchrun invocations.
    """
    cmd = [python, "-m", "torch.distributed.run"]
    if standalone:
        if cfg.nnodes != 1:
            raise ConfigError(f"nnodes: a standalone (local) launch has one node, got {cfg.nnodes}")
        rdzv_endpoint = rdzv_endpoint or "127.0.0.1:0"  # port 0: the store binds a free port itself
        rdzv_id = rdzv_id or uuid.uuid4().hex
        cmd += ["--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                f"--rdzv-id={rdzv_id}"]
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
    # Restarts under gloo fail to reconnect when workers share torchrun's rendezvous store
    # ("Gloo connectFullMesh failed"); a separate store per attempt works (docs/faults.md).
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    # How long torchrun waits for workers to checkpoint after SIGTERM before it kills them.
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_GRACE_S))
    # The launched processes import kanlib from this checkout even when it is not installed.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def read_record(cfg: RunConfig) -> dict | None:
    """The record of a completed run, or None when the run has none yet."""
    path = os.path.join(cfg.run_dir(), records.RECORD_NAME)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _resolve_prctl():
    """libc's prctl, looked up once in this process (not in the forked child, where loading a
    library could deadlock on a lock another thread held at fork time); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _resolve_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the launching process dies (Linux), so a killed
    sweep does not leave its run behind; the run then checkpoints and stops like a preemption."""
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def run_command(cmd: list[str], env: dict, log_path: str, *, timeout_s: float | None = None,
                echo=None, tail_lines: int = 200, kill_grace_s: float = SHUTDOWN_GRACE_S + 5) -> tuple[int, str]:
    """Run ``cmd`` in its own process group, streaming output to ``echo`` and ``log_path``.

    Returns ``(returncode, tail)``. Past ``timeout_s`` the whole group is sent SIGTERM, then
    SIGKILL after ``kill_grace_s``, and the return code is None. If this process is
    interrupted (KeyboardInterrupt, an exception) the group is ended the same way before the
    exception propagates; if this process dies, the command gets SIGTERM.
    """
    echo = sys.stdout if echo is None else echo
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1, start_new_session=True,
                                preexec_fn=_die_with_parent if _PRCTL is not None else None)
        try:
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
                    log.write(f"kanlib: run deadline of {timeout_s} s passed; ending the process group\n")
                    _kill_group(proc, kill_grace_s)
                    break
                time.sleep(0.05)
        except BaseException:
            _kill_group(proc, kill_grace_s)
            raise
        finally:
            proc.stdout.close()
    return (None if timed_out else proc.returncode), "".join(tail)


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc; empty where there is none)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children[ppid].append(int(e))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the run (torchrun's process group and its workers, which torchrun starts in
    sessions of their own), then SIGKILL what is left after ``grace_s``."""
    pids = set(descendants(proc.pid))
    for sig, grace in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids |= set(descendants(proc.pid)) if proc.poll() is None else set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        if sig == signal.SIGKILL:
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, sig)
        end = time.monotonic() + grace
        while time.monotonic() < end:
            if proc.poll() is not None and not any(_alive(p) for p in pids):
                return
            time.sleep(0.05)


_ERROR_LINE = re.compile(r"^(?:\[rank(\d+)\]:?\s*)?((?:[\w.]+\.)?\w*(?:Error|Exception|Fault|Loss)\b:.*)$")
_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)
_BUSY_PORT = re.compile(r"address already in use|EADDRINUSE", re.IGNORECASE)


def error_line(log: str) -> str:
    """The most telling error of a run's log: the last ``SomeError: ...`` line of the rank torchrun
    names as the root cause, else that rank's exit code, else the last error line, else ''."""
    lines: list[tuple[str | None, str]] = []
    for line in log.splitlines():
        m = _ERROR_LINE.match(line.strip())
        if m and "ChildFailedError" not in m.group(2):
            lines.append((m.group(1), m.group(2)))
    root = _ROOT_CAUSE.search(log)
    if root:
        mine = [text for rank, text in lines if rank == root.group(1)]
        if mine:
            return mine[-1][:500]
        code = int(root.group(2))
        if code < 0:
            try:
                return f"rank {root.group(1)} was killed by {signal.Signals(-code).name}"
            except ValueError:
                pass
        if not lines:
            return f"rank {root.group(1)} exited with code {code}"
    return lines[-1][1][:500] if lines else ""


def run(cfg: RunConfig, *, launcher: str = "local", launcher_opts: dict | None = None,
        timeout_s: float | None = None, echo=None, max_restarts: int = 0, port_retries: int = 3) -> dict:
    """Launch ``cfg``, append the attempt to the study's manifest, and return its record.

    ``launcher='local'`` runs one torchrun with ``nproc_per_node`` processes on this machine;
    ``launcher='multinode'`` runs ``nnodes`` torchruns here joined by one c10d rendezvous
    (runners/multinode.py); ``launcher='slurm'`` submits it to SLURM (see runners/slurm.py;
    ``launcher_opts`` are its site settings). ``timeout_s`` is a deadline for the whole run (status ``timeout``);
    ``max_restarts`` lets torchrun restart failed workers, which resume from the last
    checkpoint. A local launch that fails with "address already in use" (a port taken between
    torchrun picking it and binding it) is relaunched, up to ``port_retries`` times. Raises
    :class:`RunFailed` (with
    ``status`` failed, timeout or preempted) when there is no record, and ConfigError for a
    config this machine cannot run (also recorded as a failed attempt).
    """
    if launcher not in LAUNCHERS:
        raise ConfigError(f"launcher: unknown value {launcher!r}; choose one of {', '.join(LAUNCHERS)}")
    manifest = records.manifest_path(cfg.out_dir, cfg.study)
    started = time.time()
    row = {"run_key": cfg.run_key(), "study": cfg.study, "world_size": cfg.world_size,
           "launcher": launcher, "attempt_at": records.now_iso(), "run_dir": cfg.run_dir()}

    def note(status: str, exit_code, error: str = "") -> None:
        records.append_manifest(manifest, {**row, "status": status, "exit_code": exit_code,
                                           "error": error, "duration_s": round(time.time() - started, 3)})

    try:
        if launcher == "slurm":
            from runners.slurm import run_slurm

            record = run_slurm(cfg, timeout_s=timeout_s, echo=echo, **(launcher_opts or {}))
        elif launcher == "multinode":
            from runners.multinode import run_multinode

            record = run_multinode(cfg, timeout_s=timeout_s, echo=echo, **(launcher_opts or {}))
        else:
            record = _run_local(cfg, timeout_s=timeout_s, echo=echo, max_restarts=max_restarts,
                                port_retries=port_retries)
    except RunFailed as e:
        note(e.status, e.returncode, e.error or str(e).splitlines()[0])
        raise
    except ConfigError as e:
        note("failed", None, f"ConfigError: {e}")
        raise
    except KeyboardInterrupt:  # run_command has sent the run SIGTERM and waited for it
        from kanlib.records import PREEMPTED_NAME

        if os.path.exists(os.path.join(cfg.run_dir(), PREEMPTED_NAME)):
            note("preempted", None, "the launching process was interrupted; the run checkpointed and stopped")
        else:
            note("failed", None, "the launching process was interrupted; the run stopped without a checkpoint")
        raise
    except Exception as e:  # anything else still leaves its row
        note("failed", None, f"{type(e).__name__}: {e}")
        raise
    if record is None:  # a dry run (slurm dry_run=True) launched nothing
        return record
    note("ok", 0)
    return record


def _run_local(cfg: RunConfig, *, timeout_s, echo, max_restarts: int, port_retries: int) -> dict:
    check_environment(cfg)
    run_dir = cfg.run_dir()
    os.makedirs(run_dir, exist_ok=True)
    from kanlib.records import PREEMPTED_NAME

    marker = os.path.join(run_dir, PREEMPTED_NAME)
    log_path = os.path.join(run_dir, "launch.log")
    for attempt in range(port_retries + 1):
        with contextlib.suppress(FileNotFoundError):
            os.remove(marker)
        cmd = torchrun_command(cfg, max_restarts=max_restarts)
        log_start = os.path.getsize(log_path) if os.path.exists(log_path) else 0
        rc, tail = run_command(cmd, launch_env(cfg, "local"), log_path, timeout_s=timeout_s, echo=echo)
        record = read_record(cfg)
        if rc == 0 and record is not None:
            return record
        busy = rc is not None and _BUSY_PORT.search(tail) and not os.path.exists(marker)
        if not (busy and attempt < port_retries):
            break
        with open(log_path, "a") as log:
            log.write("kanlib: a port was taken (address already in use); relaunching\n")
    if rc is None:
        status, why = "timeout", f"passed its deadline of {timeout_s} s"
    elif os.path.exists(marker):
        status, why = "preempted", f"was preempted (SIGTERM; checkpoint saved, exit code {rc})"
    else:
        status, why = "failed", f"exited with code {rc}"
    with open(log_path, "rb") as f:
        f.seek(log_start)
        attempt_log = f.read().decode(errors="replace")
    err = error_line(attempt_log) or why
    # log_tail: this attempt's last LOG_TAIL_LINES lines (torchrun's failure report alone is ~30).
    log_tail = "".join(attempt_log.splitlines(keepends=True)[-LOG_TAIL_LINES:])
    raise RunFailed(f"run {cfg.run_key()} (world size {cfg.world_size}) {why}: {err}\nlog: {log_path}"
                    f"\n--- last lines ---\n{tail}",
                    returncode=rc, log_tail=log_tail, run_dir=run_dir, status=status,
                    error=err if status == "failed" else f"{why}; {err}" if err != why else why)
