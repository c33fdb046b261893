"""An alpha-beta (Hockney) model of DDP's gradient all-reduce, fitted to measured runs and used to
extrapolate step time and efficiency to world sizes far beyond those measured.

All-reduce of ``n`` bytes over ``N`` ranks, per bucket:

- ring: ``2 (N - 1) alpha + 2 (N - 1) / N * n * beta`` (reduce-scatter then all-gather);
- tree: ``2 ceil(log2 N) alpha + 2 n beta`` (reduce up a binary tree, broadcast down; pipelined,
  so bandwidth does not grow with depth).

``alpha`` is the per-message latency (s), ``beta`` the inverse bandwidth (s/byte). With ``b`` equal
buckets of a gradient of ``G`` bytes, a step's communication is ``b`` latency terms plus one pass of
``G`` bytes. The fit uses the ``comm_total_s`` of runs with the timed hook (kanlib.results), whose
bucket counts and world sizes vary, so latency and bandwidth separate.

Step time at ``N`` under strong scaling: ``T(N) = C / N + (1 - f) * T_comm(N)`` where ``C`` is the
single-process compute time and ``f`` the measured fraction of communication hidden behind the
backward pass (overlap). This ignores stragglers and congestion: treat it as an optimistic bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

ALGOS = ("ring", "tree")


def _terms(world_size, n_bytes, n_buckets, algo: str):
    n = np.asarray(world_size, dtype=float)
    g = np.asarray(n_bytes, dtype=float)
    b = np.asarray(n_buckets, dtype=float)
    if algo == "ring":
        return b * 2 * (n - 1), 2 * (n - 1) / n * g
    if algo == "tree":
        depth = np.ceil(np.log2(np.maximum(n, 1)))
        return b * 2 * depth, np.where(n > 1, 2 * g, 0.0)
    raise ValueError(f"algo: unknown value {algo!r}; choose one of {', '.join(ALGOS)}")


def allreduce_time(world_size, n_bytes, alpha: float, beta: float, algo: str = "ring", n_buckets=1):
    """Predicted time (s) to all-reduce ``n_bytes`` split into ``n_buckets`` buckets over ``world_size`` ranks."""
    a, b = _terms(world_size, n_bytes, n_buckets, algo)
    return alpha * a + beta * b


@dataclass
class CommModel:
    """Fitted latency ``alpha`` (s), inverse bandwidth ``beta`` (s/byte), algorithm, and the fit's basis."""

    alpha: float
    beta: float
    algo: str = "ring"
    n_points: int = 0
    rel_rmse: float = float("nan")

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return 1.0 / self.beta if self.beta > 0 else float("inf")

    def predict(self, world_size, n_bytes, n_buckets=1):
        return allreduce_time(world_size, n_bytes, self.alpha, self.beta, self.algo, n_buckets)


