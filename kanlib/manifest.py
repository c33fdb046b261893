"""The runner's bookkeeping around a run: the study's append-only logs, the run-folder lock, attempts set aside.

- ``<study>/manifest.jsonl`` (one :class:`ManifestRow` per attempt), ``launches.jsonl`` (:class:`LaunchRow`),
  ``sweeps.jsonl`` (:class:`SweepRow`) and a worker group's ``events.jsonl``: appended one whole line per
  ``O_APPEND`` write, read back skipping a line a crash cut short (docs/faults.md, "The manifest"). The rows'
  fields are documented in docs/schema.md (kanlib.schema).
- :class:`RunLock`: ``<run_dir>/.lock``, held by the one process that runs the folder's run now.
- ``<run_dir>/attempts/``: a disturbed run's complete attempt kept while the sweep runs it again
  (:func:`set_aside`, :func:`restore_set_aside`, :func:`earlier_attempts`; which runs are rerun is
  kanlib.disturbance's rule).

A run's own files (``record.json``, ``steps.csv``) and their dataclasses are kanlib.records'. No torch.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field

from kanlib.disturbance import disturbance
from kanlib.records import (MANIFEST_NAME, RECORD_NAME, STEPS_NAME, RecordError, field_doc, fsync_dir, json_default,
                            new_run_id, now_iso, read_record, write_synced)


# -- the study's logs: manifest, launches, sweeps, worker-group events ---------------------------------------------
@dataclass
class ManifestRow:
    """One attempt of one run, appended to ``<study>/manifest.jsonl`` by the runner."""

    run_key: str = field(metadata=field_doc("which run"))
    study: str = field(default="", metadata=field_doc("the run's study"))
    world_size: int = field(default=1, metadata=field_doc("processes in the run"))
    placement: str = field(default="1x1", metadata=field_doc("nodes x processes per node"))
    launcher: str = field(default="local", metadata=field_doc("`local`, `multinode` or `slurm`"))
    run_dir: str = field(default="", metadata=field_doc("the run's folder"))
    status: str = field(default="failed", metadata=field_doc(
        "`ok`, `failed`, `timeout` (the runner's deadline passed), `preempted` (SIGTERM or an interrupted runner: a "
        "checkpoint was saved, or the run had not begun) or `disturbed` (not an attempt: the ok attempt of the same "
        "`launch_id` was disturbed and is run again; its record is copied into `attempts/`; `error` says why)"))
    exit_code: int | None = field(default=None, metadata=field_doc(
        "the launcher's exit code; null for a timeout or a config refused before launch"))
    error: str = field(default="", metadata=field_doc(
        "the root cause: the first error line of the failing rank, a signal that killed a process, or the deadline"))
    attempt_at: str = field(default="", metadata=field_doc("when the attempt started (UTC, ISO 8601)"))
    duration_s: float = field(default=0.0, metadata=field_doc("how long the attempt took (s)"))
    pid: int = field(default=0, metadata=field_doc("process id of the runner that made the attempt"))
    launch_id: str = field(default="", metadata=field_doc(
        "the launch (worker group) that ran the attempt; empty when it was refused before any launch"))


@dataclass
class LaunchRow:
    """One launch of a worker group (one torchrun, N joined torchruns, or one srun step running a plan of
    runs; kanlib.worker), appended to ``<study>/launches.jsonl`` by the runner when the launch ends."""

    launch_id: str = field(metadata=field_doc(
        "which launch; the folder `<study>/launches/<launch_id>/` holds its plan, events and logs"))
    study: str = field(default="", metadata=field_doc("the study of its runs"))
    placement: str = field(default="1x1", metadata=field_doc("nodes x processes per node"))
    launcher: str = field(default="local", metadata=field_doc("`local`, `multinode` or `slurm`"))
    n_planned: int = field(default=0, metadata=field_doc("runs handed to the launch"))
    n_began: int = field(default=0, metadata=field_doc("runs it began"))
    n_ok: int = field(default=0, metadata=field_doc("runs it ended ok"))
    started_at: str = field(default="", metadata=field_doc("when it started (UTC, ISO 8601)"))
    duration_s: float = field(default=0.0, metadata=field_doc(
        "from its start to the end of its processes (s): start-up, every run, teardown"))
    exit_code: int | None = field(default=None, metadata=field_doc(
        "the launch's exit code; null when the runner ended it (deadline, interruption)"))
    logs: list = field(default_factory=list, metadata=field_doc("its log files"))
    status: str = field(default="ok", metadata=field_doc("`ok` (the row is complete)"))
    n_parts: int = field(default=1, metadata=field_doc(
        "parts of its plan it was handed: a group kept open across a sweep's rounds gets one per round it served"))
    waiting_s: float = field(default=0.0, metadata=field_doc(
        "of `duration_s`, the time it waited between parts of its plan, holding no CPU, while other groups ran (s)"))


@dataclass
class SweepRow:
    """One sweep (runners.sweep.run_sweep) over a study folder, appended to ``<study>/sweeps.jsonl`` when it ends:
    how long it took and how many launches it made, against which the records' measured steps are weighed."""

    study: str = field(metadata=field_doc("the study of its runs"))
    started_at: str = field(default="", metadata=field_doc("when it started (UTC, ISO 8601)"))
    duration_s: float = field(default=0.0, metadata=field_doc(
        "from its start to its end (s): every launch, its waits, the reruns"))
    n_runs: int = field(default=0, metadata=field_doc("runs it was given (after removing duplicates)"))
    n_ok: int = field(default=0, metadata=field_doc("runs that have an ok record at its end"))
    n_failed: int = field(default=0, metadata=field_doc("runs that failed"))
    n_skipped: int = field(default=0, metadata=field_doc("runs already done before it started"))
    n_launches: int = field(default=0, metadata=field_doc("worker-group launches it made"))
    n_rerun: int = field(default=0, metadata=field_doc("runs run again because their first attempt was disturbed"))
    launcher: str = field(default="local", metadata=field_doc("`local`, `multinode` or `slurm`"))


