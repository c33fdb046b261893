"""When a run's machine was busy: the disturbance policy (docs/measurement.md, "Interference").

A record's interference counters (``foreign_cpu_frac``, ``runqueue_wait_frac``, ``cpus_shared``, the GPU fields of
:class:`kanlib.records.RunRecord`) are judged here against the thresholds below: :func:`disturbance` says why a
run counts as disturbed (the analysis leaves it out by default), :func:`needs_rerun` whether a sweep runs it once
more (docs/faults.md, "Disturbed runs"). Pure functions of a record dict: no torch, no files.
"""

from __future__ import annotations

import math


DISTURBED_FOREIGN_CPU_FRAC = 0.10
"""A run is disturbed when other processes took more than this share of its CPUs' time during its measured steps."""
DISTURBED_RUNQUEUE_WAIT_FRAC = 0.10
"""... or any rank's training thread waited runnable for a CPU more than this share of the measured window behind
other processes (``foreign_wait_frac``: at most their CPU time on its CPUs; the rest of a wait is behind its own
threads)."""
MIN_INTERFERENCE_CPU_S = 0.2
"""The per-CPU counters tick every 10 ms: below this much window x CPUs (20 ticks, a share resolved to 5%, half the
thresholds) their share is too coarse to judge. At 0.5, the default study's shortest 2-process runs (36 steps of
6 ms: 0.43 CPU-s) went unjudged, and their waits behind gloo's own threads (10-14%, no other process on their CPUs)
flagged 9 of 45 strong-scaling runs on a quiet machine."""


def disturbance(rec: dict) -> str:
    """Why the run of record ``rec`` counts as disturbed (docs/measurement.md), or '' when it was not (or cannot
    be told: unknown is not disturbed, and the record says unknown with nulls)."""
    why = []
    foreign, wait = rec.get("foreign_cpu_frac"), rec.get("runqueue_wait_frac")
    window = rec.get("interference_window_s") or 0.0
    n_cpus = max(1, int(rec.get("world_size") or 1) * int(rec.get("threads") or 1))
    if _finite(foreign) and foreign > DISTURBED_FOREIGN_CPU_FRAC and window * n_cpus >= MIN_INTERFERENCE_CPU_S:
        why.append(f"other processes took {foreign:.0%} of its CPUs")
    # a training thread also waits behind its own process's threads (gloo's, a timed hook's with many small
    # buckets: 10-18% on a quiet machine): only the part other processes' CPU time can explain counts; where the
    # per-CPU counters are too coarse to say, the wait alone decides. Records before foreign_wait_frac bound it by
    # twice foreign_cpu_frac.
    judged = _finite(foreign) and window * n_cpus >= MIN_INTERFERENCE_CPU_S
    bound = rec.get("foreign_wait_frac") if _finite(rec.get("foreign_wait_frac")) else (
        2 * foreign if _finite(foreign) else None)
    explained = min(wait, bound) if judged and _finite(wait) and bound is not None else wait
    if _finite(explained) and explained > DISTURBED_RUNQUEUE_WAIT_FRAC:
        why.append(f"a training thread waited for a CPU {wait:.0%} of the time"
                   + (f" while other processes took {foreign:.0%} of its CPUs" if _finite(foreign) else ""))
    if rec.get("cpus_shared"):
        why.append("a rank found no CPUs of its own free (another kanlib run held them) and shared cores")
    if rec.get("gpu_other_processes"):
        why.append(f"{rec['gpu_other_processes']} other process(es) on its GPU")
    if rec.get("gpu_throttle_reasons"):
        why.append(f"GPU clocks throttled (NVML reasons {rec['gpu_throttle_reasons']:#x})")
    return "; ".join(why)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)



def needs_rerun(rec: dict) -> str:
    """Why a sweep runs the run of ``rec`` once more (docs/faults.md, "Disturbed runs"), or '': the record is
    disturbed (:func:`disturbance`) and a first attempt. A record that is itself a rerun (it names
    ``earlier_attempts``) is kept, flagged disturbed: a run is run again once."""
    return "" if rec.get("earlier_attempts") else disturbance(rec)
