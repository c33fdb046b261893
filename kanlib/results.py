"""Analysis of result records: loading them into tidy DataFrames, and the derived quantities of the
study (speedup, efficiency, Karp-Flatt, Amdahl fits, bootstrap intervals, exposed communication).

Runtime code never imports this module (a rank imports no pandas); what a run writes is defined in
kanlib.records. Derived quantities are computed here from records and never stored in them.
"""

from __future__ import annotations

import glob
import json
import os
import warnings

import numpy as np
import pandas as pd

from kanlib.records import (MANIFEST_NAME, RECORD_NAME, STEP_COLUMNS, STEPS_NAME, RecordError, check_record,
                            read_manifest_rows, read_steps_rows)


class NoRecordsError(FileNotFoundError):
    """No record was found under the given folder."""


# -- loading -------------------------------------------------------------------------------
def find_record_files(root: str) -> list[str]:
    """Every ``record.json`` below ``root`` (sorted)."""
    return sorted(glob.glob(os.path.join(root, "**", RECORD_NAME), recursive=True))


def load_records(root: str, study: str | None = None, strict: bool = False) -> pd.DataFrame:
    """All run records under ``root`` as one row each (nested ``env`` flattened as ``env.X``).

    A record that cannot be read (truncated, not JSON, not an object) or fails
    :func:`kanlib.records.check_record` (unknown schema version, a NaN, zero or negative step time,
    a non-numeric measurement) is skipped and named in ``df.attrs['bad']`` as ``(file, line, reason)`` with a warning; with
    ``strict=True`` it raises :class:`RecordError`. No record at all raises
    :class:`NoRecordsError` saying where it looked.
    """
    files = find_record_files(root)
    rows, bad = [], []
    for path in files:
        try:
            with open(path) as f:
                text = f.read()
            rec = json.loads(text)
            why = check_record(rec)
            if why:
                raise ValueError(why)
        except (OSError, ValueError) as e:
            line = getattr(e, "lineno", None)
            reason = getattr(e, "msg", None) or str(e)
            if strict:
                raise RecordError(f"{path}" + (f", line {line}" if line else "") + f": {reason}") from e
            bad.append((path, line, reason))
            continue
        if study is not None and rec.get("study") != study:
            continue
        rows.append(_flatten(rec))
    if bad:
        warnings.warn(f"skipped {len(bad)} unreadable record(s): "
                      + "; ".join(f"{p} line {ln}: {r}" for p, ln, r in bad), stacklevel=2)
    if not rows:
        what = f" of study {study!r}" if study else ""
        raise NoRecordsError(f"no records{what} under {os.path.abspath(root)}"
                             + (f" ({len(bad)} unreadable)" if bad else ""))
    df = pd.DataFrame(rows)
    if "world_size" in df:
        df = df.sort_values(["study", "world_size", "repeat"], kind="stable").reset_index(drop=True)
    df.attrs["bad"] = bad
    return df


def load_steps(run_dir: str) -> pd.DataFrame:
    """The per-step rows of one run (long format).

    A last line cut short by a crash is dropped and named in ``df.attrs['bad']`` as
    ``(file, line, reason)``; so is any other row that cannot be read.
    """
    path = os.path.join(run_dir, STEPS_NAME)
    rows, bad = read_steps_rows(path)
    df = pd.DataFrame(rows, columns=STEP_COLUMNS)
    for c in STEP_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    df = df.astype({"step": "int64", "measured": "int64"})
    df["attempt"] = df["attempt"].fillna(0).astype("int64")
    df.attrs["bad"] = bad
    if bad:
        warnings.warn(f"{path}: skipped {len(bad)} unreadable row(s): "
                      + "; ".join(f"line {ln}: {r}" for _, ln, r in bad), stacklevel=2)
    return df


def load_manifest(path: str) -> pd.DataFrame:
    """Rows of a manifest (or of ``<dir>/manifest.jsonl``) as a DataFrame, in the order written.

    Lines that are not JSON objects (a last line cut short, garbage) are skipped and named in
    ``df.attrs['bad']`` as ``(file, line, reason)``. A missing file gives an empty frame.
    """
    if os.path.isdir(path):
        path = os.path.join(path, MANIFEST_NAME)
    rows, bad = read_manifest_rows(path)
    if bad:
        warnings.warn(f"{path}: skipped {len(bad)} unreadable line(s): "
                      + "; ".join(f"line {ln}: {r}" for _, ln, r in bad), stacklevel=2)
    df = pd.DataFrame(rows, columns=None if rows else ["run_key", "status"])
    df.attrs["bad"] = bad
    return df


def _flatten(rec: dict) -> dict:
    out = {}
    for k, v in rec.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                out[f"{k}.{k2}"] = v2
        elif isinstance(v, list):
            out[k] = tuple(v)
        else:
            out[k] = v
    return out


