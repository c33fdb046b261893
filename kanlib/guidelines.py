"""Deployment guidelines computed from records (never written by hand), one answer per group of
records (kanlib.results.design: records that differ in configuration are never pooled).

Given a target parallel efficiency and a per-process memory and step-time budget, answer:

1. strong scaling, per work size (model, widths, global batch, ...): the placement - nodes x processes
   per node - with the most processes whose efficiency, and that of every smaller placement of its
   kind (one node, or across nodes), reaches the target; and, per placement, the least work per
   process that reaches it;
2. weak scaling, per group: the smallest per-process batch whose weak-scaling efficiency reaches the
   target at the largest measured world size of each placement;
3. communication, per group: which placement exposes the least communication at each world size
   measured at several placements; the bucket size (and NCCL algorithm) with the least exposed
   communication per placement; the alpha-beta model's extrapolation, fitted per placement;
4. model size, per model: the size beyond which memory rather than step time limits a process.

A NaN, infinite, zero or negative value never meets a target (:func:`meets`). When the data cannot
answer a question, the answer says why (one placement only, too few points, ...), with the best
measured number where there is one.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kanlib import results

COLUMNS = ["question", "group", "answer", "value", "basis"]


@dataclass
class Guidelines:
    """The answers as a table (question, group, answer, value, basis) and as generated sentences."""

    table: pd.DataFrame
    sentences: list[str] = field(default_factory=list)

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(s)}</li>" for s in self.sentences)
        return self.table.to_html(index=False) + f"<ul>{items}</ul>"

    def __str__(self) -> str:
        return "\n".join(self.sentences)


def meets(value, target: float) -> bool:
    """Whether ``value`` reaches ``target``: False for NaN, infinity, zero and negative values, so a
    broken measurement can never make a guideline claim a target is met."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(v) and v > 0 and v + 1e-12 >= target


def _pct(v) -> str:
    return f"{v:.0%}" if np.isfinite(v) else "n/a"


def _ci(row, col: str, lo: str | None = None, hi: str | None = None) -> str:
    lo_v, hi_v = row.get(lo or f"{col}_lo", np.nan), row.get(hi or f"{col}_hi", np.nan)
    return f"{_pct(row[col])} [{_pct(lo_v)}, {_pct(hi_v)}]"


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.3g} {unit}"
        b /= 1024
    return f"{b:.3g} TiB"


def _label(key: dict) -> str:
    """``kan, widths=[2, 32, 1], global_batch=512`` for a group key (model first, bare)."""
    rest = {k: v for k, v in key.items() if k != "model"}
    head = str(key.get("model", ""))
    tail = results.group_label(rest)
    return ", ".join(p for p in (head, tail) if p)


def _group_keys(table: pd.DataFrame, drop=()) -> list[str]:
    return [f for f in table.attrs.get("group_fields", []) if f not in drop and f in table]


# -- strong scaling --------------------------------------------------------------------------
def largest_efficient_world_size(strong: pd.DataFrame, target: float) -> tuple[int, float]:
    """Largest N whose efficiency, and that of every smaller measured N of the same kind of placement,
    reaches ``target`` (a lucky point beyond a failing one does not count). Returns ``(N, efficiency
    at N)``; the smallest measured N (efficiency 1 by definition) when no larger one qualifies."""
    best = largest_efficient_placement(strong, target)
    return int(best["world_size"]), float(best["efficiency"])


def largest_efficient_placement(strong: pd.DataFrame, target: float) -> pd.Series:
    """The row of ``strong`` (one group of :func:`kanlib.results.scaling_table`) with the most processes
    whose efficiency, and that of every smaller placement of its kind (one node, or across nodes),
    meets ``target``; ties go to the higher efficiency. The baseline row when none qualifies."""
    t = strong.sort_values(["world_size", "nnodes"], kind="stable")
    base = t.iloc[0]
    best = base
    for fam in ("one node", "across nodes"):
        chain = t[(t["nnodes"] == 1) if fam == "one node" else (t["nnodes"] > 1)]
        for _, row in chain.iterrows():
            if row["world_size"] == base["world_size"] and row["nnodes"] == base["nnodes"]:
                continue
            if not meets(row["efficiency"], target):
                break
            if (row["world_size"], row["efficiency"]) > (best["world_size"], best["efficiency"]):
                best = row
    return best


