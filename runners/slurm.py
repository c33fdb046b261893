"""Run a config on a SLURM cluster: one torchrun per node under srun, c10d rendezvous on the head node.

- :func:`sbatch_script` renders ``runners/slurm/train.sbatch.tmpl`` for one config and a site's settings
  (partition, account, GPUs, time limit, modules, environment) - a pure function. Every value is quoted
  or validated: no field can inject a shell command or expand a variable inside the job.
- :class:`SlurmJob` is the launcher for :func:`runners.supervisor.supervise`: it writes the script into the
  run's folder, submits it with ``sbatch``, polls ``scontrol show job`` and cancels with ``scancel``; the
  supervisor streams ``<run_dir>/slurm-<jobid>.log`` and decides the outcome.
- :func:`srun_command` is the ``srun ... torchrun ...`` line for use inside an allocation you already hold.

``runners.launch.run(cfg, launcher="slurm", launcher_opts={...})`` runs it. The record says
``launcher == "slurm"`` and carries the job id and node list. See docs/cluster.md.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid

from kanlib import records
from kanlib.config import ConfigError
from runners.command import compile_cache_dir, launch_env, torchrun_command, worker_program
from runners.local import events_of, start_torchrun
from runners.supervisor import Job, RunFailed, end_process_tree, supervise

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slurm", "train.sbatch.tmpl")
ALLOCATION_TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slurm", "allocation.sbatch.tmpl")
ALLOCATIONS_DIR = "allocations"
SCRIPT_NAME = "train.sbatch"
# Job states after which a job never runs again (scontrol's JobState).
TERMINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Site values that become #SBATCH arguments: SLURM names (no spaces, quotes, '$' or control characters).
_SITE_NAME = re.compile(r"[A-Za-z0-9_.,:+@%=/-]+")
# A free TCP port on the node that runs it (the head node, for the batch script).
FREE_PORT_PY = 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
_RDZV_ENDPOINT = "$HEAD_ADDR:$PORT"
_RDZV_ID = "$SLURM_JOB_ID"


def _site_value(name: str, value) -> str:
    value = str(value)
    if not _SITE_NAME.fullmatch(value):
        raise ConfigError(f"{name}: {value!r} is not a SLURM name (letters, digits and _.,:+@%=/- only)")
    return value


def head_address(nodelist: str | None = None) -> str:
    """Address of the first node of ``nodelist`` (default ``$SLURM_JOB_NODELIST``): its ``NodeAddr`` from
    ``scontrol show node`` (which differs from the node name on clusters whose names do not resolve, and on
    test nodes sharing one host), else the name."""
    nodelist = nodelist or os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise RuntimeError("SLURM_JOB_NODELIST is not set: not inside a SLURM allocation")
    names = _scontrol(["show", "hostnames", nodelist]).split()
    if not names:
        raise RuntimeError(f"scontrol show hostnames {nodelist!r} returned no host")
    m = re.search(r"\bNodeAddr=(\S+)", _scontrol(["show", "node", names[0]]))
    return m.group(1) if m else names[0]


def free_port_on(node: str, python: str = sys.executable) -> int:
    """A port free now on ``node`` of the current allocation (asked there with a one-task srun step)."""
    out = subprocess.run(["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}", python, "-c", FREE_PORT_PY],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0 or not out.stdout.strip().isdigit():
        raise RuntimeError(f"could not pick a free port on {node}: {out.stderr.strip() or out.stdout.strip()}")
    return int(out.stdout.strip())


def srun_command(cfg, *, python: str = sys.executable, rdzv_endpoint: str | None = None,
                 rdzv_id: str | None = None, cpus_per_task: int | None = None,
                 srun_args: tuple[str, ...] | list[str] = (), program: list[str] | None = None) -> list[str]:
    """``srun`` starting one torchrun per node of the current allocation, for ``cfg`` (or, with ``program``,
    for the worker group running a plan: kanlib.worker).

    ``rdzv_endpoint`` defaults to the head node's address and a port found free on it now, ``rdzv_id`` to
    ``$SLURM_JOB_ID`` (outside an allocation pass both). ``--cpus-per-task`` is passed explicitly (from Slurm
    22.05 srun no longer inherits it from the allocation): ``nproc_per_node * threads`` unless given.
    ``--kill-on-bad-exit=1`` ends every node's torchrun when one fails, instead of leaving the others
    waiting in a collective.
    """
    if rdzv_endpoint is None or rdzv_id is None:
        job = os.environ.get("SLURM_JOB_ID")
        if not job:
            raise RuntimeError("SLURM_JOB_ID is not set: pass rdzv_endpoint and rdzv_id, or run inside a SLURM "
                               "allocation")
        if rdzv_endpoint is None:
            head = head_address()
            first = _scontrol(["show", "hostnames", os.environ["SLURM_JOB_NODELIST"]]).split()[0]
            port = free_port_here(head) or free_port_on(first, python)
            rdzv_endpoint = f"{head}:{port}"
        rdzv_id = rdzv_id or f"{job}-{uuid.uuid4().hex[:8]}"
    cpus = cpus_per_task or cfg.nproc_per_node * cfg.threads
    # --ntasks explicitly: inside a batch job srun would take the allocation's task count from its environment
    return (["srun", "--kill-on-bad-exit=1", f"--nodes={cfg.nnodes}", f"--ntasks={cfg.nnodes}", "--ntasks-per-node=1",
             f"--cpus-per-task={cpus}", *srun_args]
            + torchrun_command(cfg, python=python, standalone=False, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id,
                               program=program))


def free_port_here(address: str) -> int | None:
    """A port free now on ``address`` when that address belongs to this host (the sweep runs on the head node,
    as a batch script does), else None."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
            return s.getsockname()[1]
    except OSError:
        return None