# -- statistics ----------------------------------------------------------------------------
def bootstrap_ci(values, stat=np.median, n_boot: int = 2000, level: float = 0.95, seed: int = 0):
    """Percentile bootstrap interval of ``stat`` over ``values``: ``(low, high)``.

    With one value the interval is that value on both sides (no spread can be estimated).
    """
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return float("nan"), float("nan")
    if a.size == 1:
        return float(a[0]), float(a[0])
    rng = np.random.default_rng(seed)
    boots = stat(a[rng.integers(0, a.size, size=(n_boot, a.size))], axis=1)
    alpha = (1 - level) / 2
    return float(np.quantile(boots, alpha)), float(np.quantile(boots, 1 - alpha))


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


def _topology(g: pd.DataFrame) -> dict:
    """Nodes x processes per node of a group of runs at one world size, and whether it crosses nodes."""
    nodes = int(g["nnodes"].max()) if "nnodes" in g else 1
    ppn = int(g["nproc_per_node"].max()) if "nproc_per_node" in g else int(g["world_size"].max())
    return {"nnodes": nodes, "nproc_per_node": ppn, "topology": f"{nodes}x{ppn}",
            "inter_node": nodes > 1}


def _median_ci(v, n_boot: int, seed: int) -> tuple[float, float, float]:
    lo, hi = bootstrap_ci(v, n_boot=n_boot, seed=seed)
    return float(np.median(v)), lo, hi


