"""The command line of one training run: ``python -m kanlib.train --key=value ...`` (torchrun's entry).

``kanlib.train.main`` hands the arguments and its ``train`` to :func:`main`, which parses them into a
:class:`~kanlib.config.RunConfig` (an unknown key or a bad value is an error naming it), runs it and prints
rank 0's summary line (:func:`validation_summary` names the validation loss by what it measures).
"""

from __future__ import annotations

import math
import os
import sys
from typing import Callable

from kanlib import distributed, manifest, records
from kanlib.config import RunConfig
from kanlib.records import RunRecord


def main(argv: list[str], train: Callable[[RunConfig], RunRecord | None]) -> int:
    """Run the config of ``argv`` (``--key=value`` arguments) with ``train`` (kanlib.train's): the usage for
    ``--help``, the launch checked before the run's folder exists, the run folder's lock when started by hand, and
    rank 0's one-line summary. Returns the exit status."""
    if any(a in ("-h", "--help") for a in argv):
        print(RunConfig.usage("python -m kanlib.train"))
        return 0
    distributed.die_with_launcher()
    cfg = RunConfig.from_cli(argv)
    distributed.check_launch(cfg)  # before the run's folder (the lock below) exists: a mismatch leaves none
    lock = None
    if not os.environ.get("KANLIB_RUNNER_LOCKS") and os.environ.get("RANK", "0") == "0":
        # Started by hand (a runner holds the lock of every run it launches): one process per run folder, as
        # under a runner; a second start of the same config would append to the first's steps.csv (issue 23)
        lock = manifest.RunLock(cfg.run_dir())
        if not lock.acquire(wait=False):
            print(f"kanlib: {cfg.run_dir()} is being run by {lock.holder()}; not starting it twice",
                  file=sys.stderr, flush=True)
            return 3
    try:
        rec = train(cfg)
    finally:
        if lock is not None:
            lock.release()
    if rec is not None:
        print(f"kanlib: world_size={rec.world_size} precision={cfg.precision} step_time_s={rec.step_time_s:.6f} "
              f"samples_per_s={rec.samples_per_s:.1f} {validation_summary(rec)} "
              f"record={os.path.join(cfg.run_dir(), records.RECORD_NAME)}", flush=True)
    return 0


def validation_summary(rec: RunRecord) -> str:
    """The final validation loss under its own name: ``val_cross_entropy`` and ``val_accuracy`` (classification), or
    ``val_mse`` and ``val_rmse`` of the (standardised) target and ``val_rmse_target_units``, the RMSE in the target's
    own units (``target_std`` times it; the same number where the target is not standardised)."""
    loss = rec.final_val_loss
    if rec.final_val_accuracy is not None:
        return f"val_cross_entropy={loss:.6g} val_accuracy={rec.final_val_accuracy:.4f}"
    rmse = math.sqrt(loss) if loss >= 0 else math.nan
    scale = rec.target_std if rec.target_std is not None else 1.0
    return f"val_mse={loss:.6g} val_rmse={rmse:.6g} val_rmse_target_units={rmse * scale:.6g}"
