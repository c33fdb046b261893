"""Pure pieces shared by every launcher: the torchrun command line, the run's environment, and the check
that this machine can run a config at all. No process is started here.

A config is any :class:`kanlib.config.Config` (a training run's RunConfig, a collective benchmark's
BenchConfig): torchrun runs ``python -m <type(cfg).ENTRY> --key=value ...``.
"""

from __future__ import annotations

import os
import sys
import uuid

from kanlib.config import Config, ConfigError

SHUTDOWN_GRACE_S = 15  # SIGTERM to SIGKILL, for torchrun's workers (a preempted run checkpoints)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def available_cpus() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def uses_cuda(cfg: Config) -> bool:
    return cfg.device == "cuda" or (cfg.device == "auto" and visible_gpus() > 0)


def check_environment(cfg: Config, launcher: str = "local") -> None:
    """Refuse, before any process starts, a config this machine cannot run (names the field).

    ``local`` and ``multinode`` put every process of the run on this host (nnodes torchruns for
    multinode), so all ``world_size`` processes need a GPU each (CUDA) or a core each (CPU; shared cores
    would make the timings meaningless). ``slurm`` runs elsewhere: only what the submit host can know.
    """
    wants_cuda = cfg.device == "cuda" or cfg.backend == "nccl"
    if launcher == "slurm":
        return
    gpus = visible_gpus()
    if wants_cuda and not gpus:
        field = "device" if cfg.device == "cuda" else "backend"
        raise ConfigError(f"{field}: {getattr(cfg, field)!r} needs CUDA, but no GPU is visible here")
    here = cfg.world_size if launcher == "multinode" else cfg.nproc_per_node
    what = (f"{cfg.nnodes} x {cfg.nproc_per_node} processes on this host" if launcher == "multinode"
            else f"{cfg.nproc_per_node} processes per node")
    if uses_cuda(cfg):
        if here > gpus:
            raise ConfigError(f"nproc_per_node: {what} but only {gpus} CUDA devices are visible "
                              f"(one GPU per process)")
        import torch

        check_memory(cfg, 1, torch.cuda.get_device_properties(0).total_memory, "is the GPU's memory")
    else:
        if here > available_cpus():
            raise ConfigError(f"nproc_per_node: {what} on CPU but only {available_cpus()} CPU cores are "
                              f"available to this process (the processes would share cores and the timings "
                              f"would mean nothing)")
        threads = getattr(cfg, "threads", 1)
        if here * threads > available_cpus():
            raise ConfigError(f"threads: {what} x threads={threads} = {here * threads} threads on CPU but only "
                              f"{available_cpus()} CPU cores are available to this process (a process would run "
                              f"unpinned on cores another one uses, and the timings would mean nothing)")
        check_memory(cfg, here, _available_memory_bytes(), "of memory is available on this host")
        for name in ("nccl_algo", "nccl_proto"):
            if getattr(cfg, name, ""):
                raise ConfigError(f"{name}: {getattr(cfg, name)!r} is an NCCL setting, but this run uses gloo "
                                  f"on CPU (no GPU here), which would ignore it")


def check_memory(cfg: Config, processes: int, available: int | None, where: str) -> None:
    """Refuse a training config whose estimated memory (:func:`kanlib.metrics.estimate_memory_bytes`, per process,
    times the ``processes`` sharing ``available`` bytes) does not fit, naming the field that needs the most, before
    torch's allocator fails mid-run with a byte count and no field (issue 23)."""
    if available is None or not hasattr(cfg, "widths"):
        return
    from kanlib.metrics import estimate_memory_bytes

    parts = estimate_memory_bytes(cfg)
    need = sum(parts.values()) * processes
    if need <= available:
        return
    field = max(parts, key=parts.get)
    gib = 2**30
    detail = ", ".join(f"{k} {v / gib:.3g} GiB" for k, v in parts.items())
    raise ConfigError(f"{field}: the run needs at least {need / gib:.3g} GiB ({processes} process(es) x ({detail})) "
                      f"but only {available / gib:.3g} GiB {where}; make {field} smaller")


def _available_memory_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo (bytes), or None where the OS does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_timeout(timeout_s) -> None:
    """Refuse a run deadline that is not a positive, finite number of seconds (None: no deadline); 0 or -1 gave
    an instant timeout row for every run (issue 23)."""
    if timeout_s is None:
        return
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < float("inf"):
        raise ConfigError(f"timeout_s: a run's deadline must be a positive number of seconds (or None for no "
                          f"deadline), got {timeout_s!r}")