def _nnls2(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares with two unknowns (exhaustive over the active sets)."""
    best, best_err = np.zeros(2), float(np.sum(y ** 2))
    cands = [np.linalg.lstsq(x, y, rcond=None)[0]]
    for j in range(2):
        col = x[:, j]
        denom = float(col @ col)
        c = np.zeros(2)
        if denom > 0:
            c[j] = float(col @ y) / denom
        cands.append(c)
    for c in cands:
        if np.all(c >= 0):
            err = float(np.sum((x @ c - y) ** 2))
            if err < best_err:
                best, best_err = c, err
    return best


def gradient_bytes(records: pd.DataFrame) -> np.ndarray:
    """Bytes all-reduced per step: one float32 gradient per parameter."""
    return records["n_params"].to_numpy(float) * 4


def fit(records: pd.DataFrame, algo: str = "ring") -> CommModel:
    """Fit ``alpha`` and ``beta`` (both >= 0) to runs with ``comm_hook == 'timed'`` and ``world_size > 1``."""
    missing = [c for c in ("world_size", "comm_total_s", "n_buckets", "n_params") if c not in records]
    if missing:
        raise ValueError(f"the communication model needs the record fields {missing} (runs with comm_hook='timed')")
    d = records
    if "comm_hook" in d:
        d = d[d["comm_hook"] == "timed"]
    d = d[(d["world_size"] > 1) & d["comm_total_s"].notna() & d["n_buckets"].notna()]
    if len(d) < 2:
        raise ValueError(f"the communication model needs at least 2 timed multi-process runs, got {len(d)}")
    a, b = _terms(d["world_size"], gradient_bytes(d), d["n_buckets"], algo)
    x = np.stack([a, b], axis=1)
    y = d["comm_total_s"].to_numpy(float)
    # relative least squares: every run counts the same, whatever its size
    w = 1.0 / np.maximum(y, 1e-12)
    coef = _nnls2(x * w[:, None], y * w)
    pred = x @ coef
    rel = float(np.sqrt(np.mean(((pred - y) / y) ** 2)))
    return CommModel(float(coef[0]), float(coef[1]), algo, int(len(d)), rel)


def extrapolate(model: CommModel, compute_1_s: float, n_params: int, world_sizes, n_buckets: int = 1,
                overlap_fraction: float = 0.0) -> pd.DataFrame:
    """Predicted strong-scaling step time, speedup and efficiency at ``world_sizes``.

    ``compute_1_s``: single-process step time; ``overlap_fraction``: share of communication hidden.
    """
    if not 0 <= overlap_fraction <= 1:
        raise ValueError(f"overlap_fraction: must be in [0, 1], got {overlap_fraction}")
    n = np.asarray(sorted(set(int(v) for v in world_sizes)), dtype=float)
    comm = model.predict(n, n_params * 4, n_buckets)
    exposed = (1 - overlap_fraction) * comm
    t = compute_1_s / n + exposed
    speedup = compute_1_s / t
    return pd.DataFrame({"world_size": n.astype(int), "comm_s": comm, "exposed_s": exposed, "step_time_s": t,
                         "speedup": speedup, "efficiency": speedup / n})


def largest_world_size_at(pred: pd.DataFrame, target_efficiency: float) -> int | None:
    """Largest predicted world size whose efficiency (and every smaller one's) reaches the target."""
    best = None
    for n, e in zip(pred["world_size"], pred["efficiency"]):
        if e + 1e-12 < target_efficiency:
            break
        best = int(n)
    return best


def powers_of_two(up_to: int) -> list[int]:
    """1, 2, 4, ... up to ``up_to``."""
    return [2 ** k for k in range(int(math.log2(up_to)) + 1)]


def extrapolate_study(records: pd.DataFrame, comm_table: pd.DataFrame, max_world_size: int = 4096,
                      algo: str = "ring") -> tuple[CommModel, pd.DataFrame, dict]:
    """Fit the model to a communication study's records and extrapolate its best measured point
    (least exposed communication) to ``max_world_size`` processes.

    Single-process compute ``C`` is estimated as ``T_noop(N) * N`` at that point (the no-op run does the
    same compute without the network, on ``1/N`` of the global batch); the overlap fraction is the
    measured one there. Returns ``(model, prediction, basis)``.
    """
    model = fit(records, algo)
    best = comm_table.loc[comm_table["exposed_s"].idxmin()]
    from kanlib.results import COMM_KEYS

    timed = records[records["comm_hook"] == "timed"]
    for k in COMM_KEYS:  # the timed runs of exactly that point (same model, batch, bucket, algorithm)
        if k in timed and k in best.index:
            timed = timed[timed[k].apply(lambda v, want=best[k]: v == want)]
    if timed.empty:
        raise ValueError("no timed run matches the best communication point")
    n_buckets = int(np.median(timed["n_buckets"].to_numpy(float)))
    n_params = int(timed["n_params"].iloc[0])
    compute_1 = float(best["t_noop_s"]) * int(best["world_size"])
    overlap = float(best["overlap_fraction"]) if np.isfinite(best["overlap_fraction"]) else 0.0
    pred = extrapolate(model, compute_1, n_params, powers_of_two(max_world_size), n_buckets, overlap)
    basis = {"compute_1_s": compute_1, "n_params": n_params, "n_buckets": n_buckets, "overlap_fraction": overlap,
             "bucket_cap_mb": float(best["bucket_cap_mb"]), "measured_world_size": int(best["world_size"])}
    return model, pred, basis