def _strong(df: pd.DataFrame, target: float, rows: list, text: list) -> None:
    table = results.scaling_table(df)
    work = {"global_batch", "widths", "n_train", "local_batch"}
    keys = _group_keys(table)
    for key, g in results._groupby(table, keys):
        label = _label(key)
        multi = g[g["world_size"] > 1]
        if multi.empty:
            text.append(f"{label}: strong scaling has no multi-process placement measured, so no placement can be "
                        f"recommended (measured: {', '.join(g['placement'])}).")
            rows.append({"question": f"placement with efficiency >= {target:g}", "group": label,
                         "answer": "not measured: no multi-process placement", "value": np.nan,
                         "basis": "strong_scaling"})
            continue
        best = largest_efficient_placement(g, target)
        fit = results.fit_amdahl(g["world_size"], g["speedup"])
        fit_txt = f"Amdahl serial fraction {fit:.3f}" if np.isfinite(fit) else "no Amdahl fit"
        if best["world_size"] == g["world_size"].min():
            top = multi.loc[multi["efficiency"].fillna(-1).idxmax()]
            answer = (f"none of {', '.join(multi['placement'])}: best {top['placement']} at "
                      f"{_ci(top, 'efficiency')}")
            text.append(f"{label}: no multi-process placement reaches {target:.0%} strong-scaling efficiency; the best "
                        f"is {top['placement']} ({int(top['nnodes'])} node(s) x {int(top['nproc_per_node'])} "
                        f"processes) at {_ci(top, 'efficiency')}, speedup {top['speedup']:.2f}x; {fit_txt}. "
                        f"More work per process is needed at this size.")
            value = float(top["efficiency"])
        else:
            answer = (f"{best['placement']} ({int(best['nnodes'])} node(s) x {int(best['nproc_per_node'])} processes): "
                      f"{_ci(best, 'efficiency')}")
            others = multi[(multi["placement"] != best["placement"])]
            alt = "; ".join(f"{r['placement']} {_ci(r, 'efficiency')}" for _, r in others.iterrows())
            text.append(f"{label}: use up to {best['placement']} ({int(best['nnodes'])} node(s) x "
                        f"{int(best['nproc_per_node'])} processes per node), which keeps {_ci(best, 'efficiency')} "
                        f"efficiency (speedup {best['speedup']:.2f}x)" + (f"; also measured: {alt}" if alt else "")
                        + f"; {fit_txt}.")
            value = float(best["efficiency"])
        rows.append({"question": f"placement with efficiency >= {target:g}", "group": label, "answer": answer,
                     "value": value, "basis": "strong_scaling"})
    # the least work per process that reaches the target, per placement (across work sizes)
    other = [k for k in keys if k not in work and k != "model"]
    if not any(k in work for k in keys):
        return
    for key, g in results._groupby(table[table["world_size"] > 1], ["model", "placement"] + other):
        g = g.sort_values("work_per_process_s")
        if len(g) < 2:
            continue
        label = _label({k: v for k, v in key.items() if k != "placement"})
        ok = g[[meets(e, target) for e in g["efficiency"]]]
        if ok.empty:
            top = g.loc[g["efficiency"].fillna(-1).idxmax()]
            answer = (f"none of {len(g)} work sizes (best {_ci(top, 'efficiency')} at "
                      f"{top['work_per_process_s'] * 1e3:.3g} ms per process)")
            text.append(f"{label}, {key['placement']}: none of the {len(g)} measured work sizes reaches {target:.0%}; "
                        f"the most work per process ({top['work_per_process_s'] * 1e3:.3g} ms, widths "
                        f"{list(top['widths'])}, global batch {int(top['global_batch'])}) gives {_ci(top, 'efficiency')}.")
            value = float(top["efficiency"])
        else:
            r = ok.iloc[0]
            answer = (f"{r['work_per_process_s'] * 1e3:.3g} ms per process (widths {list(r['widths'])}, global batch "
                      f"{int(r['global_batch'])}): {_ci(r, 'efficiency')}")
            text.append(f"{label}, {key['placement']}: {target:.0%} efficiency needs at least "
                        f"{r['work_per_process_s'] * 1e3:.3g} ms of work per process per step (measured: widths "
                        f"{list(r['widths'])}, global batch {int(r['global_batch'])}, {_ci(r, 'efficiency')}).")
            value = float(r["work_per_process_s"])
        rows.append({"question": f"{key['placement']}: least work per process with efficiency >= {target:g}",
                     "group": label, "answer": answer, "value": value, "basis": "strong_scaling"})


