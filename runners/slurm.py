"""Run a config on a SLURM cluster: one torchrun per node under srun, c10d rendezvous on the head node.

- :func:`sbatch_script` renders ``runners/slurm/train.sbatch.tmpl`` for one config and a site's
  settings (partition, account, GPUs, time limit, modules, environment) - a pure function.
- :func:`run_slurm` writes that script into the run's folder, submits it with ``sbatch``, follows
  the job with ``scontrol show job`` while streaming its log, and returns the run's record, or
  raises :class:`runners.launch.RunFailed` with the tail of the SLURM log.
- :func:`srun_command` is the ``srun ... torchrun ...`` line for use inside an allocation you
  already hold (``salloc``, an interactive job, your own batch script).

``runners.launch.run(cfg, launcher="slurm", launcher_opts={...})`` calls :func:`run_slurm` with
``launcher_opts`` as keyword arguments. The record says ``launcher == "slurm"`` and carries the job
id and node list (``slurm_job_id``, ``slurm_nodelist``). See docs/cluster.md.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time

from kanlib.config import ConfigError, RunConfig
from runners.launch import RunFailed, read_record, torchrun_command

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slurm", "train.sbatch.tmpl")
SCRIPT_NAME = "train.sbatch"
RDZV_BASE_PORT = 29500
# Job states after which a job never runs again (scontrol's JobState).
TERMINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rdzv_port(job_id: int | str) -> int:
    """The rendezvous port of a job: ``29500 + job_id % 1000``, so concurrent jobs differ."""
    return RDZV_BASE_PORT + int(job_id) % 1000


def head_address(nodelist: str | None = None) -> str:
    """Address of the first node of ``nodelist`` (default ``$SLURM_JOB_NODELIST``).

    Its ``NodeAddr`` from ``scontrol show node`` (which differs from the node name on clusters
    whose node names do not resolve, and on test nodes sharing one host), else the name.
    """
    nodelist = nodelist or os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise RuntimeError("SLURM_JOB_NODELIST is not set: not inside a SLURM allocation")
    names = _scontrol(["show", "hostnames", nodelist]).split()
    if not names:
        raise RuntimeError(f"scontrol show hostnames {nodelist!r} returned no host")
    m = re.search(r"\bNodeAddr=(\S+)", _scontrol(["show", "node", names[0]]))
    return m.group(1) if m else names[0]


def srun_command(cfg: RunConfig, *, python: str = sys.executable, rdzv_endpoint: str | None = None,
                 rdzv_id: str | None = None, srun_args: tuple[str, ...] | list[str] = ()) -> list[str]:
    """``srun`` starting one torchrun per node of the current allocation, for ``cfg``.

    ``rdzv_endpoint`` (``host:port``) and ``rdzv_id`` default to the head node's address and a
    port and id derived from ``$SLURM_JOB_ID`` (so outside an allocation pass them explicitly).
    ``--kill-on-bad-exit=1`` ends every node's torchrun when one fails, instead of leaving the
    others waiting in a collective.
    """
    if rdzv_endpoint is None or rdzv_id is None:
        job = os.environ.get("SLURM_JOB_ID")
        if not job:
            raise RuntimeError("SLURM_JOB_ID is not set: pass rdzv_endpoint and rdzv_id, or run "
                               "inside a SLURM allocation")
        rdzv_endpoint = rdzv_endpoint or f"{head_address()}:{rdzv_port(job)}"
        rdzv_id = rdzv_id or job
    return (["srun", "--kill-on-bad-exit=1", f"--nodes={cfg.nnodes}", "--ntasks-per-node=1",
             *srun_args]
            + torchrun_command(cfg, python=python, standalone=False, rdzv_endpoint=rdzv_endpoint,
                               rdzv_id=rdzv_id))


def sbatch_script(cfg: RunConfig, *, partition: str | None = None, account: str | None = None,
                  gpus_per_node: int = 0, time_limit: str = "00:30:00",
                  modules: tuple[str, ...] | list[str] = (), env: dict | None = None,
                  python: str = sys.executable, job_name: str | None = None,
                  cpus_per_task: int | None = None, log_path: str | None = None,
                  sbatch_options: tuple[str, ...] | list[str] = ()) -> str:
    """The sbatch script of one run of ``cfg`` (rendered from ``runners/slurm/train.sbatch.tmpl``).

    Site settings: ``partition``, ``account``, ``gpus_per_node`` (0: no ``--gpus-per-node``),
    ``time_limit`` (``[D-]HH:MM:SS``), ``modules`` (each ``module load``-ed), ``env`` (exported,
    e.g. ``{"NCCL_SOCKET_IFNAME": "ib0"}``), ``python`` (the interpreter on the compute nodes),
    ``cpus_per_task`` (default ``nproc_per_node * threads``), ``sbatch_options`` (extra
    ``#SBATCH`` lines, e.g. ``"--exclusive"``). The log goes to ``<run_dir>/slurm-<jobid>.log``.
    The job runs in the current directory (``--chdir``), so a relative ``cfg.out_dir`` names the
    same folder for the job and for :func:`run_slurm` reading the record back.
    """
    if gpus_per_node < 0:
        raise ConfigError(f"gpus_per_node: must be >= 0, got {gpus_per_node!r}")
    if gpus_per_node and cfg.nproc_per_node > gpus_per_node:
        raise ConfigError(f"nproc_per_node: {cfg.nproc_per_node} processes per node but "
                          f"gpus_per_node={gpus_per_node}")
    if not re.fullmatch(r"(\d+-)?\d+(:\d\d){0,2}", time_limit):
        raise ConfigError(f"time_limit: expected [D-]HH:MM:SS, got {time_limit!r}")
    run_dir = os.path.abspath(cfg.run_dir())
    workdir = os.getcwd()
    env = dict(env or {})
    for key in env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigError(f"env: {key!r} is not a valid environment variable name")
    options = [f"--gpus-per-node={gpus_per_node}"] if gpus_per_node else []
    options += [f"--partition={partition}"] if partition else []
    options += [f"--account={account}"] if account else []
    options += list(sbatch_options)
    srun = srun_command(cfg, python=python, rdzv_endpoint="$HEAD_ADDR:$PORT", rdzv_id="$SLURM_JOB_ID")
    values = {
        "run_key": cfg.run_key(),
        "job_name": job_name or f"kanlib-{cfg.study}-{cfg.model}-{cfg.nnodes}x{cfg.nproc_per_node}",
        "nnodes": str(cfg.nnodes),
        "nproc_per_node": str(cfg.nproc_per_node),
        "cpus_per_task": str(cpus_per_task or cfg.nproc_per_node * cfg.threads),
        "time_limit": time_limit,
        "log_path": os.path.join(run_dir, "slurm-%j.log"),
        "workdir": workdir,
        "sbatch_options": "\n".join(f"#SBATCH {o}" for o in options),
        "module_lines": "\n".join(f"module load {shlex.quote(m)}" for m in modules),
        "pythonpath": shlex.quote(_ROOT),
        "threads": str(cfg.threads),
        "env_lines": "\n".join(f"export {k}={shlex.quote(str(v))}" for k, v in sorted(env.items())),
        "srun_line": _shell_join(srun),
    }
    if log_path:
        values["log_path"] = log_path
    with open(TEMPLATE) as f:
        template = f.read()
    return _render(template, values)


def run_slurm(cfg: RunConfig, *, timeout_s: float | None = None, echo=None, dry_run: bool = False,
              partition: str | None = None, account: str | None = None, gpus_per_node: int = 0,
              time_limit: str = "00:30:00", modules: tuple[str, ...] | list[str] = (),
              env: dict | None = None, python: str = sys.executable,
              sbatch_args: tuple[str, ...] | list[str] = (), poll_s: float = 0.5,
              **script_opts) -> dict | None:
    """Submit ``cfg`` as one SLURM job and return its record.

    The script (see :func:`sbatch_script`; extra ``script_opts`` go to it) is written to
    ``<run_dir>/train.sbatch`` and submitted with ``sbatch --parsable <sbatch_args>``; the job is
    followed every ``poll_s`` seconds with ``scontrol show job`` and its log streamed to ``echo``
    (default stdout; False: quiet). Past ``timeout_s`` the job is cancelled. When the job does not
    end COMPLETED with a new record, raises :class:`RunFailed` naming the job, its state and exit
    code, with the tail of ``<run_dir>/slurm-<jobid>.log`` (``returncode``, ``log_tail``,
    ``run_dir``, and ``job_id`` attributes). ``dry_run`` prints the script and the sbatch command
    to ``echo`` and returns None without writing or submitting anything.
    """
    out = sys.stdout if echo is None else echo
    script = sbatch_script(cfg, partition=partition, account=account, gpus_per_node=gpus_per_node,
                           time_limit=time_limit, modules=modules, env=env, python=python,
                           **script_opts)
    run_dir = os.path.abspath(cfg.run_dir())
    script_path = os.path.join(run_dir, SCRIPT_NAME)
    cmd = ["sbatch", "--parsable", *sbatch_args, script_path]
    if dry_run:
        stream = out or sys.stdout
        stream.write(f"# {script_path}\n{script}\n$ {shlex.join(cmd)}\n")
        return None
    os.makedirs(run_dir, exist_ok=True)
    with open(script_path, "w") as f:
        f.write(script)
    before = read_record(cfg)
    submitted = subprocess.run(cmd, capture_output=True, text=True)
    if submitted.returncode != 0:
        raise RunFailed(f"sbatch refused run {cfg.run_key()} (exit {submitted.returncode}): "
                        f"{submitted.stderr.strip() or submitted.stdout.strip()}\n$ {shlex.join(cmd)}",
                        returncode=submitted.returncode, log_tail=submitted.stderr, run_dir=run_dir)
    job_id = submitted.stdout.strip().split(";")[0]
    log_path = os.path.join(run_dir, f"slurm-{job_id}.log")
    if out:
        out.write(f"kanlib: submitted {cfg.run_key()} as SLURM job {job_id} "
                  f"({cfg.nnodes} nodes x {cfg.nproc_per_node}); log {log_path}\n")
    state, exit_code, timed_out = _follow(job_id, log_path, out, timeout_s, poll_s)
    record = read_record(cfg)
    fresh = record is not None and (before is None or record.get("run_id") != before.get("run_id"))
    # state None: the controller forgot the job before a poll saw it end (short MinJobAge)
    if state in ("COMPLETED", None) and not timed_out and fresh and record.get("status") == "ok":
        return record
    tail = _tail(log_path)
    if timed_out:
        why = f"timed out after {timeout_s} s and was cancelled"
    elif state == "COMPLETED":
        why = "completed but wrote no new record"
    else:
        why = f"ended {state or 'in an unknown state'} with exit code {exit_code}"
    first = _first_error(log_path)
    why += f"; first error: {first}" if first else ""
    err = RunFailed(f"SLURM job {job_id} (run {cfg.run_key()}, {cfg.nnodes} nodes x "
                    f"{cfg.nproc_per_node}) {why}; log: {log_path}\n--- last lines ---\n{tail}",
                    returncode=None if timed_out else _exit_status(exit_code), log_tail=tail,
                    run_dir=run_dir, error=why,
                    status=("timeout" if timed_out or state == "TIMEOUT"
                            else "preempted" if state == "PREEMPTED" else "failed"))
    err.job_id = job_id
    raise err


def _follow(job_id: str, log_path: str, out, timeout_s: float | None,
            poll_s: float) -> tuple[str | None, str | None, bool]:
    """Poll the job until it ends, streaming its log; returns (state, exit code, timed out)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    offset = 0
    state = exit_code = None
    timed_out = False
    errors = 0
    try:
        while True:
            offset = _stream(log_path, offset, out)
            try:
                info = _job_info(job_id)
                errors = 0
            except RuntimeError:  # a busy controller times out now and then: retry for ~a minute
                errors += 1
                if errors * poll_s > 60:
                    raise
                time.sleep(poll_s)
                continue
            if info is None:  # the controller forgot the job: it ended more than MinJobAge ago
                break
            state, exit_code = info.get("JobState"), info.get("ExitCode")
            if state in TERMINAL_STATES:
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                _cancel(job_id)
                break
            time.sleep(poll_s)
    except BaseException:  # KeyboardInterrupt included: do not leave the job running
        _cancel(job_id)
        raise
    if timed_out:
        state, exit_code = _wait_ended(job_id, state, exit_code)
    time.sleep(0.2)  # the batch step closes its log after the job state changes
    _stream(log_path, offset, out)
    return state, exit_code, timed_out


def _wait_ended(job_id: str, state, exit_code, grace_s: float = 30.0):
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        info = _job_info(job_id)
        if info is None:
            break
        state, exit_code = info.get("JobState"), info.get("ExitCode")
        if state in TERMINAL_STATES:
            break
        time.sleep(0.5)
    return state, exit_code


def _job_info(job_id: str) -> dict | None:
    """``scontrol show job -o`` as a dict, or None when the controller no longer knows the job."""
    proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return None
        raise RuntimeError(f"scontrol show job {job_id} failed: {proc.stderr.strip()}")
    return dict(kv.split("=", 1) for kv in proc.stdout.split() if "=" in kv)


def _cancel(job_id: str) -> None:
    subprocess.run(["scancel", job_id], capture_output=True)


def _stream(path: str, offset: int, out) -> int:
    """Write what ``path`` gained since ``offset`` to ``out``; return the new offset."""
    try:
        with open(path, errors="replace") as f:
            f.seek(offset)
            chunk = f.read()
            offset = f.tell()
    except FileNotFoundError:
        return offset
    if chunk and out:
        out.write(chunk)
    return offset


def _tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except FileNotFoundError:
        return f"(no log at {path}: the job never started?)"


def _first_error(path: str) -> str | None:
    """The first Python exception line of the log that is not torchrun's own report: usually
    the cause, which torchrun's long ChildFailedError summary pushes out of the tail."""
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if (re.match(r"[A-Za-z_][\w.]*(Error|Exception|Interrupt): ", line)
                        and "ChildFailedError" not in line):
                    return line.strip()
    except FileNotFoundError:
        pass
    return None


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
    """Quote ``argv`` for bash, but leave ``$VAR`` references (rendezvous) to be expanded."""
    parts = []
    for a in argv:
        if "$" in a and re.fullmatch(r"[\w\-=.:/$]+", a):
            parts.append(f'"{a}"')
        else:
            parts.append(shlex.quote(a))
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
    """Replace ``{{name}}`` placeholders; a missing or unused value is an error; empty lines
    left by empty optional blocks are dropped."""
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
