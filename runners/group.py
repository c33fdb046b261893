"""Worker groups: the runs of one placement handed to one launch, one after another (kanlib.worker).

A launch is one torchrun here, ``N`` torchruns joined by one rendezvous for ``NxP``, or one ``srun`` step inside
a SLURM allocation; its processes start once and run every run of its plan. :func:`run_group` runs a list of
configs that may share processes (equal :func:`kanlib.config.group_key`) in as few launches as faults allow:
a run that fails, hangs past its deadline or is killed ends its launch (the manifest says why), and a fresh
launch carries on with the next run. Each launch has a folder ``<out_dir>/<study>/launches/<launch_id>/``
holding its ``plan.json``, ``events.jsonl`` and logs, and a line in ``<study>/launches.jsonl``.
"""

from __future__ import annotations

import os

from kanlib import records
from kanlib.config import group_key
from runners.supervisor import Launch, Outcome

LAUNCHES_DIR = "launches"


def launch_dir(cfg, launch_id: str) -> str:
    """``<out_dir>/<study>/launches/<launch_id>``: a launch's plan, events and logs."""
    return os.path.join(cfg.out_dir, cfg.study, LAUNCHES_DIR, launch_id)


def new_plan(configs: list, keep_open: bool = False) -> tuple[str, str | None]:
    """Write the plan of a new launch of ``configs`` (one group key); returns ``(launch_id, plan_path)``. A
    config a worker group cannot run (kanlib.worker.runs_in_worker) gets no plan: it runs alone. ``keep_open``:
    the group waits for more runs when it has run these (kanlib.worker.write_plan)."""
    from kanlib.worker import PLAN_NAME, runs_in_worker, write_plan

    launch_id = records.new_run_id()
    if not runs_in_worker(configs[0]):
        return launch_id, None
    folder = launch_dir(configs[0], launch_id)
    os.makedirs(folder, exist_ok=True)
    path = os.path.abspath(os.path.join(folder, PLAN_NAME))
    write_plan(path, launch_id, configs, keep_open=keep_open)
    return launch_id, path


def groups_of(configs: list) -> list[list]:
    """``configs`` split by :func:`kanlib.config.group_key`, each group in the given order, groups in the order
    their first member appears."""
    out: dict = {}
    for c in configs:
        out.setdefault(group_key(c), []).append(c)
    return list(out.values())


def run_group(configs: list, make_job, *, timeout_s: float | None = None, echo=None, retries: int = 0,
              on_end=None, keep_open: bool = False, reuse: Launch | None = None) -> tuple[list[Outcome], Launch | None]:
    """Run ``configs`` (one group key) in launches of ``make_job(first_config, plan_path)``; returns the outcome of
    every run, in the order they ended, and the launch left waiting for more runs (or None). ``on_end(cfg)`` is
    called as each run ends (the caller's lock).

    ``reuse``: a launch of the same group key left waiting by an earlier call: it runs these too (a group that
    left meanwhile is closed and a fresh one started). ``keep_open``: a new launch waits for more runs when every
    run handed to it ended ok, instead of leaving; the caller hands it the next ones (``reuse``) or closes it
    (:meth:`runners.supervisor.Launch.close`)."""
    from kanlib.worker import runs_in_worker

    pending, outcomes = list(configs), []
    launch = reuse
    while pending:
        if launch is not None and not launch.alive():
            launch.close()  # left while it waited (killed between rounds): its line, and a fresh launch
            launch = None
        reused = launch is not None
        if reused:
            ended = launch.extend(pending)
        else:
            alone = not runs_in_worker(pending[0])
            launch_id, plan = new_plan(pending[:1] if alone else pending, keep_open=keep_open and not alone)
            job = make_job(pending[0], plan)
            launch = Launch(pending if plan else pending[:1], job, timeout_s=timeout_s, echo=echo, on_end=on_end,
                            launch_id=launch_id, plan_path=plan, keep_open=keep_open and plan is not None)
            ended = launch.watch(retries)
        outcomes += ended
        done = {o.cfg.run_key() for o in ended}
        rest = [c for c in pending if c.run_key() not in done]
        if len(rest) == len(pending) and not reused:  # a fresh launch always ends its first run: never loop
            raise RuntimeError(f"launch {launch.launch_id} ended no run of its plan")
        pending = rest
        if not launch.alive():
            launch.close()
            launch = None
    return outcomes, launch
