"""Checkpoints of a run, written atomically with a commit marker, loaded with ``weights_only``.

Layout under the run folder::

    checkpoints/ckpt-00000010.pt   model, optimizer, per-rank RNG states, next step, run key
    checkpoints/latest             the file name of the last committed checkpoint

Writing (rank 0 only): the checkpoint goes to ``ckpt-<step>.pt.tmp``, is fsynced and renamed
into place, then ``latest`` is rewritten the same way (tmp, fsync, rename, fsync of the folder).
A checkpoint counts only once ``latest`` names it: a ``.tmp`` left by a crash and a checkpoint
renamed but never committed are ignored (and removed at the next start). Older committed
checkpoints beyond the newest ``KEEP`` are removed.

Reading uses ``torch.load(weights_only=True)`` only, so a checkpoint cannot run code: every
value in it is a tensor or a plain Python type (RNG states are stored as tensors). A
truncated, corrupt or non-weights-only file raises :class:`CheckpointError` naming the file.

``step`` in a checkpoint is the number of optimizer steps already taken, i.e. the first step
to run on resume; the data of step ``s`` depends only on ``s`` (kanlib.data), so the step is
also the data position.

Also here: what a checkpoint holds under DDP and FSDP (:func:`full_states`, gathered into full tensors under
FSDP so a checkpoint does not depend on the sharding; :func:`load_optimizer`), and :func:`prepare_run_dir`,
which decides at the start of an attempt between a fresh start and a resume from the last committed checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import sys
import random
import re

import numpy as np
import torch

from kanlib import optim, records

DIR_NAME = "checkpoints"
LATEST_NAME = "latest"
KEEP = 2
_NAME = re.compile(r"^ckpt-(\d{8})\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be loaded; the message names the file."""


def checkpoint_dir(run_dir: str) -> str:
    return os.path.join(run_dir, DIR_NAME)


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}.pt"


# -- RNG states as tensors / plain types (weights_only can load them) -------------------------
def rng_state(device: torch.device | None = None) -> dict:
    """This process's RNG states: torch CPU (and CUDA), numpy's global, python's ``random``."""
    version, mt, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "torch_cpu": torch.get_rng_state(),
        "python": {"version": int(version), "mt": torch.tensor(mt, dtype=torch.int64),
                   "gauss": gauss},
        "numpy": {"name": str(np_name), "keys": torch.from_numpy(np_keys.astype(np.int64)),
                  "pos": int(np_pos), "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
    }
    if device is not None and device.type == "cuda":
        state["torch_cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device | None = None) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch_cpu"])
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["mt"].tolist()), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    if device is not None and device.type == "cuda" and "torch_cuda" in state:
        torch.cuda.set_rng_state(state["torch_cuda"], device)