# -- weak scaling ----------------------------------------------------------------------------
def smallest_efficient_batch(weak: pd.DataFrame, target: float, placement: str | None = None
                             ) -> tuple[int | None, int, float]:
    """Smallest per-process batch whose weak-scaling efficiency reaches ``target`` at the largest
    measured world size (of ``placement``, when given). Returns ``(batch, N, efficiency)``; batch None
    when none does (efficiency then the best measured, NaN if none is finite)."""
    w = weak if placement is None else weak[weak["placement"] == placement]
    n_max = int(w["world_size"].max())
    at = w[w["world_size"] == n_max].sort_values("local_batch")
    ok = at[[meets(e, target) for e in at["weak_efficiency"]]]
    if ok.empty:
        finite = at["weak_efficiency"].where(np.isfinite(at["weak_efficiency"]))
        return None, n_max, float(finite.max()) if finite.notna().any() else float("nan")
    row = ok.iloc[0]
    return int(row["local_batch"]), n_max, float(row["weak_efficiency"])


def _weak(df: pd.DataFrame, target: float, rows: list, text: list) -> None:
    table = results.weak_scaling_table(df)
    keys = _group_keys(table, drop=("local_batch",))
    for key, g in results._groupby(table, keys):
        label = _label(key)
        for p in sorted(set(g.loc[g["world_size"] > 1, "placement"]), key=results.placement_key):
            b, n, e = smallest_efficient_batch(g, target, p)
            sizes = sorted(g.loc[g["placement"] == p, "local_batch"].unique())
            if b is None:
                best = g[(g["placement"] == p)].sort_values("weak_efficiency").iloc[-1]
                answer = f"none of {', '.join(map(str, sizes))}: best {int(best['local_batch'])} at {_ci(best, 'weak_efficiency')}"
                text.append(f"{label}, {p}: no measured per-process batch ({', '.join(map(str, sizes))}) reaches "
                            f"{target:.0%} weak-scaling efficiency at N={n}; the best, {int(best['local_batch'])} "
                            f"samples per process, gives {_ci(best, 'weak_efficiency')}: use larger batches per process.")
            else:
                row = g[(g["placement"] == p) & (g["local_batch"] == b)].iloc[0]
                answer = f"{b} samples per process: {_ci(row, 'weak_efficiency')}"
                text.append(f"{label}, {p}: use at least {b} samples per process; that keeps weak-scaling efficiency "
                            f"at {_ci(row, 'weak_efficiency')} at N={n}.")
            rows.append({"question": f"{p}: smallest per-process batch with weak efficiency >= {target:g}",
                         "group": label, "answer": answer, "value": e, "basis": "weak_scaling"})


