"""A worker group: one launch whose processes run many runs one after another.

``python -m kanlib.worker --plan=PATH`` is the torchrun entry point of a worker group (one torchrun; N
torchruns joined by one rendezvous for ``NxP``; one ``srun`` step on a cluster). The plan (written by
:mod:`runners.group`, read by every rank from the shared run folder) lists the runs of one placement;
the group sets up its process group once, then hands each run to :func:`kanlib.train.train` (or
:func:`kanlib.collbench.run_bench`) with that process group. Each run builds its own model, optimizer, data,
seeds, DDP/FSDP wrapper and hooks from its own config and writes its own folder, as a run in a process of its
own does (a test checks the losses are the same to the bit); what it shares is the process group, the
imported modules and the kernels torch.compile traced for earlier runs of the same shapes.

Faults stay contained: a run that raises ends the processes (torchrun tears the group down), and the
runner starts a fresh group for the runs after it. SIGTERM stops the run in flight at a step boundary
(checkpoint, ``preempted.json``) and the group after it. The runner learns where the group is from
``events.jsonl`` (rank 0 appends ``begin`` and ``end`` for each run) and from the lines
``kanlib: run <key> begins`` / ``ends`` in the launch log, which it cuts into each run's ``launch.log``.

Every run of a plan must agree on what the processes share (:data:`kanlib.config.GROUP_FIELDS`: placement,
backend, device, threads, CPU pinning, collective timeout, NCCL settings); the runner groups runs that way.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

from kanlib.metrics import process_start_time

_PROCESS_START = process_start_time()

import torch  # noqa: E402

from kanlib import distributed, faults, manifest, records  # noqa: E402
from kanlib.config import GROUP_FIELDS, ConfigError, RunConfig, group_key  # noqa: E402

PLAN_NAME = "plan.json"
CLOSE_NAME = "close"
WAIT_POLL_S = 0.05  # how often a waiting group looks for the next part of its plan
EVENTS_NAME = "events.jsonl"
BEGIN_MARK = "kanlib: run {key} begins"
END_MARK = "kanlib: run {key} ends"
# Shapes a worker group may compile per kernel: every run of a sweep can bring new ones (model sizes, per-process
# batches), and past dynamo's default limit (8) new shapes would silently run eagerly.
RECOMPILE_LIMIT = 256


def config_kinds() -> dict:
    """``kind`` of a plan entry -> (config class, function running it with a Group)."""
    from kanlib.collbench import BenchConfig, run_bench
    from kanlib.train import train

    return {"train": (RunConfig, train), "collbench": (BenchConfig, run_bench)}


def runs_in_worker(cfg) -> bool:
    """Whether a worker group can run ``cfg``: a training run or a collective benchmark (a Config subclass with
    an entry point of its own runs alone, as ``python -m <ENTRY> --key=value``)."""
    from kanlib.collbench import BenchConfig

    return type(cfg) in (RunConfig, BenchConfig)


def kind_of(cfg) -> str:
    """The plan's name for the kind of ``cfg``."""
    return "collbench" if type(cfg).__name__ == "BenchConfig" else "train"


def write_plan(path: str, launch_id: str, configs: list, keep_open: bool = False) -> None:
    """Write the plan of a launch: its id and the configs it runs, in order (all of one group key).

    ``keep_open``: when the group has run them, it waits (holding no CPU, polling the launch folder) for the
    next part of its plan, ``plan-<k>.json`` written by :func:`write_chunk`, or for ``close``: one group then
    serves its placement for every round of a sweep."""
    keys = {group_key(c) for c in configs}
    if len(keys) != 1:
        raise ConfigError(f"a worker group runs configs that agree on {', '.join(GROUP_FIELDS)}; got {len(keys)} "
                          f"different groups")
    records.atomic_write_json(path, {"launch_id": launch_id, "open": bool(keep_open), "runs": [
        {"kind": kind_of(c), "run_key": c.run_key(), "config": c.to_dict()} for c in configs]})


def chunk_path(plan_path: str, k: int) -> str:
    """Part ``k`` of a launch's plan: ``plan.json`` for 0, ``plan-<k>.json`` after it."""
    return plan_path if k == 0 else os.path.join(os.path.dirname(os.path.abspath(plan_path)), f"plan-{k}.json")