def inside_allocation() -> bool:
    """Whether this process runs inside a SLURM allocation (a batch job, or ``salloc``): worker groups then run
    as its job steps instead of jobs of their own."""
    return bool(os.environ.get("SLURM_JOB_ID"))


def _site(cfg, *, partition=None, account=None, gpus_per_node: int = 0, time_limit: str = "00:30:00",
          modules=(), env=None, sbatch_options=()) -> tuple[list[str], dict]:
    """Check a site's settings for a job that runs ``cfg`` (the largest of a sweep); the ``#SBATCH`` options
    and the environment to export. Every value is validated: none can inject a command or expand in the job."""
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int):
        raise ConfigError(f"gpus_per_node: expected an integer, got {gpus_per_node!r}")
    if gpus_per_node < 0:
        raise ConfigError(f"gpus_per_node: must be >= 0, got {gpus_per_node!r}")
    if gpus_per_node == 0 and cfg.device == "cuda":
        raise ConfigError("gpus_per_node: device='cuda' needs gpus_per_node >= 1 (SLURM would give the job no GPU)")
    if gpus_per_node and cfg.nproc_per_node > gpus_per_node:
        raise ConfigError(f"nproc_per_node: {cfg.nproc_per_node} processes per node but gpus_per_node={gpus_per_node}")
    if not re.fullmatch(r"(\d+-)?\d+(:\d\d){0,2}", str(time_limit)):
        raise ConfigError(f"time_limit: expected [D-]HH:MM:SS, got {time_limit!r}")
    env = dict(env or {})
    for key, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)):
            raise ConfigError(f"env: {key!r} is not a valid environment variable name")
        if re.search(r"[\x00-\x1f\x7f]", str(value)):
            raise ConfigError(f"env: the value of {key} holds a control character (newline?): {value!r}")
    for m in modules:
        if re.search(r"[\x00-\x1f\x7f]", str(m)):
            raise ConfigError(f"modules: {m!r} holds a control character (newline?)")
    options = [f"--gpus-per-node={gpus_per_node}"] if gpus_per_node else []
    options += [f"--partition={_site_value('partition', partition)}"] if partition else []
    options += [f"--account={_site_value('account', account)}"] if account else []
    for o in sbatch_options:
        if not re.fullmatch(r"--[A-Za-z][A-Za-z0-9-]*(=[A-Za-z0-9_.,:+@%=/-]+)?", str(o)):
            raise ConfigError(f"sbatch_options: {o!r} is not one sbatch option (--name or --name=value, no "
                              f"spaces, quotes or shell characters)")
        options.append(str(o))
    return options, env


def _cpus(name: str, value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}: expected a positive integer, got {value!r}")
    return value