# -- communication ---------------------------------------------------------------------------
def best_bucket(comm: pd.DataFrame, placement: str | None = None) -> dict:
    """The bucket size (and NCCL algorithm) with the least exposed communication at the largest N (of
    ``placement``, when given). Points whose exposed time is not finite are not candidates."""
    c = comm if placement is None else comm[comm["placement"] == placement]
    c = c[np.isfinite(c["exposed_s"].to_numpy(float))]
    if c.empty:
        raise ValueError("best_bucket: no point with a finite exposed communication time")
    n_max = int(c["world_size"].max())
    at = c[c["world_size"] == n_max]
    row = at.loc[at["exposed_s"].idxmin()]
    return {"world_size": n_max, "placement": row["placement"], "bucket_cap_mb": float(row["bucket_cap_mb"]),
            "nccl_algo": row.get("nccl_algo", "") or "default", "exposed_s": float(row["exposed_s"]),
            "overhead_fraction": float(row["overhead_fraction"]), "overhead_lo": float(row.get("overhead_lo", np.nan)),
            "overhead_hi": float(row.get("overhead_hi", np.nan))}


def _comm(df: pd.DataFrame, target: float, rows: list, text: list) -> None:
    from kanlib import commmodel

    table = results.communication_table(df)
    if table.empty:
        text.append("Communication: no point has both a timed and a no-op run, so nothing can be said.")
        return
    keys = _group_keys(table)
    recs = results._placement_cols(df)
    for key, g in results._groupby(table, keys + ["comm_hook", "emulate_latency_s", "emulate_bandwidth_bytes_per_s"]):
        gkey = {k: v for k, v in key.items() if k in keys}
        label = _label(gkey)
        if key["comm_hook"] != "timed":
            label += f", hook {key['comm_hook']}"
        if key["emulate_latency_s"] or key["emulate_bandwidth_bytes_per_s"]:
            label += f", emulated link {key['emulate_latency_s'] * 1e6:g} us"
        # (a) which placement exposes the least, at each world size measured at several placements
        for n, gn in g.groupby("world_size"):
            per = gn[np.isfinite(gn["exposed_s"].to_numpy(float))].sort_values("exposed_s")
            per = per.drop_duplicates("placement")  # each placement's best bucket
            if per["placement"].nunique() < 2:
                continue
            top = per.iloc[0]
            rest = "; ".join(f"{r['placement']} {r['exposed_s'] * 1e3:.3g} ms ({_ci(r, 'overhead_fraction', 'overhead_lo', 'overhead_hi')})"
                             for _, r in per.iloc[1:].iterrows())
            answer = (f"{top['placement']}: {top['exposed_s'] * 1e3:.3g} ms exposed "
                      f"({_ci(top, 'overhead_fraction', 'overhead_lo', 'overhead_hi')} of the step)")
            text.append(f"{label}: at N={n}, {top['placement']} exposes the least communication, "
                        f"{top['exposed_s'] * 1e3:.3g} ms per step ({_ci(top, 'overhead_fraction', 'overhead_lo', 'overhead_hi')} "
                        f"of the step, {top['bucket_cap_mb']:g} MiB buckets); {rest}.")
            rows.append({"question": f"N={n}: placement exposing the least communication", "group": label,
                         "answer": answer, "value": float(top["exposed_s"]), "basis": "communication"})
        if g.groupby("world_size")["placement"].nunique().max() < 2:
            text.append(f"{label}: every world size was measured at one placement only "
                        f"({', '.join(sorted(set(g['placement'])))}), so placements cannot be compared; add e.g. "
                        f"placements ['1x2', '2x1'].")
        # (b) the best bucket per placement
        for p in sorted(set(g["placement"]), key=results.placement_key):
            try:
                bb = best_bucket(g, p)
            except ValueError as e:
                text.append(f"{label}, {p}: {e}.")
                continue
            n_buckets = g[(g["placement"] == p) & (g["world_size"] == bb["world_size"])]["bucket_cap_mb"].nunique()
            why = "" if n_buckets > 1 else " (the only bucket size measured)"
            ov = _ci(bb, "overhead_fraction", "overhead_lo", "overhead_hi")
            text.append(f"{label}, {p}: a {bb['bucket_cap_mb']:g} MiB bucket ({bb['nccl_algo']} all-reduce){why} "
                        f"exposes the least communication: {bb['exposed_s'] * 1e3:.3g} ms per step, {ov} of the step.")
            rows.append({"question": f"{p}: bucket size minimising exposed communication", "group": label,
                         "answer": f"{bb['bucket_cap_mb']:g} MiB ({bb['nccl_algo']}){why}: {bb['exposed_s'] * 1e3:.3g} ms",
                         "value": bb["exposed_s"], "basis": "communication"})
            # (c) the communication model, fitted to this group and placement only
            sel = _records_of(recs, {**gkey, "placement": p})
            sel = sel[(sel["comm_hook"].isin([key["comm_hook"], "noop"]))]
            try:
                model, pred, basis = commmodel.extrapolate_study(sel, g[g["placement"] == p])
            except (ValueError, KeyError) as e:
                text.append(f"{label}, {p}: no communication-model extrapolation: {e}.")
                continue
            n_pred = commmodel.largest_world_size_at(pred, target)
            lat = f"latency {model.alpha:.3g} s" if model.alpha > 0 else "latency not resolved by these runs"
            bw = (f"bandwidth {model.bandwidth_bytes_per_s:.3g} B/s" if model.beta > 0
                  else "bandwidth not resolved by these runs (latency-bound)")
            if n_pred is None or n_pred <= 1:
                n_txt = f"that no multi-process world size reaches {target:.0%} strong-scaling efficiency"
                ans = f"none beyond 1 (model; {lat}, {bw})"
            else:
                n_txt = f"{target:.0%} strong-scaling efficiency up to N={n_pred}"
                ans = f"{n_pred} processes (model; {lat}, {bw})"
            text.append(f"{label}, {p}: the alpha-beta model fitted to {model.n_points} timed runs ({lat}, {bw}, "
                        f"relative error {model.rel_rmse:.0%}) predicts {n_txt} for this model "
                        f"({basis['n_params']} parameters, {basis['overlap_fraction']:.0%} overlap); an optimistic "
                        f"bound that ignores stragglers and congestion.")
            rows.append({"question": f"{p}: predicted largest world size with efficiency >= {target:g}",
                         "group": label, "answer": ans, "value": float(n_pred or 1), "basis": "communication model"})


