"""Run a list of configs with as few launches as faults allow, with progress, and collect their records.

A sweep orders its runs by **rounds**: repeat ``r`` of every point runs before repeat ``r + 1`` of any, so slow
drift and background load fall on every point alike. Within a round, the runs that can share processes
(:func:`kanlib.config.group_key`: one placement, backend, device, threads, ...) go to **one worker group**
(runners/group.py, kanlib.worker): one launch runs them one after another. A run that fails ends its launch
and a fresh one carries on with the next.

A sweep is resumable: a run whose ``record.json`` is a valid ``ok`` record is skipped (it is not run again
and gets no new manifest row); any other run is launched, and resumes from its last committed checkpoint
when it has one. A failing run is recorded in the study's manifest and the sweep carries on; the failures are
reported at the end. Killing the sweep and starting it again completes only what is missing (a run in flight
when the sweep dies gets SIGTERM and checkpoints). Two sweeps over the same folder never run one run twice:
a sweep locks each run it is about to launch (kanlib.manifest.RunLock); a run another process holds is
left to the end, then waited for (saying who holds it) and skipped if that process completed it.

On SLURM (``launcher="slurm"``): inside an allocation (``salloc``, a batch script) each worker group is a
job step; outside one, the whole sweep is submitted as one batch job whose steps are the worker groups
(:func:`run_sweep_in_allocation`), unless ``launcher_opts["mode"] == "per_run"`` (one batch
job per run).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field

from kanlib import disturbance, manifest, records
from kanlib.config import ConfigError, group_key
from kanlib.manifest import RunLock
from runners.command import check_environment, check_timeout
from runners.group import groups_of, launch_dir, run_group
from runners.launch import effective_launcher, make_job, read_record, refused

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
    launches: int = 0  # worker-group launches the sweep made
    rerun: int = 0  # runs run again because their first attempt was disturbed
    disturbed: int = 0  # records that still say the machine was busy (kept, flagged)
    rerun_failures: list[tuple[object, str]] = field(default_factory=list)  # reruns that ended without a record:
    # (config, "<status>: <error>"); the run's earlier, disturbed record is its record again (in ``records``)

    @property
    def ok(self) -> bool:
        return not self.failures


class SweepInterrupted(KeyboardInterrupt):
    """The sweep process got SIGTERM; the run in flight was stopped (checkpointed) and recorded as preempted."""


class SweepStopped(RuntimeError):
    """The sweep could not go on (an ``OSError``: a full disk, a folder that went away); the message says what
    failed and how many runs were done. Its ``sweeps.jsonl`` row was written where the disk allowed."""


def run_sweep(configs: list, *, launcher: str = "local", launcher_opts: dict | None = None,
              timeout_s: float | None = None, skip_done: bool = True, progress: bool = True,
              stream_output: bool = False, max_restarts: int = 0, rerun_disturbed: bool = True,
              keep_groups: bool | None = None) -> SweepResult:
    """Run each config (skipping those with an ok record already, when ``skip_done``), round by round in worker
    groups, carry on past failures, and report them at the end. ``stream_output`` echoes the runs' output to
    stdout. ``timeout_s`` is each run's deadline (a launch's first run counts its start-up); ``max_restarts`` is
    passed to torchrun. ``rerun_disturbed``: a run whose record (this sweep's, or one an earlier sweep left) says its
    machine was busy during its measured steps and is a first attempt (:func:`kanlib.disturbance.needs_rerun`) is run
    once more at the end of its round; its first record is copied into ``<run_dir>/attempts/`` and named by the new
    one (``earlier_attempts``), and stays the run's record when the rerun ends without one. An ``OSError`` (a full
    disk) stops the sweep with :class:`SweepStopped`, its ``sweeps.jsonl`` row written where possible. SIGTERM to
    the sweep (or Ctrl-C)
    stops the run in flight gracefully (it checkpoints and is recorded as preempted) and raises
    :class:`SweepInterrupted` (KeyboardInterrupt for Ctrl-C). ``keep_groups``: a placement's worker group waits
    (holding no CPU) while the other placements run their part of a round and runs its part of every round, so a
    sweep makes one launch per placement, not one per placement and round (default: on for the local and
    multinode launchers; off on SLURM, where a waiting job step would hold the allocation's nodes)."""
    from tqdm.auto import tqdm

    check_timeout(timeout_s)
    opts = dict(launcher_opts or {})
    if launcher == "slurm" and opts.get("mode", "allocation") == "allocation":
        from runners.slurm import inside_allocation

        if not inside_allocation():
            return run_sweep_in_allocation(configs, launcher_opts=opts, timeout_s=timeout_s, skip_done=skip_done,
                                           max_restarts=max_restarts, stream_output=stream_output,
                                           rerun_disturbed=rerun_disturbed)
    t0, started_at = time.monotonic(), records.now_iso()
    if keep_groups is None:
        keep_groups = launcher in ("local", "multinode")
    sweep = _Sweep(launcher, opts, timeout_s, None if stream_output else False, max_restarts, keep_groups)
    try:
        with _sigterm_interrupts(), sweep:
            every = _unique(configs)
            todo = sweep.skip_done(every) if skip_done else every
            sweep.bar = tqdm(total=len(configs), initial=len(configs) - len(todo), desc="sweep", unit="run",
                             disable=not progress, file=sys.stdout)
            launch = {c.run_key() for c in sweep.refuse(todo)}
            # every round holds the runs to launch and those already done: a disturbed record an earlier sweep left
            # is run again at the end of its round as the sweep's own are (docs/faults.md, "Disturbed runs")
            for _, round_cfgs in _rounds([c for c in every if c.run_key() in launch or c.run_key() in sweep.records]):
                for group in groups_of([c for c in round_cfgs if c.run_key() in launch]):
                    sweep.run(group)
                if rerun_disturbed:
                    sweep.rerun_disturbed(round_cfgs)
            for _ in range(3):  # a run judged after its holder let go may be held again by then
                if sweep.deferred:
                    sweep.run_deferred(rerun_disturbed)
            sweep.close_groups()
            sweep.bar.close()
    except OSError as e:  # a full disk, a folder that went away: stop with what was done, and say so
        if sweep.bar is not None:
            sweep.bar.close()
        result = sweep.result(configs)
        _log_sweep(configs, result, sweep, launcher, started_at, time.monotonic() - t0)
        raise SweepStopped(
            f"sweep stopped: {type(e).__name__}: {e}; {len(result.records)} of {len(_unique(configs))} runs have a "
            f"record, {len(result.failures)} failed, the others did not run. Nothing written before was lost: "
            f"fix the cause (free disk space) and run the sweep again; it runs only what is missing.") from None
    result = sweep.result(configs)
    _log_sweep(configs, result, sweep, launcher, started_at, time.monotonic() - t0)
    print(f"sweep: {len(result.records)} ok ({result.skipped} already done), {len(result.failures)} failed, "
          f"{sweep.launches} launches, {time.monotonic() - t0:.1f} s"
          + (f"; {result.rerun} disturbed run(s) run again, {result.disturbed} still disturbed"
             if result.rerun or result.disturbed else ""))
    for cfg, msg in result.failures:
        print(f"FAILED {cfg.run_key()}: {msg.splitlines()[0]}")
    for cfg, msg in result.rerun_failures:
        print(f"RERUN FAILED {cfg.run_key()}: {msg.splitlines()[0]}; its earlier (disturbed) record is kept")
    return result


class _Sweep:
    """The state of one sweep: the locks it holds, what ended, what another process holds."""

    def __init__(self, launcher: str, opts: dict, timeout_s, echo, max_restarts: int, keep_groups: bool = False):
        self.launcher, self.opts, self.timeout_s, self.echo = launcher, opts, timeout_s, echo
        self.keep_groups = keep_groups
        self.waiting: dict = {}  # group key -> its launch, waiting for its part of the next round
        self.max_restarts = max_restarts
        self.locks: dict[str, RunLock] = {}
        self.records: dict[str, dict] = {}
        self.failures: dict[str, str] = {}
        self.deferred: list = []
        self.skipped = 0
        self.launches = 0
        self.rerun: set[str] = set()  # run keys run again for a disturbed first attempt
        self.aside: set[str] = set()  # run keys whose rerun is in flight (their record copied aside, lock held)
        self.rerun_failures: dict[str, str] = {}  # run key -> why its rerun ended without a record
        self.bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.close_groups()
        finally:
            for key in list(self.aside):  # a rerun that never started (the sweep stopped first): its record stays
                self._settle_rerun(os.path.dirname(self.locks[key].path))
            self.aside.clear()
            for lock in self.locks.values():
                lock.release()
            self.locks.clear()

    def skip_done(self, configs: list) -> list:
        todo = []
        for cfg in configs:
            done = read_record(cfg) or self._put_back(cfg)
            if done is not None:
                self.records[cfg.run_key()] = done
                self.skipped += 1
            else:
                todo.append(cfg)
        return todo

    def refuse(self, configs: list) -> list:
        """The configs this machine can run; the others are failed attempts, refused before any launch."""
        ok = []
        for cfg in configs:
            launcher = effective_launcher(cfg, self.launcher)
            try:
                check_environment(cfg, launcher)
                ok.append(cfg)
            except ConfigError as e:
                refused(cfg, launcher, f"ConfigError: {e}")
                self.failures[cfg.run_key()] = f"failed: ConfigError: {e}"
                self._tick()
        return ok

    def _put_back(self, cfg) -> dict | None:
        """A run without a record whose rerun was left pending (its sweep was killed during it) gets its set-aside
        record back, unless another process holds the run (its rerun may be in flight); that record, or None."""
        if not os.path.exists(os.path.join(cfg.run_dir(), manifest.ATTEMPTS_DIR, manifest.RERUN_MARK)):
            return None
        lock = RunLock(cfg.run_dir())
        if not lock.acquire(wait=False):
            return None
        try:
            manifest.restore_set_aside(cfg.run_dir())
            return read_record(cfg)
        finally:
            lock.release()

    def run(self, group: list) -> None:
        """Lock what this sweep can run now (another process's runs are deferred) and run it in worker groups.
        A run this sweep already holds (a rerun :meth:`rerun_disturbed` decided under its lock) runs as it is."""
        mine = []
        for cfg in group:
            if cfg.run_key() in self.locks:
                mine.append(cfg)
                continue
            lock = RunLock(cfg.run_dir())
            if not lock.acquire(wait=False):
                self.deferred.append(cfg)
                continue
            # completed by another sweep between our look and our lock (or its rerun was killed with it: put back)
            done = read_record(cfg) or manifest.restore_set_aside(cfg.run_dir())
            if done is not None and cfg.run_key() not in self.failures:
                lock.release()
                self.records[cfg.run_key()] = done
                self._tick()
                continue
            self.locks[cfg.run_key()] = lock
            mine.append(cfg)
        if not mine:
            return
        launcher = effective_launcher(mine[0], self.launcher)

        def job(first, plan):
            self.launches += 1
            return make_job(first, launcher, self.opts, self.max_restarts, plan=plan)

        key = group_key(mine[0])
        outcomes, waiting = run_group(mine, job, timeout_s=self.timeout_s, echo=self.echo, on_end=self._ended,
                                      retries=3 if launcher == "local" else 0,
                                      keep_open=self.keep_groups and launcher != "slurm",
                                      reuse=self.waiting.pop(key, None))
        if waiting is not None:
            self.waiting[key] = waiting
        for out in outcomes:
            key = out.cfg.run_key()
            if out.status == "ok":
                self.records[key] = out.record
                self.failures.pop(key, None)
            elif key in self.rerun_failures:  # the rerun failed: the earlier record is the run's again (_ended)
                self.rerun_failures[key] = f"{out.status}: {out.error or out.message.splitlines()[0]}"
            else:
                self.failures[key] = f"{out.status}: {out.error or out.message.splitlines()[0]}"

    def rerun_disturbed(self, configs: list) -> None:
        """Run once more, at the end of their round, the runs of ``configs`` whose record needs it
        (:func:`kanlib.disturbance.needs_rerun`: disturbed, a first attempt), each at most once per sweep. The
        decision is taken under the run's lock on the record as it is on disk then (another sweep may have run it
        again meanwhile); a run another process holds is judged when it lets go (:meth:`run_deferred`). The record
        is copied into ``attempts/`` and stays the run's record until the rerun writes a new one."""
        again = []
        for cfg in configs:
            key = cfg.run_key()
            if key not in self.records or key in self.rerun or not disturbance.needs_rerun(self.records[key]):
                continue
            lock = RunLock(cfg.run_dir())
            if not lock.acquire(wait=False):
                self.deferred.append(cfg)
                continue
            rec = read_record(cfg)  # now, under the lock
            why = disturbance.needs_rerun(rec) if rec is not None else ""
            if not why:
                lock.release()
                if rec is not None:
                    self.records[key] = rec
                continue
            manifest.set_aside(cfg.run_dir())
            if not self._has_disturbed_row(cfg, rec):  # one disturbed row per attempt (a failed rerun restored it)
                manifest.append_manifest(manifest.manifest_path(cfg.out_dir, cfg.study), manifest.ManifestRow(
                    run_key=key, study=cfg.study, world_size=cfg.world_size, placement=cfg.placement,
                    launcher=rec.get("launcher", ""), run_dir=cfg.run_dir(), status="disturbed", error=why,
                    attempt_at=records.now_iso(), pid=os.getpid(), launch_id=rec.get("launch_id", "")))
            self.records[key] = rec
            self.locks[key] = lock
            self.aside.add(key)
            self.rerun.add(key)
            self.rerun_failures[key] = ""  # until the rerun says otherwise (run(): '' once it ended ok)
            again.append(cfg)
        if self.bar is not None and again:
            self.bar.total += len(again)
            self.bar.refresh()
        for group in groups_of(again):
            self.run(group)
        for cfg in again:
            if self.rerun_failures.get(cfg.run_key()) == "":
                del self.rerun_failures[cfg.run_key()]

    @staticmethod
    def _has_disturbed_row(cfg, rec: dict) -> bool:
        rows, _ = manifest.read_manifest_rows(manifest.manifest_path(cfg.out_dir, cfg.study))
        return any(r.get("run_key") == cfg.run_key() and r.get("status") == "disturbed"
                   and r.get("launch_id", "") == rec.get("launch_id", "") for r in rows)

    def _settle_rerun(self, run_dir: str) -> None:
        """The rerun of a set-aside record ended (or will not run): when it left no record, put the earlier back."""
        back = manifest.restore_set_aside(run_dir)
        if back is not None:
            self.records[back.get("run_key", "")] = back

    def close_groups(self) -> None:
        """Let every waiting worker group leave (the sweep is over, or interrupted)."""
        while self.waiting:
            _, launch = self.waiting.popitem()
            launch.close()

    def _ended(self, cfg) -> None:
        if cfg.run_key() in self.aside:  # under the lock still: a rerun that wrote no record gives the earlier back
            self.aside.discard(cfg.run_key())
            self._settle_rerun(cfg.run_dir())
        lock = self.locks.pop(cfg.run_key(), None)
        if lock is not None:
            lock.release()
        self._tick()

    def _tick(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def run_deferred(self, rerun_disturbed: bool = True) -> None:
        """Wait for the runs another process held (saying who), then run what it did not complete, and (with
        ``rerun_disturbed``) run again what it left disturbed (:meth:`rerun_disturbed`)."""
        left, judge = [], []
        for cfg in self.deferred:
            lock = RunLock(cfg.run_dir())
            lock.acquire(wait=True)  # says who holds it while it waits
            lock.release()
            done = read_record(cfg) or self._put_back(cfg)
            if done is not None:
                if cfg.run_key() not in self.records:
                    self._tick()
                self.records[cfg.run_key()] = done
                judge.append(cfg)
            else:
                left.append(cfg)
        self.deferred = []
        for group in groups_of(left):
            self.run(group)
        if rerun_disturbed:
            self.rerun_disturbed(judge + left)

    def result(self, configs: list) -> SweepResult:
        res = SweepResult(skipped=self.skipped, launches=self.launches, rerun=len(self.rerun))
        res.rerun_failures = [(c, self.rerun_failures[c.run_key()]) for c in _unique(configs)
                              if self.rerun_failures.get(c.run_key())]
        seen = set()
        for cfg in configs:
            key = cfg.run_key()
            if key in seen:
                continue
            seen.add(key)
            if key in self.records:
                res.records.append(self.records[key])
                res.disturbed += bool(disturbance.disturbance(self.records[key]))
            elif key in self.failures:
                res.failures.append((cfg, self.failures[key]))
        return res


def _log_sweep(configs: list, result: SweepResult, sweep: _Sweep, launcher: str, started_at: str,
               duration_s: float) -> None:
    """One line per sweep and study folder in ``<study>/sweeps.jsonl`` (kanlib.manifest.SweepRow)."""
    by: dict = {}
    for c in _unique(configs):
        by.setdefault((c.out_dir, c.study), []).append(c.run_key())
    ok = {r.get("run_key") for r in result.records}
    failed = {c.run_key() for c, _ in result.failures}
    for (out_dir, study), keys in by.items():
        with contextlib.suppress(OSError):
            manifest.append_jsonl(os.path.join(out_dir, study, records.SWEEPS_NAME), manifest.SweepRow(
                study=study, started_at=started_at, duration_s=round(duration_s, 3), n_runs=len(keys),
                n_ok=sum(k in ok for k in keys), n_failed=sum(k in failed for k in keys),
                n_skipped=result.skipped if len(by) == 1 else 0, n_launches=sweep.launches if len(by) == 1 else 0,
                n_rerun=result.rerun if len(by) == 1 else 0, launcher=launcher))


def _unique(configs: list) -> list:
    """Each run key once, in order (a run listed twice runs once)."""
    seen, out = set(), []
    for c in configs:
        if c.run_key() not in seen:
            seen.add(c.run_key())
            out.append(c)
    return out


def _rounds(configs: list) -> list[tuple[int, list]]:
    """``(repeat, configs)`` in repeat order: every point's repeat r before any point's repeat r + 1."""
    by: dict[int, list] = {}
    for c in configs:
        by.setdefault(int(getattr(c, "repeat", 0)), []).append(c)
    return sorted(by.items())


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


# -- one SLURM allocation for a sweep ------------------------------------------------------------------
def run_sweep_in_allocation(configs: list, *, launcher_opts: dict | None = None, timeout_s: float | None = None,
                            skip_done: bool = True, max_restarts: int = 0, stream_output: bool = False,
                            rerun_disturbed: bool = True):
    """Run a sweep as one SLURM batch job: the job's script runs ``python -m runners.sweep --sweep=FILE`` on its
    first node, which runs the worker groups as job steps of the allocation (each placement on as many of its
    nodes as it needs). Follows the job's log to its end and returns a :class:`runners.sweep.SweepResult` from
    the records and manifest rows the job wrote. ``launcher_opts``: the site settings of
    :func:`runners.slurm.allocation_script` (``nodes``, ``time_limit`` of the whole allocation, ...) and ``dry_run``."""
    from runners.slurm import (ALLOCATION_OPTS, ALLOCATIONS_DIR, SWEEP_NAME, AllocationJob, SrunJob,
                               allocation_script, follow_allocation)

    opts = dict(launcher_opts or {})
    configs = _unique(configs)
    result = SweepResult()
    todo = []
    for cfg in configs:
        done = read_record(cfg) if skip_done else None
        # a disturbed first attempt is not done: the allocation reruns it
        if done is not None and not (rerun_disturbed and disturbance.needs_rerun(done)):
            result.records.append(done)
            result.skipped += 1
        else:
            todo.append(cfg)
    if not todo:
        return result
    folder = launch_dir(todo[0], records.new_run_id()).replace(f"{os.sep}launches{os.sep}",
                                                                f"{os.sep}{ALLOCATIONS_DIR}{os.sep}")
    step_opts = {k: v for k, v in opts.items() if k in SrunJob.OPTIONS and k not in ("env", "python")}
    sweep_file = os.path.join(os.path.abspath(folder), SWEEP_NAME)
    site = {k: v for k, v in opts.items() if k in ALLOCATION_OPTS and k not in ("sbatch_args", "poll_s", "mode",
                                                                                "dry_run")}
    script = allocation_script(todo, ["{python}", "-m", "runners.sweep", f"--sweep={sweep_file}"],
                               what=f"kanlib: one allocation for a sweep of {len(todo)} runs", **site)
    job = AllocationJob(folder, script, sbatch_args=opts.get("sbatch_args", ()), poll_s=opts.get("poll_s", 0.5),
                        label=f"a sweep of {len(todo)} runs")
    if opts.get("dry_run"):
        sys.stdout.write(f"# {job.script_path}\n{script}\n$ {shlex.join(job.command())}\n")
        return result
    os.makedirs(folder, exist_ok=True)
    write_sweep(sweep_file, todo, launcher="slurm", launcher_opts=step_opts, timeout_s=timeout_s,
                skip_done=skip_done, max_restarts=max_restarts, rerun_disturbed=rerun_disturbed)
    before = {c.run_key(): read_record(c) for c in todo}
    follow_allocation(job, echo=None if stream_output else False)
    return _collect_allocation(todo, before, job, result)


def _collect_allocation(configs: list, before: dict, job, result: "SweepResult") -> "SweepResult":
    """The sweep's result from what the allocation left: fresh records, else the run's last manifest row."""
    for cfg in configs:
        rec, old = read_record(cfg), before.get(cfg.run_key())
        if rec is not None and (old is None or rec.get("run_id") != old.get("run_id") or disturbance.needs_rerun(old)):
            result.records.append(rec)  # fresh, or the disturbed record whose rerun failed (it stays the run's)
            continue
        rows, _ = manifest.read_manifest_rows(manifest.manifest_path(cfg.out_dir, cfg.study))
        mine = [r for r in rows if r.get("run_key") == cfg.run_key()]
        if mine and mine[-1].get("status") != "ok":
            result.failures.append((cfg, f"{mine[-1]['status']}: {mine[-1].get('error', '')}"))
        else:
            result.failures.append((cfg, f"failed: {job.describe()} ended {job.state or 'without a state'} "
                                         f"before this run ended"))
    print(f"sweep: {len(result.records)} ok ({result.skipped} already done), {len(result.failures)} failed, "
          f"one allocation ({job.describe()})")
    for cfg, msg in result.failures:
        print(f"FAILED {cfg.run_key()}: {msg.splitlines()[0]}")
    return result


# -- a sweep from a file (what a SLURM allocation runs: run_sweep_in_allocation) --------------------------
def write_sweep(path: str, configs: list, **options) -> None:
    """Write a sweep to run elsewhere: its configs (kind and fields) and :func:`run_sweep`'s options."""
    from kanlib import records
    from kanlib.worker import kind_of

    records.atomic_write_json(path, {"configs": [{"kind": kind_of(c), "config": c.to_dict()} for c in configs],
                                     "options": options})


def read_sweep(path: str) -> tuple[list, dict]:
    """The configs and options :func:`write_sweep` wrote (ConfigError naming the file when unreadable)."""
    import json

    from kanlib.worker import config_kinds

    try:
        with open(path) as f:
            data = json.load(f)
        kinds = config_kinds()
        return [kinds[e["kind"]][0](**e["config"]) for e in data["configs"]], dict(data["options"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"sweep: cannot read {path}: {type(e).__name__}: {e}") from e


def main(argv: list[str] | None = None) -> int:
    """``python -m runners.sweep --sweep=FILE``: run the sweep of FILE here (inside a SLURM allocation, its
    worker groups are job steps); exit 1 when a run failed."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not argv[0].startswith("--sweep="):
        raise SystemExit("usage: python -m runners.sweep --sweep=FILE (written by runners.sweep.write_sweep)")
    configs, options = read_sweep(argv[0].split("=", 1)[1])
    result = run_sweep(configs, progress=False, stream_output=True, **options)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