def write_chunk(plan_path: str, k: int, launch_id: str, configs: list) -> str:
    """Hand a waiting group (``keep_open``) part ``k`` of its plan; returns its path."""
    path = chunk_path(plan_path, k)
    write_plan(path, launch_id, configs, keep_open=True)
    return path


def close_plan(plan_path: str) -> None:
    """Tell a waiting group that its plan has no further part: it leaves."""
    records.atomic_write_json(os.path.join(os.path.dirname(os.path.abspath(plan_path)), CLOSE_NAME), {"at": time.time()})


def latest_chunk(plan_path: str) -> int:
    """The highest part of the plan written so far (where a restarted group carries on)."""
    k = 0
    while os.path.exists(chunk_path(plan_path, k + 1)):
        k += 1
    return k


def plan_is_open(path: str) -> bool:
    try:
        with open(path) as f:
            return bool(json.load(f).get("open", False))
    except (OSError, ValueError, AttributeError):
        return False


def read_plan(path: str) -> tuple[str, list]:
    """``(launch_id, configs)`` of a plan file; raises ConfigError naming the file on anything unreadable."""
    try:
        with open(path) as f:
            plan = json.load(f)
        kinds = config_kinds()
        configs = [kinds[e["kind"]][0](**e["config"]) for e in plan["runs"]]
        launch_id = str(plan["launch_id"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"plan: cannot read {path}: {type(e).__name__}: {e}") from e
    if not configs:
        raise ConfigError(f"plan: {path} lists no run")
    if len({group_key(c) for c in configs}) != 1:
        raise ConfigError(f"plan: {path} mixes runs that disagree on {', '.join(GROUP_FIELDS)}")
    return launch_id, configs


def event(path: str, **fields) -> None:
    """Append one event line (rank 0) and make it durable: the runner polls this file."""
    manifest.append_event(path, {"at": time.time(), **fields})


def finished_runs(path: str, chunk: int = 0) -> set[str]:
    """Run keys the events file says ended in part ``chunk`` of the plan (a torchrun restart of the same launch
    skips them)."""
    done = set()
    for e in manifest.read_events(path):
        if e.get("event") == "end" and int(e.get("chunk", 0)) == chunk:
            done.add(e.get("run_key"))
    return done


def _first_to_run(events: str, configs: list, info: distributed.DistInfo, chunk: int = 0) -> int:
    """Index of the first run this launch has not finished (rank 0 decides from the events, for all)."""
    first = 0
    if info.is_main:
        done = finished_runs(events, chunk)
        while first < len(configs) and configs[first].run_key() in done:
            first += 1
    return int(distributed.broadcast(torch.tensor([first], dtype=torch.int64), info).item())


def _any_rank(group: distributed.Group, flag: bool) -> bool:
    """Whether ``flag`` is set on any rank (one small collective between runs; every rank calls it)."""
    t = torch.tensor([1.0 if flag else 0.0])
    return bool(distributed.all_reduce(t, group.info, "max").item() > 0)


def _prepare_process(configs: list) -> None:
    """Once per process: inductor's set-up (when a run uses compiled kernels) and a recompile limit that
    lets every run of the group compile its own shapes."""
    import torch._dynamo

    cfg = configs[0]
    if any(getattr(c, "kan_impl", "") == "compiled" and getattr(c, "model", "") == "kan" for c in configs):
        from kanlib.compiling import prepare_compile

        prepare_compile(distributed.resolve_device(cfg.device))
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), RECOMPILE_LIMIT))


def _nccl_debug(configs: list, plan_dir: str, rank: int) -> None:
    """A collective-benchmark group on NCCL logs NCCL's tuning choices (kanlib.collbench reads them): NCCL reads
    its debug settings once, when the process group starts, so the group's file is set here."""
    if kind_of(configs[0]) != "collbench" or "RANK" not in os.environ:
        return
    cfg = configs[0]
    device = distributed.resolve_device(cfg.device)
    if distributed.resolve_backend(cfg.backend, device) == "nccl":
        from kanlib.collbench import nccl_debug_env

        os.environ.update(nccl_debug_env(plan_dir, rank))


