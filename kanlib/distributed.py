"""Process-group set-up from torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE).

nccl on CUDA, gloo on CPU; a single process without torch.distributed when RANK is unset.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    """Where this process stands: rank, world, device and backend (None when not distributed)."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu'; an explicit choice is checked."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: 'cuda' was asked for, but no CUDA device is visible")
    return device


def resolve_backend(backend: str, device: str) -> str:
    """'auto' -> nccl on CUDA, gloo on CPU."""
    if backend == "auto":
        return "nccl" if device == "cuda" else "gloo"
    if backend == "nccl" and device != "cuda":
        raise RuntimeError("backend: 'nccl' needs CUDA devices; use gloo on CPU")
    return backend


def setup(cfg) -> DistInfo:
    """Initialise the process group (if launched by torchrun) and pick this rank's device."""
    torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    if "RANK" not in os.environ:
        dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
        return DistInfo(0, 0, 1, dev, None)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ["WORLD_SIZE"])
    if world != cfg.world_size:
        raise RuntimeError(
            f"WORLD_SIZE={world} from the launcher does not match the config's "
            f"nnodes x nproc_per_node = {cfg.nnodes} x {cfg.nproc_per_node}")
    backend = resolve_backend(cfg.backend, device)
    if cfg.nccl_algo:
        os.environ["NCCL_ALGO"] = cfg.nccl_algo  # read by NCCL at communicator creation; recorded in env
    if device == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} CUDA devices")
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    kwargs = {"device_id": dev} if device == "cuda" else {}
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=cfg.pg_timeout_s), **kwargs)
    return DistInfo(rank, local_rank, world, dev, backend)


def teardown(info: DistInfo) -> None:
    """Destroy the process group if one was created."""
    if info.distributed and dist.is_initialized():
        dist.destroy_process_group()


def synchronize(device: torch.device) -> None:
    """Wait for queued device work so a host clock reads the true time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
