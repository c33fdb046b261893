"""Deployment guidelines computed from records (never written by hand).

Given a target parallel efficiency and a per-process memory and step-time budget, answer:
1. the largest world size whose strong-scaling efficiency reaches the target;
2. the smallest per-process batch whose weak-scaling efficiency at the largest measured world size
   reaches it;
3. the bucket size (and NCCL algorithm) that minimises exposed communication at the largest
   measured world size;
4. the model size beyond which memory rather than step time limits a process (affine fits of peak
   memory and step time against the parameter count, per model kind).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kanlib import results


@dataclass
class Guidelines:
    """The answers as a table (question, answer, value, basis) and as generated sentences."""

    table: pd.DataFrame
    sentences: list[str] = field(default_factory=list)

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(s)}</li>" for s in self.sentences)
        return self.table.to_html(index=False) + f"<ul>{items}</ul>"

    def __str__(self) -> str:
        return "\n".join(self.sentences)


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.3g} {unit}"
        b /= 1024
    return f"{b:.3g} TiB"


def largest_efficient_world_size(strong: pd.DataFrame, target: float) -> tuple[int, float]:
    """Largest N whose efficiency, and that of every smaller measured N, reaches ``target`` (a
    lucky point beyond a failing one does not count). Returns ``(N, efficiency at N)``; the
    smallest measured N (efficiency 1 by definition) when no larger one qualifies."""
    t = strong.groupby("world_size")["efficiency"].median().sort_index()
    best = (int(t.index[0]), float(t.iloc[0]))
    for n, e in t.items():
        if e + 1e-12 < target:
            break
        best = (int(n), float(e))
    return best


def smallest_efficient_batch(weak: pd.DataFrame, target: float) -> tuple[int | None, int, float]:
    """Smallest per-process batch whose weak-scaling efficiency at the largest measured world size
    reaches ``target``. Returns ``(batch, N, efficiency)``; batch None when none does."""
    n_max = int(weak["world_size"].max())
    at = weak[weak["world_size"] == n_max].sort_values("local_batch")
    ok = at[at["weak_efficiency"] + 1e-12 >= target]
    if ok.empty:
        best = at.loc[at["weak_efficiency"].idxmax()]
        return None, n_max, float(best["weak_efficiency"])
    row = ok.iloc[0]
    return int(row["local_batch"]), n_max, float(row["weak_efficiency"])


def best_bucket(comm: pd.DataFrame) -> dict:
    """The bucket size (and NCCL algorithm) with the least exposed communication at the largest N."""
    n_max = int(comm["world_size"].max())
    at = comm[comm["world_size"] == n_max]
    row = at.loc[at["exposed_s"].idxmin()]
    return {"world_size": n_max, "bucket_cap_mb": float(row["bucket_cap_mb"]),
            "nccl_algo": row.get("nccl_algo", "") or "default", "exposed_s": float(row["exposed_s"]),
            "overhead_fraction": float(row["overhead_fraction"])}


def memory_or_time_limit(size: pd.DataFrame, memory_budget_bytes: float, step_time_budget_s: float,
                         model: str = "kan") -> dict:
    """Affine fits ``mem = m0 + m1 P`` and ``time = t0 + t1 P`` over the model-size points of
    ``model``; ``P_mem`` and ``P_time`` are the parameter counts at which each budget is reached.
    Memory is the limit beyond ``P_mem`` when ``P_mem < P_time``, else time is."""
    t = size[size["model"] == model]
    if len(t) < 2:
        raise ValueError(f"model-size guideline needs at least 2 {model} points, got {len(t)}")
    p = t["n_params"].to_numpy(float)
    m1, m0 = np.polyfit(p, t["peak_mem_bytes"].to_numpy(float), 1)
    t1, t0 = np.polyfit(p, t["step_time_s"].to_numpy(float), 1)
    p_mem = (memory_budget_bytes - m0) / m1 if m1 > 0 else float("inf")
    p_time = (step_time_budget_s - t0) / t1 if t1 > 0 else float("inf")
    limit = "memory" if p_mem < p_time else "time"
    return {"model": model, "p_mem": float(p_mem), "p_time": float(p_time), "limit": limit,
            "limit_params": float(min(p_mem, p_time)), "bytes_per_param": float(m1),
            "seconds_per_param": float(t1)}


def compute_guidelines(df: pd.DataFrame, target_efficiency: float = 0.8,
                       memory_budget_bytes: float = 80 * 2**30, step_time_budget_s: float = 1.0) -> Guidelines:
    """All guidelines that the records in ``df`` (any mix of studies) allow."""
    if not 0 < target_efficiency <= 1:
        raise ValueError(f"target_efficiency: must be in (0, 1], got {target_efficiency}")
    rows, text = [], []
    studies = set(df["study"].unique())
    if "strong_scaling" in studies:
        strong_all = results.scaling_table(df[df["study"] == "strong_scaling"], by=("model",))
        for model, strong in strong_all.groupby("model"):
            n, e = largest_efficient_world_size(strong, target_efficiency)
            n_meas = int(strong["world_size"].max())
            fit = results.fit_amdahl(strong["world_size"], strong["speedup"])
            if n == strong["world_size"].min():
                text.append(f"{model}: no measured multi-process world size reaches {target_efficiency:.0%} "
                            f"strong-scaling efficiency (measured up to N={n_meas}); Amdahl fit: serial "
                            f"fraction {fit:.3f}.")
            else:
                text.append(f"{model}: strong scaling keeps at least {target_efficiency:.0%} efficiency up to "
                            f"N={n} processes (efficiency {e:.1%} there; measured up to N={n_meas}; Amdahl "
                            f"serial fraction {fit:.3f}).")
            rows.append({"question": f"{model}: largest world size with efficiency >= {target_efficiency:g}",
                         "answer": str(n), "value": e, "basis": "strong_scaling"})
    if "weak_scaling" in studies:
        weak = results.weak_scaling_table(df[df["study"] == "weak_scaling"])
        b, n, e = smallest_efficient_batch(weak, target_efficiency)
        if b is None:
            text.append(f"No measured per-process batch reaches {target_efficiency:.0%} weak-scaling efficiency "
                        f"at N={n} (best {e:.1%}): use larger batches per process.")
        else:
            text.append(f"Use at least {b} samples per process: that keeps weak-scaling efficiency at "
                        f"{e:.1%} at N={n}.")
        rows.append({"question": f"smallest per-process batch with weak efficiency >= {target_efficiency:g}",
                     "answer": "none" if b is None else str(b), "value": e, "basis": "weak_scaling"})
    if "communication" in studies:
        comm = results.communication_table(df[df["study"] == "communication"])
        bb = best_bucket(comm)
        text.append(f"At N={bb['world_size']}, a {bb['bucket_cap_mb']:g} MiB bucket ({bb['nccl_algo']} all-reduce) "
                    f"exposes the least communication: {bb['exposed_s'] * 1e3:.3g} ms per step, "
                    f"{bb['overhead_fraction']:.1%} of the step.")
        rows.append({"question": "bucket size minimising exposed communication",
                     "answer": f"{bb['bucket_cap_mb']:g} MiB ({bb['nccl_algo']})", "value": bb["exposed_s"],
                     "basis": "communication"})
        from kanlib import commmodel

        try:
            model, pred, basis = commmodel.extrapolate_study(df[df["study"] == "communication"], comm)
        except ValueError as e:
            text.append(f"No communication-model extrapolation: {e}.")
        else:
            n_pred = commmodel.largest_world_size_at(pred, target_efficiency)
            if n_pred in (None, 1):
                n_txt = f"that no multi-process world size reaches {target_efficiency:.0%} strong-scaling efficiency"
            else:
                n_txt = f"{target_efficiency:.0%} strong-scaling efficiency up to N={n_pred}"
            bw = (f"bandwidth {model.bandwidth_bytes_per_s:.3g} B/s" if model.beta > 0
                  else "bandwidth not resolved: these runs are latency-bound")
            text.append(f"The alpha-beta model fitted to {model.n_points} timed runs (latency {model.alpha:.3g} s, "
                        f"{bw}, relative error {model.rel_rmse:.0%}) predicts {n_txt} for this model "
                        f"({basis['n_params']} parameters, {basis['overlap_fraction']:.0%} overlap); "
                        f"an optimistic bound that ignores stragglers and congestion.")
            rows.append({"question": f"predicted largest world size with efficiency >= {target_efficiency:g}",
                         "answer": str(n_pred) if n_pred else "1", "value": float(n_pred or 1),
                         "basis": "communication model"})
    if "model_size" in studies:
        size = results.model_size_table(df[df["study"] == "model_size"])
        for model in sorted(set(size["model"])):
            if (size["model"] == model).sum() < 2:
                continue
            lim = memory_or_time_limit(size, memory_budget_bytes, step_time_budget_s, model)
            other = "time" if lim["limit"] == "memory" else "memory"
            other_p = lim["p_time"] if lim["limit"] == "memory" else lim["p_mem"]
            text.append(f"{model}: with {_fmt_bytes(memory_budget_bytes)} and {step_time_budget_s:g} s per step, "
                        f"{lim['limit']} limits a process first, at about {lim['limit_params']:.3g} parameters "
                        f"({other} would allow {other_p:.3g}; {lim['bytes_per_param']:.3g} B and "
                        f"{lim['seconds_per_param']:.3g} s per parameter).")
            rows.append({"question": f"{model}: model size beyond which memory, not time, limits",
                         "answer": (f"{lim['p_mem']:.3g} params" if lim["limit"] == "memory"
                                    else f"time limits first ({lim['p_time']:.3g} params)"),
                         "value": lim["limit_params"], "basis": "model_size"})
    if not rows:
        text.append(f"No study records to derive guidelines from (have studies: {sorted(studies)}).")
    return Guidelines(pd.DataFrame(rows, columns=["question", "answer", "value", "basis"]), text)


def from_out_dir(out_dir: str, **kwargs) -> Guidelines:
    """:func:`compute_guidelines` over every record under ``out_dir``; with none, a Guidelines
    whose only sentence says "no records under ..."."""
    try:
        df = results.load_records(out_dir)
    except results.NoRecordsError as e:
        return Guidelines(pd.DataFrame(columns=["question", "answer", "value", "basis"]), [str(e)])
    return compute_guidelines(df, **kwargs)
