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
- exactly one manifest row per attempt (kanlib.manifest.ManifestRow).
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import sys
import time
from dataclasses import dataclass

from kanlib import manifest, records

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

    def attempt_text(self, until: str | None = None, index: int | None = None) -> str:
        """Everything the logs gained during this attempt (for the root-cause search); with ``until``,
        each log's text up to that line only; with ``index``, that log's alone."""
        parts = []
        pairs = list(zip(self.paths, self.start))
        for path, start in pairs if index is None else pairs[index:index + 1]:
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


# Errors a rank raises because another rank went away first: never the root cause when a rank has raised something
# else (torchrun names the rank that exited first, which is often the peer that noticed, not the one that failed).
_CONSEQUENCE = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|pair closure|"
                          r"remote process exited|communicator was aborted|Socket Timeout|NCCL.*(?:abort|Abort)|"
                          r"DistNetworkError|DistBackendError", re.IGNORECASE)


def error_line(log: str) -> str:
    """The most telling error of a run's log: the last ``SomeError: ...`` line of the rank torchrun names
    as the root cause (unless that error only says a peer went away and another rank raised something else),
    else that rank's exit code or fatal signal, else the first error line, else ''."""
    lines: list[tuple[str | None, str]] = []
    for line in log.splitlines():
        m = _ERROR_LINE.match(line.strip())
        if m and not any(s in m.group(2) for s in _IGNORED):
            lines.append((m.group(1), m.group(2)))
    primary = [text for _, text in lines if not _CONSEQUENCE.search(text)]
    root = _ROOT_CAUSE.search(log)
    if root:
        mine = [text for rank, text in lines if rank == root.group(1)]
        if mine and (not _CONSEQUENCE.search(mine[-1]) or not primary):
            return mine[-1][:500]
        if primary:
            return primary[0][:500]
        code = int(root.group(2))
        if code < 0:
            return f"rank {root.group(1)} was killed by {_signal_name(-code)}"
        if not lines:
            return f"rank {root.group(1)} exited with code {code}"
    if primary:
        return primary[0][:500]
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


@dataclass
class Outcome:
    """How one run of a launch ended: ``status`` ok, failed, timeout or preempted, its fresh ``record`` (ok),
    the root-cause ``error``, the launch's ``exit_code`` and the run's log ``tail``."""

    cfg: object
    status: str
    record: dict | None = None
    error: str = ""
    exit_code: int | None = None
    tail: str = ""
    message: str = ""

    def failure(self) -> RunFailed:
        """This outcome as the exception :func:`supervise` raises."""
        exc = RunFailed(self.message or self.error, returncode=self.exit_code, log_tail=self.tail,
                        run_dir=self.cfg.run_dir(), status=self.status, error=self.error)
        exc.job_id = getattr(self, "job_id", None)
        return exc


def supervise(cfg, job: Job, *, timeout_s: float | None = None, echo=None, retries: int = 0,
              kill_grace_s: float = 20.0, lock_wait: bool = True, launch_id: str = "") -> dict:
    """Run ``job`` (a launch of the one run ``cfg``) to its end and return its fresh record, or raise
    :class:`RunFailed`.

    Takes the run folder's lock first (waiting, and saying who holds it, while another process does); when
    the run was completed by that other process meanwhile, returns its record without running it again.
    Appends one manifest row per attempt. ``retries``: relaunch at once when ``job.retry`` says so (same row).
    """
    lock = manifest.RunLock(cfg.run_dir())
    before = read_record(cfg)
    if not lock.acquire(wait=lock_wait, echo=echo or None):
        raise RunFailed(f"run {cfg.run_key()} is being run by {lock.holder()}", run_dir=cfg.run_dir(),
                        error=f"held by {lock.holder()}")
    try:
        now = read_record(cfg)
        if now is not None and (before is None or now.get("run_id") != before.get("run_id")):
            return now  # completed by the process we waited for: each run executes once
        [out] = Launch([cfg], job, timeout_s=timeout_s, echo=echo, kill_grace_s=kill_grace_s,
                       launch_id=launch_id).watch(retries)
        if out.status != "ok":
            raise out.failure()
        return out.record
    finally:
        lock.release()