def sbatch_script(cfg, *, partition: str | None = None, account: str | None = None,
                  gpus_per_node: int = 0, time_limit: str = "00:30:00",
                  modules: tuple[str, ...] | list[str] = (), env: dict | None = None,
                  python: str = sys.executable, job_name: str | None = None,
                  cpus_per_task: int | None = None, sbatch_options: tuple[str, ...] | list[str] = (),
                  program: list[str] | None = None) -> str:
    """The sbatch script of one run of ``cfg`` (rendered from ``runners/slurm/train.sbatch.tmpl``); with
    ``program``, of the worker group running it (``python -m kanlib.worker --plan=...``).

    Site settings: ``partition``, ``account``, ``gpus_per_node`` (0: no ``--gpus-per-node``; refused with
    ``device='cuda'``), ``time_limit`` (``[D-]HH:MM:SS``), ``modules`` (each ``module load``-ed), ``env``
    (exported, e.g. ``{"NCCL_SOCKET_IFNAME": "ib0"}``), ``python`` (the interpreter on the compute nodes),
    ``cpus_per_task`` (default ``nproc_per_node * threads``), ``sbatch_options`` (extra ``#SBATCH`` lines,
    e.g. ``"--exclusive"``). The log path and working directory are given to ``sbatch`` on its command line
    by :class:`SlurmJob` (paths may hold spaces there), so a relative ``cfg.out_dir`` names the same folder
    for the job and for the runner reading the record back.
    """
    options, env = _site(cfg, partition=partition, account=account, gpus_per_node=gpus_per_node,
                         time_limit=time_limit, modules=modules, env=env, sbatch_options=sbatch_options)
    cpus = _cpus("cpus_per_task", cpus_per_task) or cfg.nproc_per_node * cfg.threads
    srun = srun_command(cfg, python=python, rdzv_endpoint=_RDZV_ENDPOINT, rdzv_id=_RDZV_ID, cpus_per_task=cpus,
                        program=program)
    values = {
        "run_key": cfg.run_key(),
        "job_name": _site_value("job_name", job_name or f"kanlib-{cfg.study}-{cfg.placement}"),
        "nnodes": str(cfg.nnodes),
        "nproc_per_node": str(cfg.nproc_per_node),
        "cpus_per_task": str(cpus),
        "time_limit": str(time_limit),
        "sbatch_options": "\n".join(f"#SBATCH {o}" for o in options),
        "module_lines": "\n".join(f"module load {shlex.quote(str(m))}" for m in modules),
        "pythonpath": shlex.quote(_ROOT),
        "python": shlex.quote(python),
        "free_port_py": shlex.quote(FREE_PORT_PY),
        "threads": str(cfg.threads),
        "compile_cache": shlex.quote(compile_cache_dir(cfg)),
        "env_lines": "\n".join(f"export {k}={shlex.quote(str(v))}" for k, v in sorted(env.items())),
        "srun_line": _shell_join(srun),
    }
    with open(TEMPLATE) as f:
        template = f.read()
    return _render(template, values)


