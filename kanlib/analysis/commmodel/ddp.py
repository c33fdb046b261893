"""DDP's gradient buckets, their overlap with backward, and the link model checked against each timed DDP run.

**DDP** (:func:`ddp_buckets`, :func:`overlap`): gradients are bucketed in reverse registration
order, a parameter never split, a bucket closing once it reaches its cap; buckets become ready as
backward proceeds (at a uniform rate per gradient byte); a bucket's all-reduce starts when it is
ready and the previous one is done; the exposed communication is what is left after backward ends.
:func:`validate_ddp` compares predicted and measured step time and exposed communication for every
timed run that has a no-op twin (:func:`twins`); :func:`transfer_waiting` splits each run's hook time into the
transfer the benchmark predicts for its recorded buckets (:func:`predict_run`) and the waiting for other ranks (skew).

pandas and numpy only: no torch import.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kanlib.analysis.commmodel.links import MIB, CollFit, find_fit, row_algorithm
from kanlib.analysis.groups import hashable


# -- DDP: buckets and overlap with backward --------------------------------------------------------------
def ddp_buckets(param_bytes_in_registration_order, bucket_cap_mb: float, first_bucket_mb: float | None = None,
                ) -> list[int]:
    """Bytes of DDP's gradient buckets in launch order.

    Parameters are taken in reverse registration order (the order backward produces their gradients);
    a bucket closes once it holds at least its cap (the parameter that crosses the cap is included: a
    parameter is never split). The first bucket's cap is ``first_bucket_mb``; None means torch's rule
    for an explicit ``bucket_cap_mb`` (torch 2.13: the same cap, no smaller first bucket; DDP uses a 1
    MiB first bucket only when ``bucket_cap_mb`` is left unset - pass ``first_bucket_mb=1.0`` for that).
    """
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb: must be positive, got {bucket_cap_mb!r}")
    caps = [int((first_bucket_mb if first_bucket_mb is not None else bucket_cap_mb) * MIB), int(bucket_cap_mb * MIB)]
    out, cur = [], 0
    for b in reversed(list(param_bytes_in_registration_order)):
        if b < 0:
            raise ValueError(f"param_bytes_in_registration_order: negative size {b}")
        cur += int(b)
        if cur >= caps[min(len(out), 1)]:
            out.append(cur)
            cur = 0
    if cur:
        out.append(cur)
    return out


def kan_param_bytes(widths, grid_size: int = 5, spline_order: int = 3, model: str = "kan",
                    bytes_per_param: int = 4) -> list[int]:
    """Bytes of each parameter tensor in registration order (what DDP buckets).

    kan (kanlib.model.KANLinear per layer): base_weight ``(out, in)``, spline_weight ``(out, in, G+k)``,
    spline_scaler ``(out, in)``; mlp (kanlib.model.MLP): weight ``(out, in)``, bias ``(out,)``.
    """
    widths = [int(w) for w in widths]
    if len(widths) < 2 or min(widths) < 1:
        raise ValueError(f"widths: need at least 2 positive entries, got {widths}")
    out = []
    for a, b in zip(widths, widths[1:]):
        if model == "kan":
            out += [b * a, b * a * (grid_size + spline_order), b * a]
        elif model == "mlp":
            out += [b * a, b]
        else:
            raise ValueError(f"model: unknown value {model!r}; choose kan or mlp")
    return [n * bytes_per_param for n in out]


def overlap(bucket_bytes, backward_s: float, transfer_s) -> dict:
    """Overlap of bucket all-reduces with backward.

    bucket_bytes: bytes of each bucket in launch order; backward_s: backward compute time (s);
    transfer_s: seconds of each bucket's all-reduce (same length). Bucket k is ready at
    ``backward_s * (bytes of buckets 0..k) / total``; it starts when ready and the previous one is
    done. Returns ``transfer_s`` (sum), ``in_flight_s`` (union of the intervals), ``end_s`` (last end,
    from the start of backward) and ``exposed_s = max(0, end_s - backward_s)``.
    """
    b = np.asarray(bucket_bytes, dtype=float)
    t = np.asarray(transfer_s, dtype=float)
    if b.shape != t.shape:
        raise ValueError(f"transfer_s: one per bucket, got {t.shape} for {b.shape} buckets")
    if b.size == 0:
        return {"transfer_s": 0.0, "in_flight_s": 0.0, "end_s": 0.0, "exposed_s": 0.0}
    ready = backward_s * np.cumsum(b) / b.sum()
    end, spans = 0.0, []
    for r, dt in zip(ready, t):
        start = max(r, end)
        end = start + dt
        spans.append((start, end))
    in_flight = sum(e - s for s, e in _merge(spans))
    return {"transfer_s": float(t.sum()), "in_flight_s": float(in_flight), "end_s": float(end),
            "exposed_s": float(max(0.0, end - backward_s))}


def _merge(spans):
    out = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


# -- validation on DDP runs ------------------------------------------------------------------------------
TWIN_KEYS = ("nnodes", "nproc_per_node", "model", "widths", "grid_size", "spline_order", "global_batch",
              "bucket_cap_mb", "nccl_algo", "backend", "device", "kan_impl", "precision", "gradient_as_bucket_view",
              "static_graph", "grad_accum_steps", "task")


def twins(records: pd.DataFrame) -> list[tuple[dict, pd.DataFrame, pd.DataFrame]]:
    """``(point, timed runs, no-op runs)`` for every configuration with both (the no-op twin of an
    emulated run is the same configuration without emulation)."""
    keys = [k for k in TWIN_KEYS if k in records]
    d = records.copy()
    for k in keys:
        d[k] = d[k].map(hashable)
    out = []
    for key, g in d.groupby(keys, dropna=False, sort=True):
        noop = g[g["comm_hook"] == "noop"]
        timed = g[g["comm_hook"] == "timed"]
        if noop.empty or timed.empty:
            continue
        emu = [c for c in ("emulate_latency_s", "emulate_bandwidth_bytes_per_s") if c in timed]
        for emu_key, t in (timed.groupby(emu, dropna=False) if emu else [((0.0, 0.0), timed)]):
            emu_key = emu_key if isinstance(emu_key, tuple) else (emu_key,)
            point = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
            point.update(dict(zip(emu, emu_key)))
            out.append((point, t, noop))
    return out


def validate_ddp(records: pd.DataFrame, fits: dict[tuple, CollFit]) -> pd.DataFrame:
    """Predicted against measured step time and exposed communication for every timed DDP run with a
    no-op twin (the parity table).

    Per timed run: measured ``step_time_s`` and ``exposed_s = step_time_s - T_noop`` (T_noop, backward_noop_s:
    medians of the twin's runs); predicted ``pred_exposed_s`` from :func:`overlap` of the run's recorded
    ``bucket_bytes`` with the twin's backward time and the matching collbench fit, and
    ``pred_step_time_s = T_noop + pred_exposed_s``; relative errors ``step_rel_err`` and
    ``exposed_rel_err`` (NaN when the measured exposure is 0), and ``why`` when no fit matches.
    """
    rows = []
    for point, timed, noop in twins(records):
        t_noop = float(np.median(noop["step_time_s"].to_numpy(float)))
        bwd = float(np.median(noop["backward_s"].to_numpy(float))) if "backward_s" in noop else math.nan
        for _, r in timed.iterrows():
            row = {**{k: point.get(k) for k in point}, "run_key": r.get("run_key"), "placement":
                   f"{int(r['nnodes'])}x{int(r['nproc_per_node'])}", "t_noop_s": t_noop, "backward_noop_s": bwd,
                   "step_time_s": float(r["step_time_s"]), "exposed_s": float(r["step_time_s"]) - t_noop}
            pred = predict_run(r, fits, bwd)
            row.update(pred)
            row["pred_step_time_s"] = t_noop + pred["pred_exposed_s"]
            row["step_rel_err"] = (row["pred_step_time_s"] - row["step_time_s"]) / row["step_time_s"]
            row["exposed_rel_err"] = ((pred["pred_exposed_s"] - row["exposed_s"]) / row["exposed_s"]
                                      if row["exposed_s"] > 0 else math.nan)
            rows.append(row)
    return pd.DataFrame(rows)


def predict_run(r, fits, backward_s: float) -> dict:
    """Transfer, in-flight and exposed time the fit predicts for one timed DDP record ``r``."""
    nan = {"pred_transfer_s": math.nan, "pred_in_flight_s": math.nan, "pred_exposed_s": math.nan,
           "fit": None, "why": None}
    buckets = r.get("bucket_bytes")
    if not isinstance(buckets, (list, tuple)) or not buckets:
        return {**nan, "why": "the record has no bucket_bytes"}
    algo = row_algorithm(r.get("backend", ""), r.get("nccl_algo", ""), r.get("nccl_algo_used"))
    nnodes, ppn = int(r["nnodes"]), int(r["nproc_per_node"])
    f = find_fit(fits, r.get("backend", ""), r.get("device", "cpu"), algo, nnodes,
                 r.get("emulate_latency_s", 0.0), r.get("emulate_bandwidth_bytes_per_s", 0.0))
    if f is None:
        return {**nan, "why": f"no collbench fit for {r.get('backend')}/{r.get('device')}/{algo} at "
                              f"{nnodes}x{ppn} with this run's emulated link"}
    try:
        t = f.model.time_s(np.asarray(buckets, float), nnodes, ppn)
    except ValueError as e:
        return {**nan, "fit": f.model.label, "why": str(e)}
    ov = overlap(buckets, backward_s if math.isfinite(backward_s) else 0.0, t)
    return {"pred_transfer_s": ov["transfer_s"], "pred_in_flight_s": ov["in_flight_s"],
            "pred_exposed_s": ov["exposed_s"], "fit": f.model.label, "why": None}


def transfer_waiting(records: pd.DataFrame, fits: dict[tuple, CollFit]) -> pd.DataFrame:
    """Per timed DDP run: the hook's ``comm_total_s`` split into ``transfer_s`` (what the collbench fit
    predicts for the run's recorded buckets, summed) and ``waiting_s = comm_total_s - transfer_s`` (waiting
    for other ranks: skew; negative when the fit over-predicts), with ``placement``."""
    d = records[(records["comm_hook"] == "timed") & records["comm_total_s"].notna()] if "comm_hook" in records \
        else records.iloc[0:0]
    rows = []
    for _, r in d.iterrows():
        pred = predict_run(r, fits, 0.0)
        rows.append({"run_key": r.get("run_key"), "placement": f"{int(r['nnodes'])}x{int(r['nproc_per_node'])}",
                     "world_size": int(r["world_size"]), "bucket_cap_mb": r.get("bucket_cap_mb"),
                     "n_buckets": r.get("n_buckets"), "comm_total_s": float(r["comm_total_s"]),
                     "transfer_s": pred["pred_transfer_s"],
                     "waiting_s": float(r["comm_total_s"]) - pred["pred_transfer_s"],
                     "emulate_latency_s": float(r.get("emulate_latency_s") or 0.0),
                     "emulate_bandwidth_bytes_per_s": float(r.get("emulate_bandwidth_bytes_per_s") or 0.0),
                     "emulated_s": r.get("emulated_s"), "fit": pred["fit"], "why": pred["why"]})
    return pd.DataFrame(rows)


def transfer_waiting_by_placement(table: pd.DataFrame) -> pd.DataFrame:
    """Medians of :func:`transfer_waiting` per placement, bucket size and emulated link (never pooled), with the
    waiting share of the hook time."""
    if table.empty:
        return table
    keys = [k for k in ("placement", "bucket_cap_mb", "emulate_latency_s", "emulate_bandwidth_bytes_per_s")
            if k in table]
    g = table.groupby(keys, as_index=False, dropna=False).agg(
        n_runs=("comm_total_s", "size"), comm_total_s=("comm_total_s", "median"),
        transfer_s=("transfer_s", "median"), waiting_s=("waiting_s", "median"))
    g["waiting_fraction"] = g["waiting_s"] / g["comm_total_s"]
    return g