def torchrun_command(cfg: Config, *, python: str = sys.executable, standalone: bool = True,
                     rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
                     max_restarts: int = 0, entry: list[str] | None = None,
                     program: list[str] | None = None, log_dir: str | None = None) -> list[str]:
    """The torchrun command line of one run, or of a worker group (one torchrun per node).

    The workers run ``program`` (e.g. ``["-m", "kanlib.worker", "--plan=PATH"]``) when given, else
    ``entry`` (default ``-m <type(cfg).ENTRY>``) with the config as ``--key=value`` arguments.

    ``standalone`` runs a single-node job with a private c10d rendezvous on the loopback address:
    ``rdzv_endpoint`` defaults to ``127.0.0.1:0`` (the store binds a port the OS picks, so a busy port
    cannot collide; a fixed port that is taken would make torchrun wait as a client of whatever holds it)
    and ``rdzv_id`` to a fresh uuid. Otherwise a c10d rendezvous at ``rdzv_endpoint`` (``host:port``) with
    id ``rdzv_id`` joins ``cfg.nnodes`` torchrun invocations.

    ``log_dir``: torchrun's own folder (a subfolder per launch attempt and rank holding the ranks' ``error.json``);
    default :func:`torchrun_log_dir`, beside the launch's log. Left to torchrun it is a new
    ``/tmp/torchelastic_*`` per launch that nothing removes (a default study left 17 of them).
    """
    cmd = [python, "-m", "torch.distributed.run"]
    if standalone:
        if cfg.nnodes != 1:
            raise ConfigError(f"nnodes: a standalone (local) launch has one node, got {cfg.nnodes}")
        rdzv_endpoint = rdzv_endpoint or "127.0.0.1:0"  # port 0: the store binds a free port itself
        rdzv_id = rdzv_id or uuid.uuid4().hex
        cmd += ["--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}"]
    else:
        if not rdzv_endpoint or not rdzv_id:
            raise ValueError("a multi-node launch needs rdzv_endpoint (host:port) and rdzv_id")
        cmd += [f"--nnodes={cfg.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                f"--rdzv-id={rdzv_id}"]
    cmd += [f"--nproc-per-node={cfg.nproc_per_node}", f"--max-restarts={max_restarts}",
            f"--log-dir={log_dir or torchrun_log_dir(cfg, program)}"]
    cmd += list(program) if program else (entry or ["-m", type(cfg).ENTRY]) + cfg.to_cli()
    return cmd


def torchrun_log_dir(cfg: Config, program: list[str] | None = None) -> str:
    """Where torchrun keeps its per-attempt, per-rank folders: ``torchrun/`` beside a worker group's plan (the
    launch's folder) when ``program`` runs one, else in the run's folder; both on the shared file system on a
    cluster, and torchrun makes a uniquely named subfolder per node and attempt inside it."""
    for arg in program or ():
        if arg.startswith("--plan="):
            return os.path.join(os.path.dirname(os.path.abspath(arg[len("--plan="):])), "torchrun")
    return os.path.join(cfg.run_dir(), "torchrun")


def worker_program(plan_path: str) -> list[str]:
    """What the processes of a worker group run: ``python -m kanlib.worker --plan=<plan>``."""
    return ["-m", "kanlib.worker", f"--plan={plan_path}"]


def compile_cache_dir(cfg: Config | None = None) -> str:
    """Where inductor keeps compiled kernels between processes, so that only the first run of a shape
    compiles (about 20 s here; a later process loads them in about 1-3 s): ``$KANLIB_COMPILE_CACHE``, else
    ``$XDG_CACHE_HOME/kanlib/inductor`` (``~/.cache/kanlib/inductor``), which outlives a sweep, a reboot and
    ``/tmp`` cleaning, and on clusters is usually a shared home directory."""
    explicit = os.environ.get("KANLIB_COMPILE_CACHE")
    if explicit:
        return os.path.abspath(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kanlib", "inductor")


def launch_env(cfg: Config, launcher: str = "local", base: dict | None = None) -> dict:
    """The environment of a launched run: one OpenMP pool of ``cfg.threads`` per process, the compile cache,
    loopback-only gloo sockets for runs on this host, and this checkout on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    env["OMP_NUM_THREADS"] = str(cfg.threads)
    env["KANLIB_LAUNCHER"] = launcher
    env.setdefault("PYTHONUNBUFFERED", "1")
    # Restarts under gloo fail to reconnect when workers share torchrun's rendezvous store
    # ("Gloo connectFullMesh failed"); a separate store per attempt works (docs/faults.md).
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    # The runner holds each run folder's lock while the launch runs it (kanlib.manifest.RunLock); a run
    # started by hand takes it itself (kanlib.train_cli.main).
    env["KANLIB_RUNNER_LOCKS"] = "1"
    # How long torchrun waits for workers to checkpoint after SIGTERM before it kills them.
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_GRACE_S))
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", compile_cache_dir(cfg))
    if launcher in ("local", "multinode") and sys.platform.startswith("linux"):
        # Every process is on this host: gloo's data connections bind the loopback interface only.
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # The launched processes import kanlib from this checkout even when it is not installed.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    return env