class SlurmJob(Job):
    """One sbatch job for one run; ``job_id`` once submitted."""

    launcher = "slurm"

    def __init__(self, cfg, *, sbatch_args=(), poll_s: float = 0.5, plan: str | None = None, **script_opts):
        self.cfg, self.sbatch_args, self.poll_s, self.plan = cfg, list(sbatch_args), poll_s, plan
        self.script = sbatch_script(cfg, program=worker_program(plan) if plan else None, **script_opts)
        self.run_dir = os.path.dirname(plan) if plan else os.path.abspath(cfg.run_dir())
        self.script_path = os.path.join(self.run_dir, SCRIPT_NAME)
        self.job_id: str | None = None
        self.state = self.exit_code = None
        self._last_poll = 0.0
        self._errors = 0

    def command(self) -> list[str]:
        # SLURM expands %-patterns in --output (%j: the job id): a '%' of the folder itself is written '%%'
        output = os.path.join(self.run_dir.replace("%", "%%"), "slurm-%j.log")
        return ["sbatch", "--parsable", f"--output={output}",
                f"--chdir={os.getcwd()}", *self.sbatch_args, self.script_path]

    def start(self) -> None:
        os.makedirs(self.run_dir, exist_ok=True)
        with open(self.script_path, "w") as f:
            f.write(self.script)
        cmd = self.command()
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise self.refused(out)
        self.job_id = out.stdout.strip().split(";")[0]

    def refused(self, out) -> RunFailed:
        why = out.stderr.strip() or out.stdout.strip()
        return RunFailed(f"sbatch refused run {self.cfg.run_key()} (exit {out.returncode}): {why}\n"
                         f"$ {shlex.join(self.command())}", returncode=out.returncode, log_tail=out.stderr,
                         run_dir=self.run_dir, error=f"sbatch refused: {why}")

    def poll(self) -> int | None:
        if time.monotonic() - self._last_poll < self.poll_s:
            return None
        self._last_poll = time.monotonic()
        try:
            info = _job_info(self.job_id)
            self._errors = 0
        except RuntimeError:  # a busy controller times out now and then: retry for ~a minute
            self._errors += 1
            if self._errors * self.poll_s > 60:
                raise
            return None
        if info is not None:
            self.state, self.exit_code = info.get("JobState"), info.get("ExitCode")
            if self.state not in TERMINAL_STATES:
                return None
        # ended, or forgotten by the controller (it ended more than MinJobAge ago)
        time.sleep(0.2)  # the batch step closes its log after the job state changes
        if self.state in (None, "COMPLETED"):
            return 0
        return _exit_status(self.exit_code) or 1

    def cancel(self, grace_s: float) -> None:
        if self.job_id is None:
            return
        subprocess.run(["scancel", self.job_id], capture_output=True)
        end = time.monotonic() + max(grace_s, 30.0)
        while time.monotonic() < end:
            info = _job_info(self.job_id)
            if info is None or info.get("JobState") in TERMINAL_STATES:
                if info is not None:
                    self.state, self.exit_code = info.get("JobState"), info.get("ExitCode")
                return
            time.sleep(0.5)

    def log_paths(self) -> list[str]:
        return [os.path.join(self.run_dir, f"slurm-{self.job_id}.log")] if self.job_id else []

    def events_path(self) -> str | None:
        return events_of(self.plan)

    def describe(self) -> str:
        return f"SLURM job {self.job_id}" if self.job_id else "SLURM job"

    def outcome(self, returncode):
        if self.state == "PREEMPTED":
            return "preempted", "was preempted by SLURM"
        if self.state == "TIMEOUT":
            return "timeout", "reached its SLURM time limit"
        if self.state in (None, "COMPLETED"):
            return None, "completed but wrote no new record"
        return None, f"ended {self.state} with exit code {self.exit_code}"


