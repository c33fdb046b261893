"""Stragglers: per-rank step time as a distribution, and the slowest of N ranks that a synchronous step waits for.

A synchronous data-parallel step ends when the slowest rank's gradients arrive, so with per-rank compute times
``X_1..X_N`` drawn from one distribution F (independent across ranks), the step's compute term is ``max_r X_r``,
whose CDF is ``F(x)^N``: it keeps rising with N (order statistics), the term a model without stragglers misses.

**Estimators.** ``samples``: per-rank compute times of one configuration at one placement (s), e.g. rank 0's
measured steps of a no-op-hook run (compute without the network) or of a one-process run (``steps.csv``).

- Empirical (:func:`expected_max`, :func:`quantile_of_max`), used where the sample holds the quantile asked
  for: ``E[max of N] = sum_i x_(i) ((i/m)^N - ((i-1)/m)^N)`` over the m sorted samples (exact for the empirical
  distribution: the mean of the max of N draws with replacement); the median of the max is the sample's
  ``0.5^(1/N)`` quantile. :func:`empirical_ok` says whether that quantile is inside the sample (at least
  ``MIN_TAIL`` samples above it).
- Fitted (:class:`LogNormal`), beyond: a lognormal with median ``exp(mu)`` and ``sigma`` from the sample's
  median and 90th percentile, ``sigma = ln(p90 / p50) / z_0.9`` (the upper body, which sets the max, without
  letting a few steps disturbed by other processes set the tail); ``E[max of N] = int exp(mu + sigma z) N
  Phi(z)^(N-1) phi(z) dz`` (numerically), median of the max ``exp(mu + sigma Phi^-1(0.5^(1/N)))``.
  :func:`bootstrap_sigma` resamples the steps for the uncertainty of sigma.

**Assumptions** (docs/measurement.md): ranks independent and alike (one distribution per placement: processes
sharing a host's cores are measured together, in the no-op twin at that placement); steps independent (a slow
phase that lasts several steps makes the max rise less); beyond the sample, the tail is lognormal.

numpy and pandas only.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

MIN_TAIL = 5
"""Samples at least this many above the quantile for the empirical estimator to be used."""
Z90 = 1.2815515655446004  # the standard normal's 90th percentile


def _sorted(samples) -> np.ndarray:
    x = np.sort(np.asarray(samples, dtype=float))
    x = x[np.isfinite(x)]
    if x.size == 0:
        raise ValueError("samples: no finite per-rank time to build a distribution from")
    if (x <= 0).any():
        raise ValueError(f"samples: per-rank times must be positive, got {x[x <= 0][:3].tolist()}")
    return x


def expected_max(samples, n: int) -> float:
    """E[max of ``n`` independent draws] from the empirical distribution of ``samples`` (s)."""
    x = _sorted(samples)
    n = int(n)
    if n < 1:
        raise ValueError(f"n: need at least one rank, got {n}")
    m = x.size
    i = np.arange(1, m + 1)
    w = (i / m) ** n - ((i - 1) / m) ** n  # P(the max is the i-th smallest)
    return float(x @ w)


def quantile_of_max(samples, n: int, q: float = 0.5) -> float:
    """The ``q`` quantile of the max of ``n`` draws from the empirical distribution: its ``q^(1/n)`` quantile."""
    x = _sorted(samples)
    return float(np.quantile(x, q ** (1.0 / int(n))))


def empirical_ok(samples, n: int, q: float = 0.5) -> bool:
    """Whether the sample holds at least :data:`MIN_TAIL` values above the ``q^(1/n)`` quantile (then the empirical
    estimate of the max of ``n`` is used; beyond, the fitted distribution)."""
    m = np.isfinite(np.asarray(samples, float)).sum()
    return m * (1.0 - q ** (1.0 / int(n))) >= MIN_TAIL


def _phi_inv(p: float) -> float:
    """The standard normal quantile (bisection on erf: exact to 1e-12, no scipy)."""
    if not 0 < p < 1:
        raise ValueError(f"p: must be in (0, 1), got {p}")
    lo, hi = -40.0, 40.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class LogNormal:
    """Per-rank time ``exp(mu + sigma Z)``, Z standard normal: median ``exp(mu)``, coefficient of variation
    ``sqrt(exp(sigma^2) - 1)``."""

    mu: float
    sigma: float

    @classmethod
    def fit(cls, samples) -> "LogNormal":
        """From the sample's median and 90th percentile (see the module docstring)."""
        x = _sorted(samples)
        p50, p90 = np.quantile(x, [0.5, 0.9])
        return cls(math.log(p50), max(0.0, math.log(p90 / p50) / Z90))

    @classmethod
    def from_median_p90(cls, median_s: float, p90_s: float) -> "LogNormal":
        """From a record's median and 90th percentile of the step time."""
        if not (median_s > 0 and p90_s > 0):
            raise ValueError(f"median_s, p90_s: must be positive, got {median_s!r}, {p90_s!r}")
        return cls(math.log(median_s), max(0.0, math.log(p90_s / median_s) / Z90))

    @classmethod
    def from_cv(cls, median_s: float, cv: float) -> "LogNormal":
        """A per-rank time of median ``median_s`` and coefficient of variation ``cv``."""
        if not median_s > 0 or cv < 0:
            raise ValueError(f"median_s, cv: need median_s > 0 and cv >= 0, got {median_s!r}, {cv!r}")
        return cls(math.log(median_s), math.sqrt(math.log1p(cv * cv)))

    @property
    def median_s(self) -> float:
        return math.exp(self.mu)

    @property
    def mean_s(self) -> float:
        return math.exp(self.mu + self.sigma ** 2 / 2)

    @property
    def cv(self) -> float:
        return math.sqrt(math.expm1(self.sigma ** 2))

    def scaled(self, median_s: float) -> "LogNormal":
        """The same spread (sigma, hence CV) around another median (another amount of work per rank)."""
        return LogNormal(math.log(median_s), self.sigma)

    def quantile_of_max(self, n: int, q: float = 0.5) -> float:
        """The ``q`` quantile of the max of ``n`` draws."""
        return math.exp(self.mu + self.sigma * _phi_inv(q ** (1.0 / int(n))))

    def expected_max(self, n: int) -> float:
        """E[max of ``n`` draws] (numerical integration over z)."""
        n = int(n)
        if n == 1:
            return self.mean_s
        if self.sigma == 0:
            return self.median_s
        z = np.linspace(-9.0, 9.0 + math.sqrt(2 * math.log(n)), 20001)
        cdf = 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
        pdf = np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
        dens = n * cdf ** (n - 1) * pdf
        return float(np.trapezoid(np.exp(self.mu + self.sigma * z) * dens, z))


