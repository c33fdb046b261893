"""Several torchrun invocations joined by one c10d rendezvous, without a scheduler.

A multi-node job is ``cfg.nnodes`` torchrun invocations (one per node) that meet at a
rendezvous endpoint ``host:port``; the first to bind it hosts the store, the others join.
:func:`node_command` is the command every node runs (the same on each); :func:`run_multinode`
starts all ``cfg.nnodes`` of them on this machine, as separate process groups, which exercises
the same rendezvous as real nodes (``--nnodes`` > 1, c10d, no ``--standalone``). On a cluster
without SLURM, run :func:`node_command` on each host with the first host's address.

Pitfall this avoids: ``--standalone`` (or a private rendezvous per node) makes each node its
own world of ``nproc_per_node`` processes; kanlib.train then refuses to start because WORLD_SIZE
does not match ``nnodes * nproc_per_node``.
"""

from __future__ import annotations

import collections
import os
import socket
import subprocess
import sys
import time
import uuid

from kanlib.config import RunConfig
from runners.launch import RunFailed, _kill_group, check_environment, launch_env, read_record, torchrun_command


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS's pick), for a rendezvous endpoint."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def node_command(cfg: RunConfig, *, rdzv_endpoint: str, rdzv_id: str,
                 python: str = sys.executable) -> list[str]:
    """The torchrun command each of the ``cfg.nnodes`` nodes runs (identical on every node)."""
    return torchrun_command(cfg, python=python, standalone=False, rdzv_endpoint=rdzv_endpoint,
                            rdzv_id=rdzv_id)


def run_multinode(cfg: RunConfig, *, timeout_s: float | None = None, echo=None,
                  rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
                  python: str = sys.executable) -> dict:
    """Run ``cfg`` as ``cfg.nnodes`` torchrun invocations on this machine and return its record.

    The rendezvous defaults to ``127.0.0.1:<free port>`` with a fresh id. Each node's output goes
    to ``<run_dir>/launch-node<i>.log`` (and to ``echo``, default stdout, prefixed with the node;
    False: quiet). When one node fails, or past ``timeout_s``, every node is stopped and
    :class:`RunFailed` raised with the failing node's log tail. The record says
    ``launcher == "multinode"``.
    """
    check_environment(cfg)
    out = sys.stdout if echo is None else echo
    run_dir = cfg.run_dir()
    os.makedirs(run_dir, exist_ok=True)
    endpoint = rdzv_endpoint or f"127.0.0.1:{free_port()}"
    rid = rdzv_id or uuid.uuid4().hex[:12]
    cmd = node_command(cfg, rdzv_endpoint=endpoint, rdzv_id=rid, python=python)
    env = launch_env(cfg, "multinode")
    before = read_record(cfg)
    logs = [os.path.join(run_dir, f"launch-node{i}.log") for i in range(cfg.nnodes)]
    procs, files = [], []
    for path in logs:
        f = open(path, "w")
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        files.append(f)
        procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    offsets = [0] * len(procs)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    failed, timed_out = None, False
    try:
        while True:
            _echo_new(logs, offsets, out)
            codes = [p.poll() for p in procs]
            failed = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None or all(c == 0 for c in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.1)
    finally:
        for p in procs:  # the other nodes would wait for the failed one until pg_timeout_s
            if p.poll() is None:
                _kill_group(p)
        for f in files:
            f.close()
    _echo_new(logs, offsets, out)
    record = read_record(cfg)
    fresh = record is not None and (before is None or record.get("run_id") != before.get("run_id"))
    if failed is None and not timed_out and fresh:
        return record
    node = 0 if failed is None else failed
    with open(logs[node], errors="replace") as f:
        tail = "".join(collections.deque(f, maxlen=40))
    if timed_out:
        why = f"timed out after {timeout_s} s"
    elif failed is not None:
        why = f"node {failed} exited with code {procs[failed].returncode}"
    else:
        why = "every node exited 0 but no new record was written"
    raise RunFailed(f"multinode run {cfg.run_key()} ({cfg.nnodes} nodes x {cfg.nproc_per_node}, "
                    f"rendezvous {endpoint}) {why}; log: {logs[node]}\n--- last lines ---\n{tail}",
                    returncode=None if timed_out else (procs[node].returncode),
                    log_tail=tail, run_dir=run_dir, status="timeout" if timed_out else "failed", error=why)


def _echo_new(paths: list[str], offsets: list[int], out) -> None:
    """Echo the complete lines each node's log gained since ``offsets`` (bytes), as ``[node i] ...``."""
    for i, path in enumerate(paths):
        with open(path, "rb") as f:
            f.seek(offsets[i])
            chunk = f.read()
        cut = chunk.rfind(b"\n") + 1  # a partial last line waits for the next call
        offsets[i] += cut
        if out and cut:
            text = chunk[:cut].decode(errors="replace")
            out.write("".join(f"[node {i}] {ln}\n" for ln in text.splitlines()))
