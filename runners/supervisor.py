"""One supervisor for every launcher: start a job, follow it, decide what happened, record it.

Launchers differ only in how a job starts, is polled, is cancelled and where its logs are; each is a
:class:`Job` (runners/local.py, runners/multinode.py, runners/slurm.py). :func:`supervise` owns the rest,
once for all of them:

- the run-folder lock: one live process owns a run folder at a time (``fcntl.flock``, released by the
  kernel when its owner dies, so a dead owner never holds it); a second runner waits, saying who holds it;
- the deadline (``timeout_s``: cancel the job, status ``timeout``);
- log streaming (every log file followed by byte offset, lines echoed and kept as a tail);
- interruption (Ctrl-C, SIGTERM to a sweep): the job is cancelled gracefully and the attempt recorded;
- the outcome: ``ok`` only with a *fresh* valid record (a new ``run_id``); ``preempted`` when the run
  checkpointed on SIGTERM; ``timeout``; else ``failed`` with the root-cause error from the log;
- exactly one manifest row per attempt (kanlib.records.ManifestRow).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import sys
import time

from kanlib import records

LOG_TAIL_LINES = 200
DEADLINE_MARK = "kanlib: run deadline"  # the line the supervisor writes into the logs when it ends a run
POLL_S = 0.05


class RunFailed(RuntimeError):
    """A launched run ended without a fresh record. ``status`` (failed, timeout, preempted), ``returncode``,
    ``error`` (the root cause) and ``log_tail`` say why; ``run_dir`` where to look."""

    def __init__(self, message: str, returncode: int | None = None, log_tail: str = "", run_dir: str = "",
                 status: str = "failed", error: str = ""):
        super().__init__(message)
        self.returncode, self.log_tail, self.run_dir = returncode, log_tail, run_dir
        self.status, self.error = status, error


class Job:
    """How one launcher starts, polls and cancels a run. Subclasses set ``launcher`` and implement these."""

    launcher = "local"

    def start(self) -> None:
        """Start the run (non-blocking)."""
        raise NotImplementedError

    def poll(self) -> int | None:
        """The exit code once the run has ended, None while it runs."""
        raise NotImplementedError

    def cancel(self, grace_s: float) -> None:
        """End the run: ask it to stop (it checkpoints), and after ``grace_s`` kill what is left."""
        raise NotImplementedError

    def log_paths(self) -> list[str]:
        """The files the run's output goes to (they may not exist yet)."""
        raise NotImplementedError

    def describe(self) -> str:
        """How the job is known in messages (e.g. 'SLURM job 17', 'rendezvous 127.0.0.1:4242')."""
        return ""

    def outcome(self, returncode: int | None) -> tuple[str | None, str]:
        """A launcher's own verdict on an ended job without a fresh record: ``(status or None, why)``,
        e.g. SLURM's PREEMPTED or TIMEOUT state; None lets the supervisor decide."""
        return None, ""

    def retry(self, attempt_log: str) -> bool:
        """Whether a failed attempt should be relaunched at once (e.g. a port taken meanwhile)."""
        return False

    def log_prefix(self, index: int) -> str:
        """What to put before each echoed line of log ``index``."""
        return ""


# -- the run-folder lock ---------------------------------------------------------------------------
class RunLock:
    """``<run_dir>/.lock``: held (``flock``) by the one process that runs the folder's run now.

    The kernel drops the lock when the holding process dies, however it dies. The file says who holds it
    (pid, host, since) for the message another runner prints while it waits.
    """

    NAME = ".lock"

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, self.NAME)
        self._fd = None

    def holder(self) -> str:
        try:
            with open(self.path) as f:
                info = json.load(f)
            return f"pid {info['pid']} on {info['host']} since {info['since']}"
        except (OSError, ValueError, KeyError):
            return "another process"

    def acquire(self, wait: bool = True, echo=None, poll_s: float = 0.5) -> bool:
        """Take the lock; while another process holds it, wait (saying so once) or return False."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        said = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not wait:
                    os.close(fd)
                    return False
                if not said and echo:
                    echo.write(f"kanlib: {os.path.dirname(self.path)} is being run by {self.holder()}; waiting\n")
                    said = True
                time.sleep(poll_s)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": records.now_iso()}).encode())
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


# -- following logs -------------------------------------------------------------------------------
class LogFollower:
    """Follows several log files by byte offset: new complete lines are echoed and kept as a tail."""

    def __init__(self, paths: list[str], echo, prefixes: list[str], tail_lines: int = LOG_TAIL_LINES):
        self.echo = echo
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.set_paths(paths, prefixes)

    def set_paths(self, paths: list[str], prefixes: list[str]) -> None:
        """Follow ``paths`` from their current ends (this attempt's text starts there)."""
        self.paths, self.prefixes = list(paths), list(prefixes)
        self.start = [_size(p) for p in self.paths]
        self.offsets = list(self.start)

    def pump(self, final: bool = False) -> None:
        for i, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[i])
                    chunk = f.read()
            except FileNotFoundError:
                continue
            cut = len(chunk) if final else chunk.rfind(b"\n") + 1  # a partial line waits for more
            if not cut:
                continue
            self.offsets[i] += cut
            for line in chunk[:cut].decode(errors="replace").splitlines(keepends=True):
                self.tail.append(self.prefixes[i] + line)
                if self.echo:
                    self.echo.write(self.prefixes[i] + line)

    def attempt_text(self, until: str | None = None) -> str:
        """Everything the logs gained during this attempt (for the root-cause search); with ``until``,
        each log's text up to that line only."""
        parts = []
        for path, start in zip(self.paths, self.start):
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    text = f.read().decode(errors="replace")
            except FileNotFoundError:
                continue
            parts.append(text.split(until, 1)[0] if until else text)
        return "\n".join(parts)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