class SrunJob(Job):
    """A worker group as one job step of the allocation this process runs in: ``srun`` starts one torchrun on
    each of ``cfg.nnodes`` of the allocation's nodes, and the workers run the plan (kanlib.worker). The step is
    named after its launch, and cancelled with ``scancel`` (srun's own exit would leave it to SLURM)."""

    launcher = "slurm"
    OPTIONS = ("cpus_per_task", "srun_args", "python", "env")

    def __init__(self, cfg, *, plan: str, cpus_per_task: int | None = None, srun_args=(), python: str = sys.executable,
                 env: dict | None = None):
        self.cfg, self.plan, self.python = cfg, plan, python
        self.cpus_per_task, self.env = cpus_per_task, dict(env or {})
        self.name = "kanlib-" + os.path.basename(os.path.dirname(plan))
        self.srun_args = [*srun_args, f"--job-name={_site_value('job_name', self.name)}"]
        self.log = os.path.join(os.path.dirname(plan), "srun.log")
        self.proc = None

    def start(self) -> None:
        cmd = srun_command(self.cfg, python=self.python, cpus_per_task=self.cpus_per_task, srun_args=self.srun_args,
                           program=worker_program(self.plan))
        env = launch_env(self.cfg, "slurm")
        env.update({k: str(v) for k, v in self.env.items()})
        self.proc = start_torchrun(cmd, env, self.log)

    def poll(self) -> int | None:
        return self.proc.poll()

    def cancel(self, grace_s: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        step = self._step_id()
        if step:
            subprocess.run(["scancel", "--signal=TERM", step], capture_output=True)
        else:
            self.proc.send_signal(signal.SIGTERM)  # srun passes it to the tasks
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            if step:
                subprocess.run(["scancel", step], capture_output=True)
            end_process_tree(self.proc, 5.0)

    def _step_id(self) -> str | None:
        out = subprocess.run(["squeue", "-h", "-s", "-j", os.environ.get("SLURM_JOB_ID", ""), "-o", "%i %j"],
                             capture_output=True, text=True)
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == self.name:
                return parts[0]
        return None

    def log_paths(self) -> list[str]:
        return [self.log]

    def events_path(self) -> str | None:
        return events_of(self.plan)

    def describe(self) -> str:
        return f"SLURM step {self.name} of job {os.environ.get('SLURM_JOB_ID')}"


def run_slurm(cfg, *, timeout_s: float | None = None, echo=None, dry_run: bool = False,
              sbatch_args: tuple[str, ...] | list[str] = (), poll_s: float = 0.5, **script_opts) -> dict | None:
    """Submit ``cfg`` as one SLURM job, follow it to its end, and return its record (see :class:`SlurmJob`;
    ``script_opts`` go to :func:`sbatch_script`). ``dry_run`` prints the script and the sbatch command to
    ``echo`` and returns None without writing or submitting anything."""
    job = SlurmJob(cfg, sbatch_args=sbatch_args, poll_s=poll_s, **script_opts)
    if dry_run:
        stream = echo or sys.stdout
        stream.write(f"# {job.script_path}\n{job.script}\n$ {shlex.join(job.command())}\n")
        return None
    return supervise(cfg, job, timeout_s=timeout_s, echo=echo)


# -- one allocation for a whole sweep ------------------------------------------------------------------
SWEEP_NAME = "sweep.json"
# launcher_opts that shape the allocation (the batch job) rather than its job steps
ALLOCATION_OPTS = ("partition", "account", "gpus_per_node", "time_limit", "modules", "env", "python", "job_name",
                   "cpus_per_task", "sbatch_options", "sbatch_args", "poll_s", "nodes", "mode", "dry_run")


def allocation_script(configs: list, command: list[str], *, nodes: int | None = None, partition: str | None = None,
                      account: str | None = None, gpus_per_node: int = 0, time_limit: str = "01:00:00",
                      modules=(), env: dict | None = None, python: str = sys.executable, job_name: str | None = None,
                      cpus_per_task: int | None = None, sbatch_options=(), what: str = "") -> str:
    """The batch script of one allocation that runs ``command`` (a sweep, or a whole study) on its first node,
    sized for the largest placement of ``configs``: ``nodes`` (default the largest ``nnodes``), one task per node
    with ``cpus_per_task`` CPUs (default the largest ``nproc_per_node * threads``), ``gpus_per_node``. The other
    site settings are those of :func:`sbatch_script`, validated alike."""
    widest = max(configs, key=lambda c: (c.nproc_per_node * c.threads, c.nnodes))
    need = max(c.nnodes for c in configs)
    nodes = _cpus("nodes", nodes) or need
    if nodes < need:
        raise ConfigError(f"nodes: the allocation has {nodes} nodes but a placement of the sweep needs {need}")
    options, env = _site(widest, partition=partition, account=account, gpus_per_node=gpus_per_node,
                         time_limit=time_limit, modules=modules, env=env, sbatch_options=sbatch_options)
    cpus = _cpus("cpus_per_task", cpus_per_task) or max(c.nproc_per_node * c.threads for c in configs)
    first = configs[0]
    values = {
        "what": what or f"kanlib: one allocation for {len(configs)} runs",
        "job_name": _site_value("job_name", job_name or f"kanlib-{first.study}"),
        "nnodes": str(nodes), "cpus_per_task": str(cpus), "time_limit": str(time_limit),
        "sbatch_options": "\n".join(f"#SBATCH {o}" for o in options),
        "module_lines": "\n".join(f"module load {shlex.quote(str(m))}" for m in modules),
        "pythonpath": shlex.quote(_ROOT), "compile_cache": shlex.quote(compile_cache_dir(first)),
        "env_lines": "\n".join(f"export {k}={shlex.quote(str(v))}" for k, v in sorted(env.items())),
        "command": _shell_join([python if a == "{python}" else a for a in command]),
    }
    with open(ALLOCATION_TEMPLATE) as f:
        return _render(f.read(), values)


class AllocationJob(SlurmJob):
    """One batch job holding an allocation; its script runs a command on the first node (a sweep whose worker
    groups are job steps). Submitted, polled and cancelled like :class:`SlurmJob`."""

    def __init__(self, folder: str, script: str, *, sbatch_args=(), poll_s: float = 0.5, label: str = ""):
        self.cfg, self.sbatch_args, self.poll_s, self.plan = None, list(sbatch_args), poll_s, None
        self.script, self.run_dir, self.label = script, os.path.abspath(folder), label
        self.script_path = os.path.join(self.run_dir, "allocation.sbatch")
        self.job_id = None
        self.state = self.exit_code = None
        self._last_poll = 0.0
        self._errors = 0

    def events_path(self) -> str | None:
        return None

    def describe(self) -> str:
        return f"SLURM allocation {self.job_id}" if self.job_id else "SLURM allocation"

    def refused(self, out) -> RunFailed:
        why = out.stderr.strip() or out.stdout.strip()
        return RunFailed(f"sbatch refused the allocation of {self.label} (exit {out.returncode}): {why}",
                         returncode=out.returncode, log_tail=out.stderr, run_dir=self.run_dir,
                         error=f"sbatch refused: {why}")


def follow_allocation(job: "AllocationJob", echo) -> None:
    """Submit the allocation and follow its log until it ends (Ctrl-C or SIGTERM: scancel, which ends its steps
    gracefully: the sweep inside records them)."""
    from runners.supervisor import POLL_S, LogFollower

    echo = sys.stdout if echo is None else echo
    job.start()
    follow = LogFollower(job.log_paths(), echo, [""])
    try:
        while job.poll() is None:
            follow.pump()
            time.sleep(POLL_S)
    except BaseException:
        job.cancel(60.0)
        follow.pump(final=True)
        raise
    follow.pump(final=True)


# -- one allocation for a whole study (make study PARAMS_SET=gpu_cluster) --------------------------------------
def params_set(folder: str) -> tuple[dict, int]:
    """A parameter set's ``launch.yaml`` values and the most nodes any placement of its notebooks asks for
    (every ``"NxP"`` list, and ``world_sizes`` over ``procs_per_node``). A folder that does not exist is refused
    with a :class:`ConfigError` naming it and the sets beside it: a mistyped set must not run the notebooks' tiny
    defaults, nor a cluster's study as the small one."""
    import yaml

    from kanlib.config import parse_placement

    if not os.path.isdir(folder):
        parent = os.path.dirname(os.path.abspath(folder))
        sets = sorted(d for d in os.listdir(parent) if os.path.isdir(os.path.join(parent, d))) \
            if os.path.isdir(parent) else []
        raise ConfigError(f"parameter set {os.path.basename(os.path.normpath(folder))!r}: no folder {folder}; "
                          f"the sets in {parent}: {', '.join(sets) or '(none)'}")
    launch, most = {}, 1
    for path in sorted(glob.glob(os.path.join(folder, "*.yaml"))):
        with open(path) as f:
            values = yaml.safe_load(f) or {}
        if os.path.basename(path) == "launch.yaml":
            launch = values
        for key, v in values.items():
            if isinstance(v, list) and v and all(isinstance(x, str) and re.fullmatch(r"\s*\d+\s*[xX]\s*\d+\s*", x)
                                                 for x in v):
                most = max([most] + [parse_placement(x)[0] for x in v])
        ppn = values.get("procs_per_node") or 0
        if ppn and values.get("world_sizes"):
            most = max([most] + [-(-int(n) // int(ppn)) for n in values["world_sizes"]])
    return launch, most


def study_allocation(params_dir: str, out: str, make_args: list[str], *, dry_run: bool = False) -> int:
    """Run ``make study`` inside one SLURM allocation: a batch job, sized for the parameter set's largest placement
    (``launcher_opts.nodes`` overrides; ``launcher_opts.study_time_limit`` is the whole study's limit), whose script
    runs ``make study ...`` on its first node; there every sweep finds itself inside the allocation and runs its
    worker groups as job steps. Follows the job's log; returns its exit code (0 when it completed)."""
    from kanlib.config import RunConfig

    launch, most = params_set(params_dir)
    opts = dict(launch.get("launcher_opts") or {})
    nodes = opts.pop("nodes", None) or most
    opts["time_limit"] = opts.pop("study_time_limit", None) or opts.get("time_limit", "04:00:00")
    gpus = int(opts.get("gpus_per_node") or 0)
    run = launch.get("base_config") or {}  # the RunConfig fields every launch notebook of the set starts from
    device = run.get("device", "auto")
    sizing = RunConfig(nnodes=nodes, nproc_per_node=max(1, gpus), threads=int(run.get("threads", 1)),
                       device="cuda" if gpus and device == "cuda" else "cpu", backend="gloo" if not gpus else "auto",
                       global_batch=max(1, gpus) * nodes, out_dir=out, study="study")
    site = {k: v for k, v in opts.items() if k in ALLOCATION_OPTS and k not in ("sbatch_args", "poll_s", "mode",
                                                                               "dry_run", "nodes")}
    script = allocation_script([sizing], ["make", *make_args], nodes=nodes,
                               what=f"kanlib: make study ({os.path.basename(params_dir)}) in one allocation", **site)
    folder = os.path.join(out, ALLOCATIONS_DIR, records.new_run_id())
    job = AllocationJob(folder, script, sbatch_args=opts.get("sbatch_args", ()), poll_s=opts.get("poll_s", 2.0),
                        label=f"make study {' '.join(make_args)}")
    if dry_run:
        sys.stdout.write(f"# {job.script_path}\n{script}\n$ {shlex.join(job.command())}\n")
        return 0
    os.makedirs(folder, exist_ok=True)
    follow_allocation(job, echo=None)
    print(f"kanlib: {job.describe()} ended {job.state}; its log: {job.log_paths()[0]}")
    return 0 if job.state in (None, "COMPLETED") else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m runners.slurm uses-slurm PARAMS_DIR`` exits 0 when the set launches through SLURM (1 when it
    does not, 2 when there is no such set); ``python -m runners.slurm study PARAMS_DIR OUT [--dry-run] --
    MAKE_ARGS...`` runs make study in one allocation (:func:`study_allocation`)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["uses-slurm"] and len(argv) == 2:
        try:
            launch, _ = params_set(argv[1])
        except ConfigError as e:
            print(f"runners.slurm: {e}", file=sys.stderr)
            return 2
        return 0 if launch.get("launcher") == "slurm" else 1
    if argv[:1] == ["study"] and "--" in argv:
        head, make_args = argv[1:argv.index("--")], argv[argv.index("--") + 1:]
        dry = "--dry-run" in head
        head = [h for h in head if h != "--dry-run"]
        if len(head) == 2:
            return study_allocation(head[0], head[1], make_args, dry_run=dry)
    raise SystemExit("usage: python -m runners.slurm uses-slurm PARAMS_DIR | "
                     "python -m runners.slurm study PARAMS_DIR OUT [--dry-run] -- MAKE_ARGS...")


def _job_info(job_id: str) -> dict | None:
    """``scontrol show job -o`` as a dict, or None when the controller no longer knows the job."""
    proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return None
        raise RuntimeError(f"scontrol show job {job_id} failed: {proc.stderr.strip()}")
    return dict(kv.split("=", 1) for kv in proc.stdout.split() if "=" in kv)


def _exit_status(exit_code: str | None) -> int | None:
    """SLURM's ``ExitCode=status:signal`` as one number (128 + signal when killed)."""
    if not exit_code or ":" not in exit_code:
        return None
    status, sig = (int(x) for x in exit_code.split(":", 1))
    return 128 + sig if sig else status


def _scontrol(args: list[str]) -> str:
    proc = subprocess.run(["scontrol", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"scontrol {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def _shell_join(argv: list[str]) -> str:
    """Quote ``argv`` for bash. Only the rendezvous arguments kanlib itself writes with ``$HEAD_ADDR``,
    ``$PORT`` and ``$SLURM_JOB_ID`` are double-quoted (expanded in the job); every other value, a user's
    ``$`` included, is single-quoted and reaches the program literally."""
    expand = {f"--rdzv-endpoint={_RDZV_ENDPOINT}", f"--rdzv-id={_RDZV_ID}"}
    parts = [f'"{a}"' if a in expand else shlex.quote(a) for a in argv]
    line, width, lines = "", 0, []
    for p in parts:  # wrap at ~90 columns with backslashes, for a readable script
        if line and width + len(p) + 1 > 90:
            lines.append(line)
            line, width = "    " + p, 4 + len(p)
        else:
            line = f"{line} {p}" if line else p
            width += len(p) + 1
    lines.append(line)
    return " \\\n".join(lines)


def _render(template: str, values: dict[str, str]) -> str:
    """Replace ``{{name}}`` placeholders; a missing or unused value is an error; empty lines left by empty
    optional blocks are dropped."""
    names = set(re.findall(r"\{\{(\w+)\}\}", template))
    if names - values.keys():
        raise KeyError(f"{TEMPLATE}: no value for {sorted(names - values.keys())}")
    if values.keys() - names:
        raise KeyError(f"{TEMPLATE}: placeholders {sorted(values.keys() - names)} missing")
    out = []
    for line in template.splitlines():
        if re.fullmatch(r"\{\{\w+\}\}", line.strip()) and not values[line.strip()[2:-2]]:
            continue
        out.append(re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], line))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