class Launch:
    """One launch (worker group) running ``configs`` in order, watched to its end: the events the group's rank 0
    appends (kanlib.worker: which run began and ended), the logs, each run's deadline, and the outcome of every
    run that began. Runs it never began are left out of :meth:`watch`'s result (the caller relaunches them).

    ``job``'s ``events_path()`` (optional) is the group's events file; a job without one runs its configs with
    no events (one run: :func:`supervise`). The first run's deadline counts from the launch's start (start-up
    included), every later run's from its ``begin`` event. Every ended run gets one manifest row, its slice of
    the launch log in its own folder, and ``on_end(cfg)`` (the caller releases its lock)."""

    def __init__(self, configs: list, job: Job, *, timeout_s: float | None = None, echo=None,
                 kill_grace_s: float = 20.0, on_end=None, launch_id: str = "", plan_path: str | None = None,
                 keep_open: bool = False):
        self.configs, self.job, self.timeout_s = list(configs), job, timeout_s
        # keep_open: the group's plan is open (kanlib.worker.write_plan); when every run of it has ended ok, watch()
        # returns with the processes waiting, and extend() hands them the next runs; close() lets them leave
        self.plan_path, self.keep_open, self.idle, self.chunk = plan_path, keep_open, False, 0
        self.done_chunks: list[tuple[int, int, int]] = []  # (planned, began, ok) of the parts before this one
        self.waiting_s = self.idle_since = 0.0
        self.echo = sys.stdout if echo is None else echo
        self.kill_grace_s, self.on_end, self.launch_id = kill_grace_s, on_end, launch_id
        self.by_key = {c.run_key(): c for c in self.configs}
        self.before = {k: read_record(c) for k, c in self.by_key.items()}
        self.began: dict[str, float] = {}  # run key -> monotonic time its begin event was seen
        self.ended: dict[str, Outcome] = {}
        self.n_events = 0
        self.timed_out: str | None = None  # the run in flight when the deadline passed
        self.interrupted: BaseException | None = None
        self.started = self.started_wall = 0.0
        self.follow: LogFollower | None = None

    # -- the run in flight ------------------------------------------------------------------------------
    def in_flight(self):
        """The run that began and has not ended, else the first that has not ended (it is starting)."""
        for key in reversed(list(self.began)):
            if key not in self.ended:
                return self.by_key[key]
        return next((c for c in self.configs if c.run_key() not in self.ended), None)

    def _deadline_passed(self) -> bool:
        cfg = self.in_flight()
        if self.timeout_s is None or cfg is None:
            return False
        since = self.began.get(cfg.run_key(), self.started)
        return time.monotonic() - since > self.timeout_s

    def _events(self) -> None:
        path = getattr(self.job, "events_path", lambda: None)()
        if not path:
            return
        evs = manifest.read_events(path)
        for e in evs[self.n_events:]:
            key = e.get("run_key")
            if key not in self.by_key:
                continue
            if e.get("event") == "begin":
                self.began[key] = time.monotonic()
            elif e.get("event") == "end" and key not in self.ended:
                status = e.get("status", "ok")
                if key == self.timed_out and status != "ok":
                    status = "timeout"  # it stopped because the runner ended it at its deadline
                error = ""
                if status == "preempted" and self.interrupted is not None:
                    error = (f"the runner was interrupted ({type(self.interrupted).__name__}); the run checkpointed "
                             f"and stopped")
                self._end(self.by_key[key], 0 if status == "ok" else None, status, error=error)
        self.n_events = len(evs)

    # -- watching ---------------------------------------------------------------------------------------
    def watch(self, retries: int = 0) -> list[Outcome]:
        """Start the job and follow it to its end (an open plan: until every run of it ended ok, the processes
        then waiting for :meth:`extend`); the outcomes of the runs that began, in order. ``retries``: relaunch at
        once when nothing began and ``job.retry`` says so (a port taken meanwhile)."""
        self._clear_markers()
        self.started, self.started_wall = time.monotonic(), time.time()
        self.launch_started = self.started
        self.last_end = self.started
        return self._follow_to_end(retries, start=True)

    def extend(self, configs: list) -> list[Outcome]:
        """Hand the waiting group (``keep_open``, after :meth:`watch` or :meth:`extend` returned) the next runs and
        follow them as :meth:`watch` does; the outcomes of the runs that began."""
        from kanlib.worker import write_chunk

        if not self.alive():
            raise RuntimeError(f"launch {self.launch_id} is not waiting for runs")
        self.follow.pump(final=True)
        self.done_chunks.append((len(self.configs), len(self.began),
                                 sum(o.status == "ok" for o in self.ended.values())))
        self.configs = list(configs)
        self.by_key = {c.run_key(): c for c in self.configs}
        self.before = {k: read_record(c) for k, c in self.by_key.items()}
        self.waiting_s += time.monotonic() - self.idle_since
        self.began, self.ended, self.timed_out, self.idle = {}, {}, None, False
        self.chunk += 1
        self.follow.start = list(self.follow.offsets)  # this part's text starts here
        self._clear_markers()
        self.started = self.last_end = time.monotonic()  # the first run's deadline counts from now
        write_chunk(self.plan_path, self.chunk, self.launch_id, self.configs)
        return self._follow_to_end(0, start=False)

    def alive(self) -> bool:
        """Whether the group is waiting for runs (an open plan whose runs all ended ok, processes still there)."""
        return self.idle and self.job.poll() is None

    def close(self, wait_s: float = 60.0) -> None:
        """Tell a waiting group its plan is complete and wait for it to leave (ended after ``wait_s``); writes the
        launch's line. Nothing when the group is not waiting."""
        from kanlib.worker import close_plan

        if not self.idle:
            return
        self.idle = False
        self.waiting_s += time.monotonic() - self.idle_since
        code = self.job.poll()
        if code is None:
            close_plan(self.plan_path)
            until = time.monotonic() + wait_s
            while (code := self.job.poll()) is None and time.monotonic() < until:
                time.sleep(POLL_S)
            if code is None:
                self.job.cancel(self.kill_grace_s)
                code = self.job.poll()
        self.follow.pump(final=True)
        self._log_launch(code)

    def _clear_markers(self) -> None:
        for cfg in self.configs:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(cfg.run_dir(), records.PREEMPTED_NAME))

    def _follow_to_end(self, retries: int, start: bool) -> list[Outcome]:
        try:
            for attempt in range(retries + 1):
                code, timed_out = self._run_job(start)
                if attempt < retries and not timed_out and not self.idle and self._may_retry():
                    _append_log(self.follow.paths, "kanlib: a port was taken (address already in use); relaunching\n")
                    continue
                break
        except RunFailed:
            self._log_launch(None)
            raise
        except BaseException as e:  # Ctrl-C, SIGTERM to the sweep, or a bug: never leave the run behind
            self.interrupted, self.idle = e, False
            self.job.cancel(self.kill_grace_s)
            self._settle(None, interrupted=e)
            self._log_launch(None)
            raise
        if not self.idle:
            self._settle(code, timed_out=timed_out)
            self._log_launch(code)
        return [self.ended[c.run_key()] for c in self.configs if c.run_key() in self.ended]

    def _chunk_done(self) -> bool:
        """Every run of the open plan's current part ended ok: the group now waits for the next part."""
        return (self.keep_open and len(self.ended) == len(self.configs)
                and all(o.status == "ok" for o in self.ended.values()))

    def _run_job(self, start: bool = True) -> tuple[int | None, bool]:
        """Start the job (``start``), follow logs and events until it ends, the run in flight passes its
        deadline, or (an open plan) every run of its current part ended ok (``self.idle``)."""
        if start:
            self._start_job()
        while True:
            self.follow.pump()
            self._events()
            code = self.job.poll()
            if code is not None:
                return code, False
            if self._chunk_done():
                self.idle, self.idle_since = True, time.monotonic()
                return None, False
            if self._deadline_passed():
                self.timed_out = self.in_flight().run_key()
                _append_log(self.follow.paths, f"{DEADLINE_MARK} of {self.timeout_s} s passed; ending the run\n",
                            every=True)
                self.job.cancel(self.kill_grace_s)
                return None, True  # no exit code of its own: the runner ended it
            time.sleep(POLL_S)

    def _start_job(self) -> None:
        logs = self.job.log_paths()
        self.follow = LogFollower(logs, self.echo, [self.job.log_prefix(i) for i in range(len(logs))])
        try:
            self.job.start()
        except RunFailed as e:  # refused before anything ran (e.g. sbatch said no)
            self._end(self.configs[0], e.returncode, "failed", error=e.error or str(e).splitlines()[0])
            raise
        if self.job.log_paths() != logs:  # some launchers know their logs only once started (SLURM)
            logs = self.job.log_paths()
            self.follow.set_paths(logs, [self.job.log_prefix(i) for i in range(len(logs))])

    def _may_retry(self) -> bool:
        first = self.configs[0]
        if self.began or self.ended or self._fresh(first, read_record(first)):
            return False
        if os.path.exists(os.path.join(first.run_dir(), records.PREEMPTED_NAME)):
            return False
        self.follow.pump(final=True)
        return self.job.retry(self.follow.attempt_text())

    def _settle(self, code, timed_out: bool = False, interrupted: BaseException | None = None) -> None:
        """The job has ended (or was ended): give the run in flight its outcome."""
        self.follow.pump(final=True)
        self._events()
        cfg = self.in_flight()
        if cfg is None:
            return
        began = cfg.run_key() in self.began
        if not began and interrupted is None and (self.ended or self.chunk):
            return  # the launch ended between two runs: the rest go to a fresh launch
        rec, marker = read_record(cfg), os.path.exists(os.path.join(cfg.run_dir(), records.PREEMPTED_NAME))
        if interrupted is not None:
            if self._fresh(cfg, rec):
                self._end(cfg, 0, "ok")
            elif marker:
                self._end(cfg, None, "preempted", error=f"the runner was interrupted ({type(interrupted).__name__}); "
                                                         f"the run checkpointed and stopped")
            elif not began and self._has_events():  # interrupted during the launch's start-up: nothing of it ran
                self._end(cfg, None, "preempted", error=f"the runner was interrupted ({type(interrupted).__name__}) "
                                                         f"before the run began")
            else:
                self._end(cfg, None, "failed", error=f"the runner was interrupted ({type(interrupted).__name__}: "
                                                      f"{interrupted}); the run stopped without a checkpoint")
            return
        if not timed_out and self._fresh(cfg, rec):
            self._end(cfg, code, "ok")
            return
        self._end(cfg, code, self._verdict(cfg, code, timed_out, marker))

    def _has_events(self) -> bool:
        """Whether the launch says when each run begins (a worker group's events); without, a run's start is unknown."""
        return bool(getattr(self.job, "events_path", lambda: None)())

    def _verdict(self, cfg, code, timed_out: bool, marker: bool) -> str:
        status, _ = self.job.outcome(code)
        if timed_out:
            return "timeout"
        if status == "timeout":
            return "timeout"
        if marker or status == "preempted":
            return "preempted"
        return "failed"

    def _fresh(self, cfg, rec) -> bool:
        before = self.before.get(cfg.run_key())
        return rec is not None and (before is None or rec.get("run_id") != before.get("run_id"))

    # -- one run's end ----------------------------------------------------------------------------------
    def _end(self, cfg, code, status: str, error: str = "") -> None:
        """Record the outcome of ``cfg``: manifest row, its log slice, ``on_end``."""
        key = cfg.run_key()
        rec = read_record(cfg)
        text = self._run_text(cfg)
        if status == "ok" and not self._fresh(cfg, rec):
            status = "failed"
            error = error or ("exited 0 but wrote no new record" if code == 0 else "ended without a new record")
        out = Outcome(cfg, status, rec if status == "ok" else None, exit_code=code)
        if status != "ok":
            out.error, out.message = self._explain(cfg, code, status, error, text)
        out.tail = "".join(text.splitlines(keepends=True)[-LOG_TAIL_LINES:])
        out.job_id = getattr(self.job, "job_id", None)
        self.ended[key] = out
        since = self.began.get(key, self.last_end)
        self.last_end = time.monotonic()
        manifest.append_manifest(manifest.manifest_path(cfg.out_dir, cfg.study), manifest.ManifestRow(
            run_key=key, study=cfg.study, world_size=cfg.world_size, placement=cfg.placement,
            launcher=self.job.launcher, run_dir=cfg.run_dir(), status=status,
            exit_code=0 if status == "ok" else (None if status == "timeout" else code), error=out.error if status != "ok" else "", attempt_at=records.now_iso(),
            duration_s=round(time.monotonic() - since, 3), pid=os.getpid(), launch_id=self.launch_id))
        self._copy_log(cfg, text)
        if self.on_end is not None:
            self.on_end(cfg)

    def _explain(self, cfg, code, status: str, error: str, text: str) -> tuple[str, str]:
        """(root cause for the manifest, message for RunFailed) of a run that did not end ok."""
        _, why = self.job.outcome(code)
        if status == "timeout":
            text = text.split(DEADLINE_MARK, 1)[0]  # what the ranks print while being ended is a consequence
            why = why if why and "time limit" in why else f"passed its deadline of {self.timeout_s} s"
        elif status == "preempted":
            why = why or f"was preempted (SIGTERM; checkpoint saved, exit code {code})"
        elif code == 0:
            why = why or "exited 0 but wrote no new record"
        else:
            why = why or (f"was killed by {_signal_name(-code)}" if code is not None and code < 0
                          else f"exited with code {code}")
        err = error_line(text)
        if error:
            return error, error
        summary = (err or why) if status == "failed" else (f"{why}; {err}" if err else why)
        where = self.job.describe()
        tail = "".join(text.splitlines(keepends=True)[-LOG_TAIL_LINES:])
        msg = (f"{where + ' ' if where else ''}(run {cfg.run_key()}, {cfg.nnodes} nodes x {cfg.nproc_per_node}) "
               f"{why}{'; first error: ' + err if err and err != why else ''}; log: {', '.join(self.follow.paths)}"
               f"\n--- last lines ---\n{tail}")
        return summary, msg

    def _run_texts(self, cfg) -> list[tuple[str, str]]:
        """``(log path, this run's part of it)`` for every log of the launch: from the run's begin line (the
        launch's first run: from the log's start) through its end line, or to the end of the log."""
        first = cfg is self.configs[0] and self.chunk == 0
        return [(path, slice_run(self.follow.attempt_text(index=i), cfg.run_key(), first))
                for i, path in enumerate(self.follow.paths)]

    def _run_text(self, cfg) -> str:
        """This run's part of all the launch's logs (for the root cause and the tail)."""
        return "\n".join(text for _, text in self._run_texts(cfg) if text)

    def _copy_log(self, cfg, text: str) -> None:
        """Append the run's part of each launch log to the log of the same name in its own folder (unless the
        job logs into that folder itself)."""
        run_dir = os.path.abspath(cfg.run_dir())
        if any(os.path.dirname(os.path.abspath(p)) == run_dir for p in self.follow.paths):
            return
        os.makedirs(run_dir, exist_ok=True)
        for path, part in self._run_texts(cfg):
            if not part:
                continue
            with open(os.path.join(run_dir, os.path.basename(path)), "a") as f:
                f.write(f"# launch {self.launch_id}: {path}\n")
                f.write(part if part.endswith("\n") else part + "\n")

    def _log_launch(self, code) -> None:
        """One line per launch in ``<study>/launches.jsonl`` (kanlib.manifest.LaunchRow)."""
        if not self.launch_id:
            return
        cfg = self.configs[0]
        path = os.path.join(cfg.out_dir, cfg.study, records.LAUNCHES_NAME)
        parts = self.done_chunks + [(len(self.configs), len(self.began),
                                     sum(o.status == "ok" for o in self.ended.values()))]
        manifest.append_jsonl(path, manifest.LaunchRow(
            launch_id=self.launch_id, study=cfg.study, placement=cfg.placement, launcher=self.job.launcher,
            n_planned=sum(p[0] for p in parts), n_began=sum(p[1] for p in parts), n_ok=sum(p[2] for p in parts),
            started_at=records.iso(self.started_wall),
            duration_s=round(time.monotonic() - getattr(self, "launch_started", self.started), 3),
            n_parts=self.chunk + 1, waiting_s=round(self.waiting_s, 3),
            exit_code=code, logs=list(self.follow.paths) if self.follow else []))


def slice_run(text: str, key: str, first: bool) -> str:
    """The part of a launch log that belongs to run ``key``: from its begin line (or the log's start, for the
    launch's first run) through its end line (or the log's end)."""
    from kanlib.worker import BEGIN_MARK, END_MARK

    begin, end = BEGIN_MARK.format(key=key), END_MARK.format(key=key)
    i = text.rfind(begin)
    if i < 0:
        return text if first else ""
    start = 0 if first else text.rfind("\n", 0, i) + 1
    j = text.find(end, i)
    stop = len(text) if j < 0 else text.find("\n", j) + 1 or len(text)
    return text[start:stop]


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