def scaling_table(df: pd.DataFrame, metric: str = "step_time_s", by: tuple[str, ...] = (),
                  n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Strong-scaling table: one row per (``by`` groups, world size) with the median of ``metric``
    over repeats, its bootstrap 95% interval, the speedup ``T(1) / T(N)`` (with an interval from
    resampling both), the efficiency ``S / N`` and the Karp-Flatt serial fraction.

    ``T(1)`` is the median at the smallest world size of the group (normally 1); speedup and
    efficiency are relative to it, scaled by that world size.
    """
    if metric not in df:
        raise KeyError(f"column {metric!r} is not in the records (have: {', '.join(df.columns)})")
    rows = []
    groups = df.groupby(list(by), dropna=False) if by else [((), df)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        rng = np.random.default_rng(seed)  # each group's interval depends on its own data only
        sizes = sorted(g["world_size"].unique())
        n0 = sizes[0]
        base = g.loc[g["world_size"] == n0, metric].to_numpy(float)
        t0 = float(np.median(base))
        for n in sizes:
            v = g.loc[g["world_size"] == n, metric].to_numpy(float)
            med, lo, hi = _median_ci(v, n_boot, seed)
            boots = (np.median(base[rng.integers(0, base.size, (n_boot, base.size))], axis=1)
                     / np.median(v[rng.integers(0, v.size, (n_boot, v.size))], axis=1))
            sp = t0 / med * n0
            if n == n0:  # the baseline's speedup is n0 by definition: no interval to estimate
                boots = np.full(2, sp / n0)
            rows.append({**dict(zip(by, key)), "world_size": int(n), **_topology(g[g["world_size"] == n]),
                         "n_runs": int(v.size),
                         metric: med, f"{metric}_lo": lo, f"{metric}_hi": hi,
                         "speedup": sp, "speedup_lo": float(np.quantile(boots, 0.025)) * n0,
                         "speedup_hi": float(np.quantile(boots, 0.975)) * n0,
                         "efficiency": sp / n})
            rows[-1]["efficiency_lo"] = rows[-1]["speedup_lo"] / n
            rows[-1]["efficiency_hi"] = rows[-1]["speedup_hi"] / n
    out = pd.DataFrame(rows)
    out["karp_flatt"] = karp_flatt(out["speedup"], out["world_size"])
    return out


def weak_scaling_table(df: pd.DataFrame, by: tuple[str, ...] = ("local_batch",), n_boot: int = 2000,
                       seed: int = 0) -> pd.DataFrame:
    """Weak scaling at a fixed per-process batch: per (``by``, world size) the median throughput
    ``X(N) = global_batch / T(N)`` with its bootstrap interval, the per-process throughput
    ``X(N) / N``, the weak-scaling efficiency ``E_w = X(N) / (N X(N0))`` against the smallest world
    size ``N0`` (normally 1), and ``E_w,multi = X(N) N1 / (N X(N1))`` against the first
    multi-process point ``N1`` (the study saw a drop from 1 to several GPUs, then stability).
    """
    df = df.copy()
    df["local_batch"] = df["global_batch"] // df["world_size"]
    df["throughput"] = df["global_batch"] / df["step_time_s"]
    rows = []
    for key, g in df.groupby(list(by), dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        sizes = sorted(g["world_size"].unique())
        x = {n: g.loc[g["world_size"] == n, "throughput"].to_numpy(float) for n in sizes}
        n0 = sizes[0]
        multi = [n for n in sizes if n > 1]
        n1 = multi[0] if multi else None
        x0 = float(np.median(x[n0]))
        for n in sizes:
            med, lo, hi = _median_ci(x[n], n_boot, seed)
            row = {**dict(zip(by, key)), "world_size": int(n), **_topology(g[g["world_size"] == n]),
                   "n_runs": int(x[n].size),
                   "throughput": med, "throughput_lo": lo, "throughput_hi": hi,
                   "per_process_throughput": med / n,
                   "weak_efficiency": med * n0 / (n * x0),
                   "weak_efficiency_multi": (med * n1 / (n * float(np.median(x[n1])))
                                             if n1 is not None and n >= n1 else np.nan)}
            rows.append(row)
    return pd.DataFrame(rows)


COMM_KEYS = ("world_size", "nnodes", "nproc_per_node", "bucket_cap_mb", "nccl_algo", "model", "widths",
             "global_batch")


def communication_table(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Exposed communication by the no-op-hook method, per configuration point.

    Each point (same config but for ``comm_hook``) needs runs with ``comm_hook='timed'`` (real
    all-reduce, each bucket timed) and ``comm_hook='noop'`` (same bucketing, no network). With
    medians over repeats:

    - ``t_allreduce_s``: step time with the all-reduce; ``t_noop_s``: step time without it;
    - ``comm_total_s``: summed bucket all-reduce time per step (includes queueing);
    - ``exposed_raw_s = t_allreduce_s - t_noop_s``: the communication the step waits for;
    - ``exposed_s``: the same clipped to ``[0, comm_total_s]`` (outside it is timing noise;
      ``exposed_clipped`` says when that happened);
    - ``overlap_s = comm_total_s - exposed_s``; ``overlap_fraction = overlap_s / comm_total_s``;
    - ``overhead_fraction = exposed_s / t_allreduce_s`` (the study's 'communication overhead');
    - ``compute_s = t_allreduce_s - exposed_s``.
    """
    need = {"timed", "noop"}
    have = set(df["comm_hook"].unique()) if "comm_hook" in df else set()
    if not need <= have:
        raise KeyError(f"communication_table needs runs with comm_hook 'timed' and 'noop'; have {sorted(have)}")
    keys = [k for k in COMM_KEYS if k in df]
    rows = []
    for key, g in df.groupby(keys, dropna=False):
        t = g.loc[g["comm_hook"] == "timed"]
        z = g.loc[g["comm_hook"] == "noop"]
        if t.empty or z.empty:
            continue
        ta, ta_lo, ta_hi = _median_ci(t["step_time_s"].to_numpy(float), n_boot, seed)
        tn, tn_lo, tn_hi = _median_ci(z["step_time_s"].to_numpy(float), n_boot, seed)
        ct = float(np.median(t["comm_total_s"].to_numpy(float)))
        raw = ta - tn
        exposed = float(np.clip(raw, 0.0, ct))
        rows.append({**dict(zip(keys, key)), "n_runs": int(min(len(t), len(z))),
                     "t_allreduce_s": ta, "t_allreduce_lo": ta_lo, "t_allreduce_hi": ta_hi,
                     "t_noop_s": tn, "t_noop_lo": tn_lo, "t_noop_hi": tn_hi,
                     "comm_total_s": ct, "exposed_raw_s": raw, "exposed_s": exposed,
                     "exposed_clipped": bool(exposed != raw),
                     "overlap_s": ct - exposed, "overlap_fraction": (ct - exposed) / ct if ct > 0 else np.nan,
                     "overhead_fraction": exposed / ta, "compute_s": ta - exposed})
    return pd.DataFrame(rows)


def model_size_table(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Model-size scaling: per (model, widths, grid size) the parameter count, median step time with
    its interval, peak memory, ``params_per_byte = n_params / peak_mem_bytes``,
    ``params_per_state_byte = n_params / model_state_bytes`` and ``time_per_param_s = step_time / n_params``.
    """
    keys = [k for k in ("model", "widths", "grid_size", "spline_order", "global_batch", "world_size") if k in df]
    rows = []
    for key, g in df.groupby(keys, dropna=False):
        st, lo, hi = _median_ci(g["step_time_s"].to_numpy(float), n_boot, seed)
        n = int(g["n_params"].iloc[0])
        mem = float(np.median(g["peak_mem_bytes"].to_numpy(float)))
        point = dict(zip(keys, key))
        rows.append({**point, "n_runs": len(g), "n_params": n,
                     "depth": len(point["widths"]) - 1 if "widths" in point else np.nan, "step_time_s": st, "step_time_lo": lo, "step_time_hi": hi,
                     "peak_mem_bytes": mem, "model_state_bytes": float(g["model_state_bytes"].iloc[0]),
                     "params_per_byte": n / mem, "params_per_state_byte": n / float(g["model_state_bytes"].iloc[0]),
                     "time_per_param_s": st / n})
    return pd.DataFrame(rows).sort_values(["model", "n_params"]).reset_index(drop=True)
