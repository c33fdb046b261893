"""Several torchrun invocations joined by one c10d rendezvous, without a scheduler.

A multi-node job is ``cfg.nnodes`` torchrun invocations (one per node) that meet at a rendezvous endpoint
``host:port``; the first to bind it hosts the store, the others join. :func:`node_command` is the command
every node runs (the same on each); :class:`MultiNodeJob` starts all ``cfg.nnodes`` of them on this
machine, as separate process groups, which exercises the same rendezvous as real nodes (``--nnodes`` > 1,
c10d, no ``--standalone``). On a cluster without SLURM, run :func:`node_command` on each host with the
first host's address.

On one GPU host each torchrun numbers its workers from LOCAL_RANK 0, so every "node" gets its own slice of
the visible GPUs through ``CUDA_VISIBLE_DEVICES`` (node i: devices i*P .. i*P+P-1); the launcher refuses
nnodes x nproc_per_node above the GPU count (runners.command.check_environment).

Pitfall this avoids: ``--standalone`` (or a private rendezvous per node) makes each node its own world of
``nproc_per_node`` processes; the entry point then refuses to start because WORLD_SIZE does not match.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid

from runners.command import launch_env, torchrun_command, uses_cuda, visible_gpus, worker_program
from runners.local import events_of, start_torchrun
from runners.supervisor import Job, end_process_tree


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS's pick), for a rendezvous endpoint."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def node_command(cfg, *, rdzv_endpoint: str, rdzv_id: str, python: str = sys.executable, max_restarts: int = 0,
                 program: list[str] | None = None) -> list[str]:
    """The torchrun command each of the ``cfg.nnodes`` nodes runs (identical on every node)."""
    return torchrun_command(cfg, python=python, standalone=False, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id,
                            max_restarts=max_restarts, program=program)


def node_devices(node: int, nproc_per_node: int, visible: str | None, n_gpus: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for "node" ``node`` on one host: its ``nproc_per_node`` devices of those visible."""
    ids = [d.strip() for d in visible.split(",")] if visible else [str(i) for i in range(n_gpus)]
    mine = ids[node * nproc_per_node:(node + 1) * nproc_per_node]
    if len(mine) < nproc_per_node:
        raise RuntimeError(f"node {node} needs {nproc_per_node} GPUs, only {len(ids)} are visible")
    return ",".join(mine)


class MultiNodeJob(Job):
    """``cfg.nnodes`` torchruns on this machine joined by one c10d rendezvous; node i logs to
    ``<run_dir>/launch-node<i>.log``. When one node fails, the others are stopped (they would wait for it
    until the collective timeout)."""

    launcher = "multinode"

    def __init__(self, cfg, *, rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
                 python: str = sys.executable, max_restarts: int = 0, plan: str | None = None):
        self.cfg, self.python, self.max_restarts, self.plan = cfg, python, max_restarts, plan
        self.endpoint = rdzv_endpoint or f"127.0.0.1:{free_port()}"
        self.rdzv_id = rdzv_id or uuid.uuid4().hex[:12]
        where = os.path.dirname(plan) if plan else cfg.run_dir()
        self.logs = [os.path.join(where, f"launch-node{i}.log") for i in range(cfg.nnodes)]
        self.procs = []

    def events_path(self) -> str | None:
        return events_of(self.plan)

    def start(self) -> None:
        self.procs = []
        cmd = node_command(self.cfg, rdzv_endpoint=self.endpoint, rdzv_id=self.rdzv_id, python=self.python,
                           max_restarts=self.max_restarts, program=worker_program(self.plan) if self.plan else None)
        base = launch_env(self.cfg, "multinode")
        gpus = visible_gpus() if uses_cuda(self.cfg) else 0
        for i, log in enumerate(self.logs):
            env = dict(base)
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = node_devices(i, self.cfg.nproc_per_node,
                                                           base.get("CUDA_VISIBLE_DEVICES"), gpus)
            self.procs.append(start_torchrun(cmd, env, log))

    def poll(self) -> int | None:
        codes = [p.poll() for p in self.procs]
        failed = next((c for c in codes if c not in (None, 0)), None)
        if failed is not None:
            self.cancel(10.0)  # the other nodes would wait for the failed one
            return failed
        return 0 if all(c == 0 for c in codes) else None

    def cancel(self, grace_s: float) -> None:
        for p in self.procs:
            if p.poll() is None:
                end_process_tree(p, grace_s)

    def log_paths(self) -> list[str]:
        return self.logs

    def log_prefix(self, index: int) -> str:
        return f"[node {index}] "

    def describe(self) -> str:
        return f"{self.cfg.nnodes} nodes x {self.cfg.nproc_per_node}, rendezvous {self.endpoint}"