def _records_of(recs: pd.DataFrame, key: dict) -> pd.DataFrame:
    """The records whose fields equal ``key`` (list and tuple values compare as tuples)."""
    sel = pd.Series(True, index=recs.index)
    for k, v in key.items():
        if k not in recs:
            continue
        want = results._hashable(v)
        col = recs[k].map(results._hashable)
        if isinstance(want, float) and math.isnan(want):
            sel &= col.isna()
        else:
            sel &= col.map(lambda x, w=want: x == w).astype(bool)
    return recs[sel]


# -- model size ------------------------------------------------------------------------------
def memory_or_time_limit(size: pd.DataFrame, memory_budget_bytes: float, step_time_budget_s: float,
                         model: str = "kan") -> dict:
    """Affine fits ``mem = m0 + m1 P`` and ``time = t0 + t1 P`` over the model-size points of
    ``model``; ``P_mem`` and ``P_time`` are the parameter counts at which each budget is reached.
    Memory is the limit beyond ``P_mem`` when ``P_mem < P_time``, else time is. Points with a
    non-finite or non-positive time or memory are not used."""
    t = size[size["model"] == model]
    ok = [meets(m, 0) and meets(s, 0) for m, s in zip(t["peak_mem_bytes"], t["step_time_s"])]
    t = t[ok]
    if t["n_params"].nunique() < 2:
        raise ValueError(f"model-size guideline needs at least 2 {model} sizes with valid time and memory, "
                         f"got {t['n_params'].nunique()}")
    p = t["n_params"].to_numpy(float)
    m1, m0 = np.polyfit(p, t["peak_mem_bytes"].to_numpy(float), 1)
    t1, t0 = np.polyfit(p, t["step_time_s"].to_numpy(float), 1)
    p_mem = (memory_budget_bytes - m0) / m1 if m1 > 0 else float("inf")
    p_time = (step_time_budget_s - t0) / t1 if t1 > 0 else float("inf")
    limit = "memory" if p_mem < p_time else "time"
    return {"model": model, "p_mem": float(p_mem), "p_time": float(p_time), "limit": limit,
            "limit_params": float(min(p_mem, p_time)), "bytes_per_param": float(m1),
            "seconds_per_param": float(t1)}