MANIFEST_STATUSES = ("ok", "failed", "timeout", "preempted", "disturbed")


def manifest_path(out_dir: str, study: str) -> str:
    """``out_dir/<study>/manifest.jsonl``."""
    return os.path.join(out_dir, study, MANIFEST_NAME)


def append_manifest(path: str, row: ManifestRow | dict) -> None:
    """Append ``row`` as one JSON line with a single ``O_APPEND`` write.

    Concurrent appenders do not interleave (one ``write`` of a line to a local file in append mode
    lands whole). When the file ends in a line cut short by a crash, a newline is written first so the
    new row starts on its own line (the cut line stays unreadable and is skipped when loading).
    """
    row = dataclasses.asdict(row) if dataclasses.is_dataclass(row) else dict(row)
    if row.get("status") not in MANIFEST_STATUSES:
        raise ValueError(f"status: unknown value {row.get('status')!r}; choose one of {', '.join(MANIFEST_STATUSES)}")
    append_jsonl(path, row)


def append_jsonl(path: str, row) -> None:
    """Append ``row`` (a dict or dataclass) to ``path`` as one JSON line, as :func:`append_manifest` does."""
    row = dataclasses.asdict(row) if dataclasses.is_dataclass(row) else dict(row)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    line = json.dumps(row, sort_keys=True, default=json_default) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    line = "\n" + line
        _write_all(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    n = os.write(fd, data)
    if n != len(data):  # a full disk: say so rather than leave half a line
        raise OSError(f"wrote {n} of {len(data)} bytes (disk full?)")


def read_events(path: str) -> list[dict]:
    """The events of a worker group (``events.jsonl``) in order."""
    return read_jsonl(path)


def append_event(path: str, event: dict) -> None:
    """Append one event of a worker group (``events.jsonl``, kanlib.worker): one ``O_APPEND`` write, synced."""
    append_jsonl(path, event)


def read_jsonl(path: str) -> list[dict]:
    """The complete JSON-object lines of ``path`` in order (events, launches; a missing file has none; a cut or
    garbled line is skipped)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return []
    out = []
    for line in raw.split(b"\n"):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def read_manifest_rows(path: str) -> tuple[list[dict], list[tuple]]:
    """Rows of a manifest in the order written, and the unreadable lines as ``(file, line, reason)``."""
    rows, bad = [], []
    if os.path.exists(path):
        with open(path, "rb") as f:
            for i, raw in enumerate(f.read().split(b"\n"), start=1):
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                    if not isinstance(obj, dict) or "run_key" not in obj or "status" not in obj:
                        raise ValueError("not a manifest row (no run_key or status)")
                except ValueError as e:
                    bad.append((path, i, getattr(e, "msg", None) or str(e)))
                    continue
                rows.append(obj)
    return rows, bad


def row_of_record(rows: list[dict], rec: dict) -> dict | None:
    """The manifest row of the attempt whose record is ``rec`` (the run's ``record.json``), among ``rows`` in the
    order written: the last ``ok`` row of its ``run_key`` and ``launch_id`` (docs/faults.md, "The manifest"). The
    run's other ok rows are attempts set aside (a ``disturbed`` row of the same launch follows) or replaced."""
    mine = [r for r in rows if r.get("run_key") == rec.get("run_key") and r.get("status") == "ok"
            and r.get("launch_id", "") == rec.get("launch_id", "")]
    return mine[-1] if mine else None



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
        """Take the lock; while another process holds it, wait (saying once who holds it, on ``echo`` or else
        stderr, so a sweep that streams nothing still says why it waits) or return False.

        A failure after the lock was taken (writing who holds it on a full disk) releases it again before
        raising: a process never keeps a lock it does not know it has."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        said = False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not wait:
                        os.close(fd)
                        return False
                    if not said:
                        (echo or sys.stderr).write(f"kanlib: {os.path.dirname(self.path)} is being run by "
                                                   f"{self.holder()}; waiting\n")
                        said = True
                    time.sleep(poll_s)
            os.ftruncate(fd, 0)
            data = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": now_iso()}).encode()
            if os.pwrite(fd, data, 0) != len(data):
                raise OSError(f"{self.path}: short write (disk full?)")
        except BaseException:
            os.close(fd)  # closing the descriptor drops the flock
            raise
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



# -- attempts set aside for a rerun ------------------------------------------------------------------------------------
ATTEMPTS_DIR = "attempts"
RERUN_MARK = "rerun-pending"
"""``<run_dir>/attempts/rerun-pending``: the run id of the record :func:`set_aside` copied for a rerun that has not
ended yet (no ``.json``: it is not an attempt)."""



def set_aside(run_dir: str) -> str | None:
    """Copy a complete attempt's record (and its per-step rows) into ``<run_dir>/attempts/`` before the run runs
    again, and mark the rerun pending (:data:`RERUN_MARK`); returns the copy's path, or None when there is no valid
    record. The record stays the run's ``record.json`` until the rerun writes a new one (the rerun removes it when
    it starts); :func:`restore_set_aside` puts it back when the rerun ends without one. Call under the run's lock."""
    path = os.path.join(run_dir, RECORD_NAME)
    try:
        rec = read_record(path)
    except RecordError:
        return None
    keep = os.path.join(run_dir, ATTEMPTS_DIR)
    os.makedirs(keep, exist_ok=True)
    rid = rec.get("run_id") or new_run_id()
    steps = os.path.join(run_dir, STEPS_NAME)
    if os.path.exists(steps):
        _copy_synced(steps, os.path.join(keep, f"{rid}.steps.csv"))
    dest = os.path.join(keep, f"{rid}.json")
    _copy_synced(path, dest)
    write_synced(os.path.join(keep, RERUN_MARK), rid)  # last: a mark names only a complete copy
    return dest


def restore_set_aside(run_dir: str) -> dict | None:
    """End a rerun :func:`set_aside` marked pending: when the run has no valid ``record.json`` (the rerun failed,
    was interrupted, or its sweep was killed), move the set-aside record and rows back, so the earlier complete
    attempt is the run's record again; returns that record, or None when the rerun's own record stands (or nothing
    was pending). Call under the run's lock: a rerun in flight has no record yet."""
    keep = os.path.join(run_dir, ATTEMPTS_DIR)
    mark = os.path.join(keep, RERUN_MARK)
    try:
        with open(mark) as f:
            rid = f.read().strip()
    except FileNotFoundError:
        return None
    path = os.path.join(run_dir, RECORD_NAME)
    try:
        read_record(path)
        back = None  # the rerun completed: its record names the copy in earlier_attempts
    except RecordError:
        steps = os.path.join(keep, f"{rid}.steps.csv")
        if os.path.exists(steps):
            os.replace(steps, os.path.join(run_dir, STEPS_NAME))
        os.replace(os.path.join(keep, f"{rid}.json"), path)  # last: the record marks the run complete
        fsync_dir(run_dir)
        back = read_record(path)
    os.remove(mark)
    return back


def _copy_synced(src: str, dest: str) -> None:
    """Copy ``src`` to ``dest`` through a temporary file, synced and renamed (never half a copy)."""
    with open(src, "rb") as f:
        write_synced(dest, f.read())


def earlier_attempts(run_dir: str) -> list | None:
    """Summaries of the attempts :func:`set_aside` kept for this run (oldest first), or None when there are none."""
    keep = os.path.join(run_dir, ATTEMPTS_DIR)
    if not os.path.isdir(keep):
        return None
    out = []
    for name in sorted(os.listdir(keep)):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(keep, name)) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        out.append({"run_id": rec.get("run_id"), "step_time_s": rec.get("step_time_s"),
                    "foreign_cpu_frac": rec.get("foreign_cpu_frac"),
                    "runqueue_wait_frac": rec.get("runqueue_wait_frac"),
                    "foreign_wait_frac": rec.get("foreign_wait_frac"), "disturbed": disturbance(rec)})
    return out or None