# -- the root cause --------------------------------------------------------------------------------
_ERROR_LINE = re.compile(r"^(?:\[rank(\d+)\]:?\s*)?((?:[\w.]+\.)?\w*(?:Error|Exception|Fault|Loss|Interrupt)\b:.*)$")
_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)
_IGNORED = ("ChildFailedError", "SignalException")


def error_line(log: str) -> str:
    """The most telling error of a run's log: the last ``SomeError: ...`` line of the rank torchrun names
    as the root cause, else that rank's exit code or fatal signal, else the first error line, else ''."""
    lines: list[tuple[str | None, str]] = []
    for line in log.splitlines():
        m = _ERROR_LINE.match(line.strip())
        if m and not any(s in m.group(2) for s in _IGNORED):
            lines.append((m.group(1), m.group(2)))
    root = _ROOT_CAUSE.search(log)
    if root:
        mine = [text for rank, text in lines if rank == root.group(1)]
        if mine:
            return mine[-1][:500]
        code = int(root.group(2))
        if code < 0:
            return f"rank {root.group(1)} was killed by {_signal_name(-code)}"
        if not lines:
            return f"rank {root.group(1)} exited with code {code}"
    return lines[0][1][:500] if lines else ""


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


# -- the supervisor --------------------------------------------------------------------------------
def read_record(cfg) -> dict | None:
    """The run's valid record, or None when it has none yet (an invalid one counts as none)."""
    path = os.path.join(cfg.run_dir(), records.RECORD_NAME)
    if not os.path.exists(path):
        return None
    try:
        return records.read_record(path)
    except records.RecordError:
        return None


def supervise(cfg, job: Job, *, timeout_s: float | None = None, echo=None, retries: int = 0,
              kill_grace_s: float = 20.0, lock_wait: bool = True) -> dict:
    """Run ``job`` (a run of ``cfg``) to its end and return its fresh record, or raise :class:`RunFailed`.

    Takes the run folder's lock first (waiting while another process holds it); when the run was
    completed by that other process meanwhile, returns its record without running it again. Appends one
    manifest row per attempt. ``retries``: relaunch at once when ``job.retry`` says so (same row).
    """
    echo = sys.stdout if echo is None else echo
    run_dir = cfg.run_dir()
    os.makedirs(run_dir, exist_ok=True)
    lock = RunLock(run_dir)
    before = read_record(cfg)
    if not lock.acquire(wait=lock_wait, echo=echo):
        raise RunFailed(f"run {cfg.run_key()} is being run by {lock.holder()}", run_dir=run_dir,
                        error=f"held by {lock.holder()}")
    try:
        now = read_record(cfg)
        if now is not None and (before is None or now.get("run_id") != before.get("run_id")):
            return now  # completed by the process we waited for: each run executes once
        return _attempt(cfg, job, now, timeout_s, echo, retries, kill_grace_s)
    finally:
        lock.release()


