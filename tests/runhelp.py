"""Shared helpers of the fault, checkpoint and sweep tests: tiny configs, reference runs, and finding
the processes of a run (the ``no_process_left`` fixture is in conftest.py)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import torch

from kanlib import manifest
from kanlib.analysis import load
from kanlib.config import RunConfig

BASE = dict(study="faults", model="kan", widths=(2, 4, 1), grid_size=3, nproc_per_node=2, steps=20,
            warmup_steps=2, n_train=256, n_val=64, global_batch=32, device="cpu", backend="gloo",
            threads=1, pg_timeout_s=5.0, kan_impl="fast",  # the runner is tested here, not the kernels
            optimizer="adam", lr=1e-3)  # one forward and backward per step: faults land where the tests say


def tiny(out_dir, **changes) -> RunConfig:
    """A two-process CPU run of 20 steps that takes a few seconds."""
    return RunConfig(**{**BASE, "out_dir": str(out_dir), **changes})


def manifest_rows(cfg: RunConfig) -> list[dict]:
    return load.load_manifest(manifest.manifest_path(cfg.out_dir, cfg.study)).to_dict("records")


def final_params(cfg: RunConfig) -> dict:
    return torch.load(os.path.join(cfg.run_dir(), "model.pt"), weights_only=True)


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


_REFERENCE: dict = {}


def reference_params() -> dict:
    """Final parameters of an uninterrupted run of ``tiny`` (computed once per test session)."""
    if "params" not in _REFERENCE:
        from runners.launch import run

        root = tempfile.mkdtemp(prefix="kanlib-ref-")
        atexit.register(shutil.rmtree, root, True)
        cfg = tiny(root)
        run(cfg, echo=False, timeout_s=120)
        _REFERENCE["params"] = final_params(cfg)
    return _REFERENCE["params"]


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (our runs carry --out_dir=<tmp>)."""
    found = []
    for e in os.listdir("/proc"):
        if not e.isdigit() or int(e) == os.getpid():
            continue
        try:
            with open(f"/proc/{e}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{e}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            found.append(int(e))
    return found