def bootstrap_sigma(samples, n_boot: int = 200, seed: int = 0, level: float = 0.9) -> tuple[float, float]:
    """A ``level`` interval of the fitted sigma, resampling the steps with replacement."""
    x = _sorted(samples)
    rng = np.random.default_rng(seed)
    sig = [LogNormal.fit(rng.choice(x, x.size)).sigma for _ in range(n_boot)]
    a = (1 - level) / 2
    return float(np.quantile(sig, a)), float(np.quantile(sig, 1 - a))


@dataclass
class RankTimes:
    """Per-rank compute times of one configuration at one placement: ``samples`` (s), the runs they came from,
    and ``source`` in words (which runs, which steps, whether extrapolated from one process)."""

    samples: np.ndarray
    n_runs: int
    source: str
    placement: str = ""

    def max_step_s(self, n: int, q: float = 0.5) -> tuple[float, str]:
        """The ``q`` quantile of the slowest of ``n`` ranks, and the estimator used (``empirical`` or ``lognormal``)."""
        if empirical_ok(self.samples, n, q):
            return quantile_of_max(self.samples, n, q), "empirical"
        return LogNormal.fit(self.samples).quantile_of_max(n, q), "lognormal"

    def expected_max_s(self, n: int) -> tuple[float, str]:
        """E[slowest of ``n`` ranks] and the estimator used."""
        if empirical_ok(self.samples, n, 1 - 1 / math.e):  # the mean of the max sits near its 63rd percentile
            return expected_max(self.samples, n), "empirical"
        return LogNormal.fit(self.samples).expected_max(n), "lognormal"

    @property
    def lognormal(self) -> LogNormal:
        return LogNormal.fit(self.samples)


def run_step_times(record_path: str, column: str = "step_time_s") -> np.ndarray:
    """The measured per-step ``column`` of one run (rank 0's ``steps.csv`` beside ``record_path``, final attempt,
    after warm-up); empty when the file is missing."""
    from kanlib.analysis import load  # the one reader of steps.csv

    run_dir = os.path.dirname(str(record_path))
    if not record_path or not os.path.exists(os.path.join(run_dir, "steps.csv")):
        return np.array([])
    s = load.load_steps(run_dir)
    s = s[s["measured"] == 1]
    return s[column].to_numpy(float)


def rank_times(runs: pd.DataFrame, placement: str = "") -> RankTimes:
    """Per-rank compute samples pooled over ``runs`` (one configuration at one placement: no-op-hook runs, or
    one-process runs): each run's rank-0 ``steps.csv``; a run without it stands in with a lognormal through its
    record's median and 90th percentile (``step_time_s``, ``step_time_s_p90``), sampled at its quantiles."""
    parts, from_steps, from_rec = [], 0, 0
    for _, r in runs.iterrows():
        x = run_step_times(r.get("record_path", "")) if isinstance(r.get("record_path"), str) else np.array([])
        x = x[np.isfinite(x) & (x > 0)]
        if x.size:
            parts.append(x)
            from_steps += 1
            continue
        med, p90 = r.get("step_time_s"), r.get("step_time_s_p90")
        if not (isinstance(p90, (int, float)) and p90 == p90 and p90 > 0):
            p90 = med
        ln = LogNormal.from_median_p90(float(med), float(p90))
        u = (np.arange(100) + 0.5) / 100
        parts.append(np.array([math.exp(ln.mu + ln.sigma * _phi_inv(p)) for p in u]))
        from_rec += 1
    if not parts:
        raise ValueError("runs: no run to take per-rank times from")
    how = []
    if from_steps:
        how.append(f"{from_steps} run(s)' measured steps (rank 0)")
    if from_rec:
        how.append(f"{from_rec} record(s)' median and p90 (no steps.csv)")
    return RankTimes(np.concatenate(parts), len(runs), ", ".join(how), placement)