def _attempt(cfg, job: Job, before, timeout_s, echo, retries, kill_grace_s) -> dict:
    manifest = records.manifest_path(cfg.out_dir, cfg.study)
    started = time.time()
    row = records.ManifestRow(run_key=cfg.run_key(), study=cfg.study, world_size=cfg.world_size,
                              placement=cfg.placement, launcher=job.launcher, run_dir=cfg.run_dir(),
                              attempt_at=records.now_iso(), pid=os.getpid())

    def note(status: str, code, error: str) -> None:
        row.status, row.exit_code, row.error = status, code, error
        row.duration_s = round(time.time() - started, 3)
        records.append_manifest(manifest, row)

    marker = os.path.join(cfg.run_dir(), records.PREEMPTED_NAME)
    for attempt in range(retries + 1):
        with contextlib.suppress(FileNotFoundError):
            os.remove(marker)
        logs = job.log_paths()
        follow = LogFollower(logs, echo, [job.log_prefix(i) for i in range(len(logs))])
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        timed_out = False
        try:
            try:
                job.start()
            except RunFailed as e:  # refused before anything ran (e.g. sbatch said no)
                note("failed", e.returncode, e.error or str(e).splitlines()[0])
                raise
            if job.log_paths() != logs:  # some launchers know their logs only once started (SLURM)
                logs = job.log_paths()
                follow.set_paths(logs, [job.log_prefix(i) for i in range(len(logs))])
            while True:
                follow.pump()
                code = job.poll()
                if code is not None:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    _append_log(follow.paths, f"{DEADLINE_MARK} of {timeout_s} s passed; ending the run\n",
                                every=True)
                    job.cancel(kill_grace_s)
                    code = None  # no exit code of its own: the runner ended it
                    break
                time.sleep(POLL_S)
        except RunFailed:
            raise
        except BaseException as e:  # Ctrl-C, SIGTERM to the sweep, or a bug: never leave the run behind
            job.cancel(kill_grace_s)
            follow.pump(final=True)
            rec = read_record(cfg)
            if _fresh(rec, before):
                note("ok", 0, "")
            elif os.path.exists(marker):
                note("preempted", None, f"the runner was interrupted ({type(e).__name__}); the run checkpointed "
                                        f"and stopped")
            else:
                note("failed", None, f"the runner was interrupted ({type(e).__name__}: {e}); the run stopped "
                                     f"without a checkpoint")
            raise
        follow.pump(final=True)
        rec = read_record(cfg)
        if not timed_out and code == 0 and _fresh(rec, before):
            note("ok", 0, "")
            return rec
        text = follow.attempt_text()
        if not timed_out and attempt < retries and not os.path.exists(marker) and job.retry(text):
            _append_log(follow.paths, "kanlib: a port was taken (address already in use); relaunching\n")
            continue
        break
    status, why = job.outcome(code)
    if timed_out:  # what the ranks print while being ended is a consequence, not the cause
        text = follow.attempt_text(until=DEADLINE_MARK)
    err = error_line(text)
    if timed_out:
        status, why = "timeout", f"passed its deadline of {timeout_s} s"
    elif status == "timeout":
        pass
    elif os.path.exists(marker) or status == "preempted":
        status, why = "preempted", why or f"was preempted (SIGTERM; checkpoint saved, exit code {code})"
    elif code == 0:
        status, why = "failed", why or "exited 0 but wrote no new record"
    else:
        status = "failed"
        why = why or (f"was killed by {_signal_name(-code)}" if code is not None and code < 0
                      else f"exited with code {code}")
    error = err or why
    summary = error if status == "failed" else (f"{why}; {err}" if err else why)
    note(status, code, summary)
    where = job.describe()
    tail = "".join(follow.tail)
    exc = RunFailed(f"{where + ' ' if where else ''}(run {cfg.run_key()}, {cfg.nnodes} nodes x {cfg.nproc_per_node}) "
                    f"{why}{'; first error: ' + err if err and err != why else ''}; log: {', '.join(follow.paths)}"
                    f"\n--- last lines ---\n{tail}",
                    returncode=None if timed_out else code, log_tail=tail, run_dir=cfg.run_dir(),
                    status=status, error=summary)
    exc.job_id = getattr(job, "job_id", None)
    raise exc


def _fresh(rec, before) -> bool:
    return rec is not None and (before is None or rec.get("run_id") != before.get("run_id"))


def _append_log(paths: list[str], text: str, every: bool = False) -> None:
    for path in paths if every else paths[:1]:
        with open(path, "a") as f:
            f.write(text)


# -- ending process trees --------------------------------------------------------------------------
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


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def end_process_tree(proc, grace_s: float = 10.0) -> None:
    """SIGTERM ``proc`` (a Popen leading its own process group) and every descendant - torchrun starts
    its workers in sessions of their own - then SIGKILL what is left after ``grace_s``."""
    pids = set(descendants(proc.pid))
    for sig, grace in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if proc.poll() is None:
            pids |= set(descendants(proc.pid))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        end = time.monotonic() + grace
        while time.monotonic() < end:
            if proc.poll() is not None and not any(alive(p) for p in pids):
                return
            time.sleep(0.05)