def _size(df: pd.DataFrame, memory_budget_bytes: float, step_time_budget_s: float, rows: list, text: list) -> None:
    table = results.model_size_table(df)
    keys = [k for k in _group_keys(table) if k not in ("model", "widths", "grid_size")]
    for key, g in results._groupby(table, keys):
        for model in sorted(set(g["model"])):
            label = _label({"model": model, **key})
            try:
                lim = memory_or_time_limit(g, memory_budget_bytes, step_time_budget_s, model)
            except ValueError as e:
                text.append(f"{label}: {e}.")
                continue
            other = "time" if lim["limit"] == "memory" else "memory"
            other_p = lim["p_time"] if lim["limit"] == "memory" else lim["p_mem"]
            text.append(f"{label}: with {_fmt_bytes(memory_budget_bytes)} and {step_time_budget_s:g} s per step, "
                        f"{lim['limit']} limits a process first, at about {lim['limit_params']:.3g} parameters "
                        f"({other} would allow {other_p:.3g}; {lim['bytes_per_param']:.3g} B and "
                        f"{lim['seconds_per_param']:.3g} s per parameter).")
            rows.append({"question": "model size beyond which memory, not time, limits", "group": label,
                         "answer": (f"{lim['p_mem']:.3g} params" if lim["limit"] == "memory"
                                    else f"time limits first ({lim['p_time']:.3g} params)"),
                         "value": lim["limit_params"], "basis": "model_size"})


def compute_guidelines(df: pd.DataFrame, target_efficiency: float = 0.8,
                       memory_budget_bytes: float = 80 * 2**30, step_time_budget_s: float = 1.0) -> Guidelines:
    """All guidelines that the records in ``df`` (any mix of studies, as from
    :func:`kanlib.results.load_records`) allow, one answer per group of records."""
    if not 0 < target_efficiency <= 1:
        raise ValueError(f"target_efficiency: must be in (0, 1], got {target_efficiency}")
    if not memory_budget_bytes > 0 or not step_time_budget_s > 0:
        raise ValueError(f"memory_budget_bytes and step_time_budget_s: must be positive, got "
                         f"{memory_budget_bytes!r} and {step_time_budget_s!r}")
    rows, text = [], []
    studies = set(df["study"].unique())
    of = {s: df[df["study"] == s] for s in studies}
    if "strong_scaling" in studies:
        _strong(of["strong_scaling"], target_efficiency, rows, text)
    if "weak_scaling" in studies:
        _weak(of["weak_scaling"], target_efficiency, rows, text)
    if "communication" in studies:
        try:
            _comm(of["communication"], target_efficiency, rows, text)
        except KeyError as e:  # no pair of timed and no-op runs
            text.append(f"Communication: {e.args[0]}.")
    if "model_size" in studies:
        _size(of["model_size"], memory_budget_bytes, step_time_budget_s, rows, text)
    if not rows and not text:
        text.append(f"No study records to derive guidelines from (have studies: {sorted(studies)}).")
    note = df.attrs.get("code_note", "")
    if note:
        text.append(note)
    return Guidelines(pd.DataFrame(rows, columns=COLUMNS), text)


def from_out_dir(out_dir: str, code: str = "newest", **kwargs) -> Guidelines:
    """:func:`compute_guidelines` over every record under ``out_dir`` (code versions chosen by ``code``,
    see :func:`kanlib.results.load_records`); with none, a Guidelines whose only sentence says
    "no records under ..."."""
    try:
        df = results.load_records(out_dir, code=code)
    except results.NoRecordsError as e:
        return Guidelines(pd.DataFrame(columns=COLUMNS), [str(e)])
    return compute_guidelines(df, **kwargs)
