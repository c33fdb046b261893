"""Launch a run through torchrun and collect its record: ``run(cfg) -> record``.

``run`` picks the launcher's :class:`~runners.supervisor.Job` - local (one torchrun here; a config with
``nnodes > 1`` becomes ``nnodes`` torchruns here, runners/multinode.py), multinode, or slurm
(runners/slurm.py) - and hands it to :func:`runners.supervisor.supervise`, which owns the deadline, the
log, the outcome and the manifest row (``out_dir/<study>/manifest.jsonl``). A config this machine cannot
run is refused before any process starts (:func:`runners.command.check_environment`) and recorded as a
failed attempt. ``cfg`` is any kanlib Config: a training run (kanlib.train) or a collective benchmark
(kanlib.collbench).
"""

from __future__ import annotations

import os

from kanlib import manifest, records
from kanlib.config import ConfigError
from runners.command import check_environment, check_timeout, launch_env, torchrun_command  # noqa: F401  (re-exported)
from runners.group import new_plan
from runners.supervisor import Job, RunFailed, read_record, supervise  # noqa: F401  (re-exported)

LAUNCHERS = ("local", "multinode", "slurm")


def make_job(cfg, launcher: str, launcher_opts: dict | None = None, max_restarts: int = 0,
             plan: str | None = None) -> Job:
    """The :class:`Job` that runs ``cfg`` with ``launcher`` (``launcher_opts`` are its settings); with ``plan``,
    the worker group that runs that plan (kanlib.worker) at ``cfg``'s placement. ``slurm`` inside an allocation
    (``SLURM_JOB_ID`` set) runs the group as a job step; outside, as a batch job of its own."""
    # keys that size an allocation (runners.slurm), not one launch
    opts = {k: v for k, v in (launcher_opts or {}).items() if k not in ("mode", "nodes", "study_time_limit")}
    if launcher == "slurm":
        from runners.slurm import SlurmJob, SrunJob, inside_allocation

        if inside_allocation():
            return SrunJob(cfg, plan=plan, **{k: v for k, v in opts.items() if k in SrunJob.OPTIONS})
        return SlurmJob(cfg, plan=plan, **opts)
    if launcher == "multinode":
        from runners.multinode import MultiNodeJob

        return MultiNodeJob(cfg, max_restarts=max_restarts, plan=plan, **opts)
    from runners.local import LocalJob

    return LocalJob(cfg, max_restarts=max_restarts, plan=plan, **opts)


def effective_launcher(cfg, launcher: str) -> str:
    """``local`` for a multi-node config means one torchrun per "node" on this host (multinode)."""
    if launcher not in LAUNCHERS:
        raise ConfigError(f"launcher: unknown value {launcher!r}; choose one of {', '.join(LAUNCHERS)}")
    return "multinode" if launcher == "local" and cfg.nnodes > 1 else launcher


def run(cfg, *, launcher: str = "local", launcher_opts: dict | None = None, timeout_s: float | None = None,
        echo=None, max_restarts: int = 0, port_retries: int = 3) -> dict:
    """Launch ``cfg``, record the attempt in the study's manifest, and return its record.

    ``timeout_s`` is a deadline for the whole run (status ``timeout``); ``max_restarts`` lets torchrun
    restart failed workers, which resume from the last checkpoint (local launcher); a local launch that
    fails with "address already in use" is relaunched up to ``port_retries`` times. Raises
    :class:`RunFailed` (``status`` failed, timeout or preempted) when there is no fresh record, and
    :class:`ConfigError` for a config this machine cannot run (also recorded as a failed attempt).
    ``echo``: where the run's output goes (default stdout; False: nowhere). With the slurm launcher,
    ``launcher_opts={"dry_run": True, ...}`` prints the script and the sbatch command and returns None.
    """
    check_timeout(timeout_s)
    launcher = effective_launcher(cfg, launcher)
    if launcher == "slurm" and (launcher_opts or {}).get("dry_run"):
        from runners.slurm import run_slurm

        opts = {k: v for k, v in launcher_opts.items() if k not in ("dry_run", "mode")}
        return run_slurm(cfg, dry_run=True, echo=echo, **opts)  # prints the script, submits nothing
    try:
        check_environment(cfg, launcher)
        launch_id, plan = new_plan([cfg])
        job = make_job(cfg, launcher, launcher_opts, max_restarts, plan=plan)
    except ConfigError as e:
        refused(cfg, launcher, f"ConfigError: {e}")
        raise
    return supervise(cfg, job, timeout_s=timeout_s, echo=echo, launch_id=launch_id,
                     retries=port_retries if launcher == "local" else 0)


def refused(cfg, launcher: str, error: str) -> None:
    """Record a config refused before any launch as a failed attempt of its run."""
    manifest.append_manifest(manifest.manifest_path(cfg.out_dir, cfg.study), manifest.ManifestRow(
        run_key=cfg.run_key(), study=cfg.study, world_size=cfg.world_size, placement=cfg.placement,
        launcher=launcher, run_dir=cfg.run_dir(), status="failed", error=error, attempt_at=records.now_iso(),
        duration_s=0.0, pid=os.getpid()))


__all__ = ["run", "make_job", "effective_launcher", "RunFailed", "read_record", "torchrun_command", "launch_env",
           "check_environment", "LAUNCHERS"]
