"""Statistics of the study: medians over repeats with percentile bootstrap 95% intervals
(:func:`scipy.stats.bootstrap`), Amdahl and Karp-Flatt, and the checks a guideline makes against a target
or between two intervals.

Every interval is a percentile bootstrap at :data:`LEVEL` with :data:`N_BOOT` resamples and its own generator
seeded with ``seed`` (default :data:`SEED`), so a table is the same every time it is computed from the same
records, whatever else was computed before it. Several samples (a speedup: the baseline's runs and the
point's) are resampled independently.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as _scipy_stats

N_BOOT = 2000
"""Bootstrap resamples per interval."""
LEVEL = 0.95
"""Confidence level of every interval."""
SEED = 0
"""Seed of each interval's generator: outputs are reproducible."""


def bootstrap_interval(samples, statistic, n_boot: int = N_BOOT, level: float = LEVEL,
                       seed: int = SEED) -> tuple[float, float]:
    """Percentile bootstrap interval ``(low, high)`` of ``statistic(*samples, axis=-1)``, resampling each sample
    independently. A sample of one value cannot vary and is held as it is; with no sample of two or more values
    the interval is the statistic itself on both sides (no spread can be estimated)."""
    samples = [np.asarray(s, dtype=float) for s in samples]
    free = [i for i, s in enumerate(samples) if s.size > 1]
    if not free:
        v = float(statistic(*samples, axis=-1))
        return v, v

    def resampled(*drawn, axis=-1):
        args = list(samples)
        for i, d in zip(free, drawn):
            args[i] = d
        return statistic(*args, axis=axis)

    res = _scipy_stats.bootstrap([samples[i] for i in free], resampled, n_resamples=n_boot, vectorized=True,
                                 confidence_level=level, method="percentile", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def bootstrap_ci(values, n_boot: int = N_BOOT, level: float = LEVEL, seed: int = SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of the finite ``values``: ``(low, high)``; NaN for none."""
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return float("nan"), float("nan")
    return bootstrap_interval([a], np.median, n_boot, level, seed)


def median_ci(v, n_boot: int = N_BOOT, seed: int = SEED) -> tuple[float, float, float]:
    """The median of ``v`` with its bootstrap interval: ``(median, low, high)``."""
    lo, hi = bootstrap_ci(v, n_boot=n_boot, seed=seed)
    return float(np.median(v)), lo, hi


def _median_ratio(a, b, axis=-1):
    return np.median(a, axis=axis) / np.median(b, axis=axis)


def ratio_ci(a, b, n_boot: int = N_BOOT, scale: float = 1.0, seed: int = SEED) -> tuple[float, float, float]:
    """``scale * median(a) / median(b)`` with a bootstrap interval resampling both (non-finite values left out;
    NaN when either has no finite value)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if not a.size or not b.size:
        return float("nan"), float("nan"), float("nan")
    lo, hi = bootstrap_interval([a, b], _median_ratio, n_boot, seed=seed)
    return scale * float(np.median(a)) / float(np.median(b)), scale * lo, scale * hi


def exposed_share_ci(timed, noop, n_boot: int = N_BOOT, seed: int = SEED) -> tuple[float, float]:
    """Bootstrap interval of ``max(0, median(timed) - median(noop)) / median(timed)``: the exposed share of the
    step, resampling the timed runs and their no-op twins."""
    def share(a, b, axis=-1):
        ta = np.median(a, axis=axis)
        return np.clip(ta - np.median(b, axis=axis), 0.0, None) / ta

    return bootstrap_interval([timed, noop], share, n_boot, seed=seed)


# -- scaling laws ---------------------------------------------------------------------------------
def karp_flatt(speedup, n):
    """Experimentally determined serial fraction ``e = (1/S - 1/N) / (1 - 1/N)`` (NaN at N = 1)."""
    s = np.asarray(speedup, dtype=float)
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n > 1, (1 / s - 1 / n) / (1 - 1 / n), np.nan)


def amdahl_speedup(n, serial_fraction):
    """Amdahl's law ``S(N) = 1 / (s + (1 - s) / N)``."""
    n = np.asarray(n, dtype=float)
    return 1.0 / (serial_fraction + (1.0 - serial_fraction) / n)


def fit_amdahl(n, speedup) -> float:
    """Least-squares serial fraction ``s`` in [0, 1] of Amdahl's law through the points (N, S).

    Linear in ``u = 1/S = s (1 - 1/N) + 1/N``, so ``s`` has a closed form.
    """
    n = np.asarray(n, dtype=float)
    s = np.asarray(speedup, dtype=float)
    a = 1 - 1 / n
    y = 1 / s - 1 / n
    if not np.any(a > 0):
        return float("nan")
    return float(np.clip(np.sum(a * y) / np.sum(a * a), 0.0, 1.0))


# -- decisions --------------------------------------------------------------------------------------
MIN_RUNS = 5
"""Runs a point needs before a bootstrap interval means anything: below it a table shows the runs themselves and
says "N runs", and no guideline ranks on the point (with two runs a percentile bootstrap of the median is their
min and max)."""
MARGIN = 0.10
"""A candidate counts as better only beyond this relative margin: single runs have no interval, and repeated
runs of one config here differ by several percent."""


def meets(value, target: float) -> bool:
    """Whether ``value`` reaches ``target``: False for NaN, infinity, zero and negative values, so a
    broken measurement can never make a guideline claim a target is met."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(v) and v > 0 and v + 1e-12 >= target


def reaches(value, lo, hi, target: float, n_runs=None, margin: float = MARGIN) -> str:
    """Whether a measured ``value`` with its 95% interval ``[lo, hi]`` reaches ``target`` (larger is better):
    ``"yes"`` when the whole interval does, or when the value does and the interval's low end lies within the
    decision ``margin`` of it (``lo >= target * (1 - margin)``: the margin every ranking decision allows, applied to
    a threshold); ``"within"`` when it is not "yes" and the interval holds the target; ``"no"`` otherwise. Without a
    finite interval, or with fewer than :data:`MIN_RUNS` runs (``n_runs``; such an interval means nothing), the
    value alone decides ("yes" or "no", :func:`meets`). A NaN, infinite, zero or negative value never reaches it.

    Why the margin: on the whole interval alone (``lo >= target``), two quiet default studies of one code version
    disagreed: the weak-scaling 2048-per-process efficiency at 1x2 measured 86% [81%, 90%] in one and
    81% [77%, 85%] in the next, the one-process baseline having run 8% faster in the second (31 against 34 ms, in
    all five rounds of each; its two-process runs the same in both), which no interval inside one study can see.
    In six default studies of that code (four quiet, two with a CPU hog) every threshold decision came out the same
    with the margin (docs/results.md); a decision on a point whose interval holds the target is named as near it
    (:func:`holds`, in the guidelines' ``rests_on``)."""
    if not meets(value, 1e-300):
        return "no"
    lo, hi = _interval(lo, hi, n_runs)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "yes" if meets(value, target) else "no"
    if meets(lo, target) or (meets(value, target) and meets(lo, target * (1 - margin))):
        return "yes"
    return "within" if meets(hi, target) else "no"


def holds(value, lo, hi, target: float, n_runs=None) -> bool:
    """Whether the 95% interval ``[lo, hi]`` of a finite positive ``value`` (with at least :data:`MIN_RUNS` runs)
    holds ``target``: a threshold decision on it is near the target, whichever way it went."""
    if not meets(value, 1e-300):
        return False
    lo, hi = _interval(lo, hi, n_runs)
    return bool(math.isfinite(lo) and math.isfinite(hi) and lo + 1e-12 < target and meets(hi, target))


def _interval(lo, hi, n_runs) -> tuple[float, float]:
    """``(lo, hi)`` as floats; NaN for bounds that are not numbers or when ``n_runs`` (when given) is not a finite
    number of at least :data:`MIN_RUNS`."""
    try:
        lo, hi = float(lo), float(hi)
    except (TypeError, ValueError):
        lo = hi = float("nan")
    try:
        few = n_runs is not None and not (math.isfinite(float(n_runs)) and float(n_runs) >= MIN_RUNS)
    except (TypeError, ValueError):
        few = True
    return (float("nan"), float("nan")) if few else (lo, hi)


def near_note(points: list[str], target: float, what: str = "95% interval") -> str:
    """What a threshold decision's ``rests_on`` says of the ``points`` (already formatted) whose 95% intervals
    (``what``) hold ``target``: ``"near the 80% target (95% interval holds it): 2048 at 81% [77%, 85%]"``; ''
    when none."""
    if not points:
        return ""
    return f"near the {target:.0%} target ({what} holds it): " + ", ".join(points)


def tie_unsettled(values, lo, hi, margin: float = MARGIN) -> np.ndarray:
    """For a ranking by time (smaller is better) that names together the points tied with the best (within ``margin``
    of its median, or an interval reaching within ``margin`` of the best's interval): which points the medians and
    the intervals place on different sides of the tie. Such a decision could change within its intervals (a quiet
    study put 1x2 clear of 1x1 on time to target, the next, with a wider 1x1 interval, tied them): it is named as
    near the tie. Points without a finite interval are judged settled."""
    v, lo, hi = (np.asarray(x, dtype=float) for x in (values, lo, hi))
    b = int(np.nanargmin(v))
    by_median = v <= v[b] * (1 + margin)
    by_interval = lo <= hi[b] * (1 + margin)
    known = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(hi[b])
    return known & (by_median != by_interval)


def near_tie_note(points: list[str]) -> str:
    """What a ranking's ``rests_on`` says of the points :func:`tie_unsettled` names; '' when none."""
    if not points:
        return ""
    return "near the tie with the best (its median and its 95% interval place it apart): " + ", ".join(points)


def holds_row(row, col: str, target: float) -> bool:
    """:func:`holds` of a table row's ``col`` with its interval ``col_lo``/``col_hi`` and its ``n_runs``."""
    return holds(row.get(col), row.get(f"{col}_lo"), row.get(f"{col}_hi"), target, row.get("n_runs"))


def reaches_row(row, col: str, target: float) -> str:
    """:func:`reaches` of a table row's ``col`` with its interval ``col_lo``/``col_hi`` and its ``n_runs``."""
    return reaches(row.get(col), row.get(f"{col}_lo"), row.get(f"{col}_hi"), target, row.get("n_runs"))


def within_margin(values, margin: float = MARGIN):
    """Which of ``values`` (times: smaller is better) lie within ``margin`` (relative) of the smallest: the
    candidates a single run cannot tell apart, so a guideline names them together instead of picking one
    that the next run may not pick."""
    v = values.astype(float)
    return v <= v.min() * (1 + margin)


def ranges_overlap(a, b, col_a: str, col_b: str, margin: float = 0.0) -> bool | None:
    """Whether the interval ``a[col_a_lo], a[col_a_hi]`` and ``b[col_b_lo], b[col_b_hi]``, each widened upward by
    ``margin`` (relative), overlap; None when either bound is not finite."""
    lo_a, hi_a = float(a.get(f"{col_a}_lo", np.nan)), float(a.get(f"{col_a}_hi", np.nan))
    lo_b, hi_b = float(b.get(f"{col_b}_lo", np.nan)), float(b.get(f"{col_b}_hi", np.nan))
    if not np.isfinite([lo_a, hi_a, lo_b, hi_b]).all():
        return None
    return bool(lo_a <= hi_b * (1 + margin) and lo_b <= hi_a * (1 + margin))


def intervals_overlap(a, b, margin: float = MARGIN) -> bool | None:
    """Whether the 95% intervals of the overhead fractions of points ``a`` and ``b``, each widened upward by
    ``margin`` (relative), overlap; None when either has no finite interval. With two runs per point an interval
    is about the range of the runs, so intervals that merely do not touch flip between study runs (the exposed
    communication of 1x2 and 2x1, one host apart from the launch: '14% [12%, 16%]' and '16% [14%, 18%]' in one
    run, '14% [13%, 15%]' clear of 2x1's in the next)."""
    return ranges_overlap(a, b, "overhead", "overhead", margin)


# -- paired by round -------------------------------------------------------------------------------
MIN_PAIRS = 3
"""Rounds two points must share before their difference is judged paired by round (:func:`paired_difference`):
fewer, and the comparison falls back to their two independent intervals."""


def by_round(frame, value) -> tuple:
    """``((repeat, value), ...)`` of the runs of one point in ``frame`` (a DataFrame with a ``repeat`` column):
    ``value(runs of that repeat)`` per round, rounds in order; () without a ``repeat`` column or values. Runs of the
    same round ran back to back in one launch, so differences taken within a round cancel the load that drifts
    between rounds."""
    if frame is None or len(frame) == 0 or "repeat" not in frame:
        return ()
    out = []
    for r, g in frame.groupby("repeat", sort=True):
        v = float(value(g))
        if math.isfinite(v):
            out.append((int(r), v))
    return tuple(out)


def paired_difference(a, b, n_boot: int = N_BOOT, seed: int = SEED) -> tuple[float, float, float, int]:
    """``median(b_r - a_r)`` over the rounds ``r`` both ``a`` and ``b`` (``((repeat, value), ...)`` from
    :func:`by_round`) have, with its bootstrap interval (resampling rounds): ``(median, low, high, n_rounds)``;
    NaNs and 0 rounds when they share none."""
    da, db = dict(a or ()), dict(b or ())
    common = sorted(set(da) & set(db))
    if not common:
        return float("nan"), float("nan"), float("nan"), 0
    d = np.array([db[r] - da[r] for r in common], dtype=float)
    lo, hi = bootstrap_ci(d, n_boot=n_boot, seed=seed)
    return float(np.median(d)), lo, hi, len(common)


def clearly_larger(a, b, scale: float, margin: float = MARGIN, min_pairs: int = MIN_PAIRS) -> bool | None:
    """Whether ``b`` is larger than ``a`` beyond the decision margin, paired by round: the whole 95% interval of the
    median within-round difference ``b_r - a_r`` (:func:`paired_difference`) lies above ``margin * scale`` (e.g.
    10% of the better point's step time). None when they share fewer than ``min_pairs`` rounds."""
    med, lo, hi, n = paired_difference(a, b)
    if n < min_pairs or not math.isfinite(lo):
        return None
    return bool(lo > margin * float(scale))