# -- writing ------------------------------------------------------------------------------------
def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_latest(ckdir: str, name: str) -> None:
    tmp = os.path.join(ckdir, f"{LATEST_NAME}.tmp.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(ckdir, LATEST_NAME))
    _fsync_dir(ckdir)


def save(run_dir: str, state: dict, step: int, *, before_rename=None) -> str:
    """Write ``state`` (with ``step`` added) as the committed checkpoint of ``step``; return its path.

    ``before_rename`` (tests: fault injection) is called after the temporary file is synced.
    """
    ckdir = checkpoint_dir(run_dir)
    os.makedirs(ckdir, exist_ok=True)
    name = checkpoint_name(step)
    path = os.path.join(ckdir, name)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            torch.save({**state, "step": int(step)}, f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:  # a full disk, say: leave the last committed checkpoint and no half file
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    if before_rename is not None:
        before_rename()
    os.replace(tmp, path)
    _fsync_dir(ckdir)
    _write_latest(ckdir, name)  # the commit
    for old in committed_names(run_dir)[:-KEEP]:
        os.remove(os.path.join(ckdir, old))
    return path


def committed_names(run_dir: str) -> list[str]:
    """Checkpoint files up to and including the one ``latest`` names, oldest first."""
    latest = latest_name(run_dir)
    if latest is None:
        return []
    ckdir = checkpoint_dir(run_dir)
    names = sorted(n for n in os.listdir(ckdir) if _NAME.match(n))
    return [n for n in names if n <= latest]


def latest_name(run_dir: str) -> str | None:
    """The file name of the last committed checkpoint, or None when there is none."""
    marker = os.path.join(checkpoint_dir(run_dir), LATEST_NAME)
    try:
        with open(marker) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    if not _NAME.match(name):
        raise CheckpointError(f"{marker}: does not name a checkpoint (read {name!r})")
    return name


def latest_step(run_dir: str) -> int | None:
    """The step of the last committed checkpoint, or None."""
    name = latest_name(run_dir)
    return None if name is None else int(_NAME.match(name).group(1))


def clean_uncommitted(run_dir: str) -> list[str]:
    """Remove ``.tmp`` files and checkpoints newer than the committed one; return what was removed."""
    ckdir = checkpoint_dir(run_dir)
    if not os.path.isdir(ckdir):
        return []
    latest = latest_name(run_dir)
    removed = []
    for n in sorted(os.listdir(ckdir)):
        if ".tmp" in n or (_NAME.match(n) and (latest is None or n > latest)):
            os.remove(os.path.join(ckdir, n))
            removed.append(n)
    return removed


def remove_all(run_dir: str) -> None:
    """Delete every checkpoint of the run (a fresh start, or after the run completed)."""
    ckdir = checkpoint_dir(run_dir)
    if not os.path.isdir(ckdir):
        return
    for n in os.listdir(ckdir):
        os.remove(os.path.join(ckdir, n))
    os.rmdir(ckdir)


# -- reading ------------------------------------------------------------------------------------
def load_file(path: str) -> dict:
    """Load one checkpoint file with ``weights_only=True``; any failure names the file."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path}: the file is missing") from None
    except Exception as e:  # truncated zip, refused pickle, ...
        kind = type(e).__name__
        if kind == "UnpicklingError":
            why = "refused: it is not a weights-only checkpoint (it would run code when unpickled)"
        else:
            why = "unreadable (truncated or corrupt)"
        raise CheckpointError(f"checkpoint {path}: {why}: {kind}: {str(e).splitlines()[0][:300]}") from e
    if not isinstance(obj, dict) or not {"step", "model", "optimizer", "rng"} <= set(obj):
        raise CheckpointError(f"checkpoint {path}: not a kanlib checkpoint (keys: "
                              f"{sorted(obj) if isinstance(obj, dict) else type(obj).__name__})")
    return obj


def load_latest(run_dir: str) -> dict | None:
    """The last committed checkpoint of the run (with ``'path'`` added), or None when there is none.

    When that file is unreadable (truncated or corrupt: a disk error after the commit), the older kept
    checkpoints are tried, newest first, saying which was skipped; a refused (not weights-only) file is never
    skipped, and when none can be read the newest one's error is raised."""
    name = latest_name(run_dir)
    if name is None:
        return None
    first_error = None
    for n in reversed(committed_names(run_dir) or [name]):
        path = os.path.join(checkpoint_dir(run_dir), n)
        try:
            ck = load_file(path)
        except CheckpointError as e:
            if "refused" in str(e):
                raise
            first_error = first_error or e
            print(f"kanlib: {e}; trying the older kept checkpoint", file=sys.stderr, flush=True)
            continue
        ck["path"] = path
        return ck
    raise first_error


# -- the run folder at the start of an attempt ---------------------------------------------
def prepare_run_dir(run_dir: str, config: dict) -> int | None:
    """Rank 0, before anything else: write ``config`` (the run's flat config) to config.json, decide fresh start
    or resume, tidy up.

    A folder with a record is a completed run being rerun: it starts afresh. Otherwise the last
    committed checkpoint (if any) is resumed; uncommitted checkpoint files are removed and steps.csv
    keeps only the rows of steps before the checkpoint. Returns the step to resume from, or None.
    """
    os.makedirs(run_dir, exist_ok=True)
    records.atomic_write_json(os.path.join(run_dir, records.CONFIG_NAME), config)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(run_dir, records.PREEMPTED_NAME))
    steps_path = os.path.join(run_dir, records.STEPS_NAME)
    record_path = os.path.join(run_dir, records.RECORD_NAME)
    if os.path.exists(record_path):
        remove_all(run_dir)
        os.remove(record_path)
    clean_uncommitted(run_dir)
    resume = latest_step(run_dir)
    if resume is None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(steps_path)
    else:
        records.truncate_steps(steps_path, resume)
    return resume


# -- what a checkpoint holds under DDP and FSDP ---------------------------------------------
def full_model_state(model: torch.nn.Module, fsdp: bool) -> dict:
    """The parameters as full CPU tensors (``fsdp``: the model is FSDP-sharded, and this is collective)."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def full_states(model: torch.nn.Module, optimizer, fsdp: bool, info) -> tuple[dict, dict]:
    """Model and optimizer state for a checkpoint: as they are under DDP; gathered into full tensors on CPU
    under FSDP (``fsdp``; collective over ``info``'s ranks), so a checkpoint does not depend on the sharding."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        if isinstance(optimizer, optim.LBFGS):  # one flat history per rank, not per-parameter states
            return full_model_state(model, fsdp), optim.gather_state(optimizer, info)
        return full_model_state(model, fsdp), get_optimizer_state_dict(model, optimizer, options=opts)
    return model.state_dict(), optimizer.state_dict()


def load_optimizer(model: torch.nn.Module, optimizer, state: dict, fsdp: bool, info) -> None:
    """Restore the optimizer from a checkpoint; under FSDP (``fsdp``) from its full state, cut into this rank's
    shards."""
    if fsdp and isinstance(optimizer, optim.LBFGS):
        optim.load_state(optimizer, state, info)
    elif fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
    else:
        optimizer.load_state_dict(state)