def run_plan(plan_path: str) -> int:
    """Run every run of the plan this launch has not finished, in order (and, for an open plan, every later part
    of it until the runner closes it); returns the exit code."""
    chunk = latest_chunk(plan_path)  # a torchrun restart carries on with the part in flight
    launch_id, configs = read_plan(chunk_path(plan_path, chunk))
    keep_open = plan_is_open(plan_path)
    plan_dir = os.path.dirname(os.path.abspath(plan_path))
    events = os.path.join(plan_dir, EVENTS_NAME)
    kinds = config_kinds()
    _prepare_process(configs)
    _nccl_debug(configs, plan_dir, int(os.environ.get("RANK", "0")))
    ran = 0  # runs this process began
    with distributed.own_group(configs[0]) as group:
        group.launch_id = launch_id
        info = group.info
        gc.freeze()  # the process's long-lived objects (torch, dynamo): no run's gc.collect walks them again
        while True:
            stopped = False
            first = _first_to_run(events, configs, info, chunk)
            for i in range(first, len(configs)):
                cfg, key = configs[i], configs[i].run_key()
                if _any_rank(group, group.stop.requested):
                    stopped = True
                    break  # SIGTERM between runs: the rest is left for a later launch
                if ran:  # between two runs of this process (a fresh launch starts its first run undisturbed)
                    faults.between_runs(faults.active(key), info.rank)
                group.runs_before = ran
                group.started_at = _PROCESS_START if not ran else time.time()
                ran += 1
                if info.is_main:
                    event(events, event="begin", run_key=key, index=i, chunk=chunk)
                if info.local_rank == 0:
                    print(BEGIN_MARK.format(key=key), flush=True)
                rec = kinds[kind_of(cfg)][1](cfg, group)
                # what outlived the run (its garbage collected as it ended) is the group's own state, e.g. the
                # kernels traced for its shapes: frozen too, so the next run's collection walks only its own
                # objects (a full collection of a process holding dynamo's caches took about 0.2 s a run)
                gc.freeze()
                preempted = info.is_main and rec is None and os.path.exists(
                    os.path.join(cfg.run_dir(), records.PREEMPTED_NAME))
                if info.local_rank == 0:
                    print(END_MARK.format(key=key), flush=True)
                if info.is_main:
                    event(events, event="end", run_key=key, index=i, chunk=chunk,
                          status="preempted" if preempted else "ok")
                if _any_rank(group, preempted):  # also keeps the ranks together between runs
                    stopped = True
                    break
            if stopped or not keep_open:
                break
            nxt = _wait_for_chunk(plan_path, chunk + 1, group, group_key(configs[0]))
            if _any_rank(group, nxt is None):  # closed (or stopped) on any rank: every rank leaves
                break
            chunk, configs = chunk + 1, nxt
    return 0


def _wait_for_chunk(plan_path: str, k: int, group: distributed.Group, key: tuple) -> list | None:
    """Wait, holding no CPU, for part ``k`` of the plan; its configs, or None when the runner closed the plan or
    the group was asked to stop. The CPUs are claimed again for the new part."""
    distributed.unpin_cpus()
    path, close = chunk_path(plan_path, k), os.path.join(os.path.dirname(os.path.abspath(plan_path)), CLOSE_NAME)
    while not os.path.exists(path):
        if os.path.exists(close) or group.stop.requested:
            return None
        time.sleep(WAIT_POLL_S)
    _, configs = read_plan(path)
    if group_key(configs[0]) != key:
        raise ConfigError(f"plan: {path} hands this group runs of another placement or set-up "
                          f"(they must agree on {', '.join(GROUP_FIELDS)})")
    distributed.repin_cpus(configs[0], distributed.resolve_device(configs[0].device))
    return configs


def main(argv: list[str] | None = None) -> int:
    distributed.die_with_launcher()
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not argv[0].startswith("--plan="):
        raise SystemExit("usage: python -m kanlib.worker --plan=PATH (under torchrun; the runner writes PATH)")
    return run_plan(argv[0].split("=", 1)[1])


if __name__ == "__main__":
    code = main()
    # as kanlib.train: every file is written and the process group destroyed; leave without C++ static
    # destructors, where gloo's background threads now and then abort the exit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
