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
   communication per placement; the largest world size the model calibrated on the collective
   benchmark of the same folder predicts at the target (not predicted, and said so, without benchmark
   records: the DDP hook times mix transfer and waiting); the fastest data-parallel option that keeps
   the validation loss within a tolerance of plain DDP;
4. model size, per model: the size beyond which memory rather than step time limits a process, and
   the size from which FSDP lowers the peak memory per process;
5. time to accuracy, per series: the placement that reaches the target validation loss soonest;
6. compounding: the fastest kernel x placement, and whether the kernel and DDP speedups multiply.

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


def decision(answer: str) -> str:
    """The decision an answer makes, without its measured numbers: every answer reads ``decision: detail``
    (``"1x2 (1 node(s) x 2 processes): 92% [90%, 94%]"`` decides ``1x2 (1 node(s) x 2 processes)``), so two runs
    of a study agree when their decisions do, while their measured numbers move within their intervals."""
    return str(answer).split(": ", 1)[0]


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
            # other placements of the same world size that meet it too are named with it, in placement order, so
            # that which of them measured higher this time does not change the answer
            same_n = multi[(multi["world_size"] == best["world_size"]).to_numpy()
                           & np.array([meets(e, target) for e in multi["efficiency"]], dtype=bool)]
            if len(same_n) > 1:
                same_n = same_n.sort_values("placement", key=lambda c: c.map(results.placement_key))
                answer = (f"{', '.join(same_n['placement'])} (N={int(best['world_size'])}): "
                          + "; ".join(f"{r['placement']} {_ci(r, 'efficiency')}" for _, r in same_n.iterrows()))
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
            answer = (f"none of {len(g)} work sizes: best {_ci(top, 'efficiency')} at "
                      f"{top['work_per_process_s'] * 1e3:.3g} ms per process")
            text.append(f"{label}, {key['placement']}: none of the {len(g)} measured work sizes reaches {target:.0%}; "
                        f"the most work per process ({top['work_per_process_s'] * 1e3:.3g} ms, widths "
                        f"{list(top['widths'])}, global batch {int(top['global_batch'])}) gives {_ci(top, 'efficiency')}.")
            value = float(top["efficiency"])
        else:
            r = ok.iloc[0]
            answer = (f"widths {list(r['widths'])}, global batch {int(r['global_batch'])}: "
                      f"{r['work_per_process_s'] * 1e3:.3g} ms per process, {_ci(r, 'efficiency')}")
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
    # the other bucket sizes whose 95% intervals overlap the best one's: the data do not rank them
    tied = sorted(float(r["bucket_cap_mb"]) for _, r in at.iterrows()
                  if r["bucket_cap_mb"] != row["bucket_cap_mb"] and _intervals_overlap(row, r))
    return {"world_size": n_max, "placement": row["placement"], "bucket_cap_mb": float(row["bucket_cap_mb"]),
            "nccl_algo": row.get("nccl_algo", "") or "default", "exposed_s": float(row["exposed_s"]),
            "overhead_fraction": float(row["overhead_fraction"]), "overhead_lo": float(row.get("overhead_lo", np.nan)),
            "overhead_hi": float(row.get("overhead_hi", np.nan)), "tied_caps_mb": tied}


def _comm(df: pd.DataFrame, target: float, rows: list, text: list, fits: dict | None = None) -> None:
    # placements, buckets and the model concern plain DDP (the timed full-precision all-reduce, no other
    # option); the options are weighed against it in _options
    table = results.plain_ddp(results.communication_table(df))
    said_no_bench = False
    if table.empty:
        text.append("Communication: no point has both a timed and a no-op run, so nothing can be said.")
        return
    keys = _group_keys(table)
    recs = results._placement_cols(df)
    for c in ("emulate_latency_s", "emulate_bandwidth_bytes_per_s"):
        recs[c] = recs[c].fillna(0.0) if c in recs else 0.0
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
            tied = per[[_overlaps(top, r) for _, r in per.iterrows()]]
            if len(tied) > 1:  # the intervals overlap: the data do not rank these placements
                names = ", ".join(sorted(tied["placement"], key=results.placement_key))  # not in measured order
                answer = (f"no measurable difference between {names}: "
                          + "; ".join(f"{r['placement']} {r['exposed_s'] * 1e3:.3g} ms "
                                      f"({_ci(r, 'overhead_fraction', 'overhead_lo', 'overhead_hi')})"
                                      for _, r in tied.iterrows()))
                text.append(f"{label}: at N={n}, {names} expose the same communication within their 95% intervals "
                            f"(least: {top['placement']}, {top['exposed_s'] * 1e3:.3g} ms per step, "
                            f"{top['bucket_cap_mb']:g} MiB buckets); {rest}.")
            else:
                answer = (f"{top['placement']}: {top['exposed_s'] * 1e3:.3g} ms exposed "
                          f"({_ci(top, 'overhead_fraction', 'overhead_lo', 'overhead_hi')} of the step)")
                text.append(f"{label}: at N={n}, {top['placement']} exposes the least communication, "
                            f"{top['exposed_s'] * 1e3:.3g} ms per step ({_ci(top, 'overhead_fraction', 'overhead_lo', 'overhead_hi')} "
                            f"of the step, {top['bucket_cap_mb']:g} MiB buckets); {rest}.")
            rows.append({"question": f"N={n}: placement exposing the least communication", "group": label,
                         "answer": answer, "value": float(top["exposed_s"]), "basis": "communication"})
        emulated = bool(key["emulate_latency_s"] or key["emulate_bandwidth_bytes_per_s"])
        if g.groupby("world_size")["placement"].nunique().max() < 2 and not emulated:  # emulation: multi-node only
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
            answer = f"{bb['bucket_cap_mb']:g} MiB ({bb['nccl_algo']}){why}: {bb['exposed_s'] * 1e3:.3g} ms"
            if bb["tied_caps_mb"]:
                caps = ", ".join(f"{c:g}" for c in sorted([bb["bucket_cap_mb"], *bb["tied_caps_mb"]]))
                answer = f"no measurable difference between {caps} MiB: the least, {answer} ({ov} of the step)"
                text.append(f"{label}, {p}: the 95% intervals of {caps} MiB buckets overlap, so the data do not rank "
                            f"them.")
            rows.append({"question": f"{p}: bucket size minimising exposed communication", "group": label,
                         "answer": answer, "value": bb["exposed_s"], "basis": "communication"})
            # (c) the calibrated model (collective-benchmark fit) extrapolating this placement's best point
            if key["comm_hook"] != "timed":
                continue  # the model describes the full-precision all-reduce; compressed hooks send other bytes
            sel = _records_of(recs, {**gkey, "placement": p, "bucket_cap_mb": bb["bucket_cap_mb"],
                                     "nccl_algo": "" if bb["nccl_algo"] == "default" else bb["nccl_algo"]})
            sel = sel[sel["comm_hook"].isin(["timed", "noop"])]
            timed = sel[(sel["comm_hook"] == "timed")
                        & (sel["emulate_latency_s"] == key["emulate_latency_s"])
                        & (sel["emulate_bandwidth_bytes_per_s"] == key["emulate_bandwidth_bytes_per_s"])]
            question = f"{p}: predicted largest world size with efficiency >= {target:g}"
            if fits is None:
                if not said_no_bench:
                    text.append("Communication model: no collective-benchmark records in this folder, so the "
                                "calibrated model is not fitted and nothing is extrapolated (the DDP hook times mix "
                                "transfer and waiting for other ranks and are not fitted instead); run the "
                                "collective-benchmark section of 03_communication_overhead.")
                    said_no_bench = True
                rows.append({"question": question, "group": label,
                             "answer": "not predicted: no collective-benchmark records in this folder",
                             "value": np.nan, "basis": "communication model"})
                continue
            try:
                pr = calibrated_prediction(timed, sel[sel["comm_hook"] == "noop"], fits, target)
            except ValueError as e:
                text.append(f"{label}, {p}: no calibrated-model extrapolation: {e}.")
                rows.append({"question": question, "group": label, "answer": f"not predicted: {e}",
                             "value": np.nan, "basis": "communication model"})
                continue
            n_pred = pr["world_size"]
            if n_pred is None or n_pred <= 1:
                n_txt = f"that no multi-process world size reaches {target:.0%} strong-scaling efficiency"
                ans = f"none beyond 1: calibrated model; {pr['links']}"
            else:
                n_txt = f"{target:.0%} strong-scaling efficiency up to N={n_pred}"
                ans = f"{n_pred} processes: calibrated model; {pr['links']}"
            text.append(f"{label}, {p}: the model calibrated on the collective benchmark ({pr['fit']}; {pr['links']}; "
                        f"leave-one-out error {pr['loo_rel_rmse']:.0%}) with this point's measured compute "
                        f"({pr['n_params']} parameters, global batch {pr['global_batch']}, {pr['n_buckets']} "
                        f"bucket(s), {pr['placement_per_node']} processes per node) predicts {n_txt}; an optimistic "
                        f"bound that ignores stragglers and congestion.")
            rows.append({"question": question, "group": label, "answer": ans, "value": float(n_pred or 1),
                         "basis": "communication model"})


def link_text(model) -> str:
    """``intra 45 us, 1.2 GB/s; inter: latency not resolved (why), 80 MB/s`` for a fitted LinkModel: a
    constant the data could not resolve is named so, never printed as 0."""
    parts = []
    for name, link in model.links.items():
        lat = f"{link.alpha_s * 1e6:.3g} us" if link.alpha_s is not None else \
            f"latency not resolved ({link.alpha_why})"
        if link.bandwidth_bytes_per_s is not None:
            bw = f"{link.bandwidth_bytes_per_s / 1e9:.3g} GB/s"
        elif link.bandwidth_why == "unlimited (given as 0)":
            bw = "unlimited bandwidth"
        else:
            bw = f"bandwidth not resolved ({link.bandwidth_why})"
        parts.append(f"{name} {lat}, {bw}")
    return "; ".join(parts)


def calibrated_prediction(timed: pd.DataFrame, noop: pd.DataFrame, fits: dict, target: float,
                          max_world_size: int = 4096) -> dict:
    """Extrapolate one measured DDP point with the collective-benchmark fit.

    timed / noop: the point's runs with the timed hook and its no-op twins (one configuration). The
    compute profile comes from the no-op twin: ``T_noop(N) = c n_params B / N`` gives ``c``, and its
    backward share says when buckets become ready; the buckets are the ones the timed runs recorded;
    each bucket's all-reduce comes from the fit of the same backend, device, algorithm and emulated link
    (:func:`kanlib.commmodel.find_fit`), on nodes of the point's processes per node. Returns ``world_size``
    (largest with efficiency >= target, or None), the prediction table and a description; raises
    ValueError saying why when the point or the fit cannot support a prediction.
    """
    from kanlib import commmodel

    if timed.empty or noop.empty:
        raise ValueError("the point needs timed runs and their no-op twins")
    r = timed.iloc[0]
    buckets = r.get("bucket_bytes")
    if not isinstance(buckets, (list, tuple)) or not buckets:
        raise ValueError("its records carry no bucket_bytes (schema 1)")
    nn, pp = int(r["nnodes"]), int(r["nproc_per_node"])
    n, b, n_params = nn * pp, int(r["global_batch"]), int(r["n_params"])
    t_noop = float(np.median(noop["step_time_s"].to_numpy(float)))
    bwd = float(np.median(noop["backward_s"].to_numpy(float))) if "backward_s" in noop else 2 * t_noop / 3
    profile = commmodel.ComputeProfile(t_noop * n / (n_params * b), 0.0, min(max(bwd / t_noop, 0.0), 1.0),
                                       f"measured: the no-op twin at {nn}x{pp}")
    algo = commmodel.row_algorithm(r.get("backend", ""), r.get("nccl_algo", ""), r.get("nccl_algo_used"))
    f = commmodel.find_fit(fits, r.get("backend", ""), r.get("device", "cpu"), algo, nn,
                           r.get("emulate_latency_s", 0.0), r.get("emulate_bandwidth_bytes_per_s", 0.0))
    if f is None:
        raise ValueError(f"no collective-benchmark fit for {r.get('backend')}/{r.get('device')}/{algo} with this "
                         f"run's link (emulated latency {float(r.get('emulate_latency_s') or 0):g} s)")
    pred = commmodel.predict_scaling(f.model, profile, list(reversed(list(buckets))),
                                     commmodel.powers_of_two(max_world_size), pp, global_batch=b,
                                     bucket_cap_mb=float(r["bucket_cap_mb"]))
    return {"world_size": commmodel.largest_world_size_at(pred, target), "prediction": pred, "profile": profile,
            "fit": f.model.label, "links": link_text(f.model), "loo_rel_rmse": f.loo_rel_rmse,
            "n_params": n_params, "global_batch": b, "n_buckets": len(buckets), "placement_per_node": pp}


def _records_of(recs: pd.DataFrame, key: dict) -> pd.DataFrame:
    """The records whose fields equal ``key`` (:func:`kanlib.results.select_records`)."""
    return results.select_records(recs, key)


# -- model size ------------------------------------------------------------------------------
MIN_GROWTH = 0.05
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
    # A budget is extrapolated only along a fit that grows measurably over the measured sizes (by at least
    # MIN_GROWTH of its value at the smallest): a CPU process's resident set, which the framework dominates at
    # small sizes, moves by noise, and a near-flat fit would put the limit anywhere.
    span = p.max() - p.min()
    flat = [name for name, slope, icpt in (("peak memory", m1, m0), ("step time", t1, t0))
            if not slope * span > MIN_GROWTH * abs(icpt + slope * p.min())]
    if flat:
        raise ValueError(f"{' and '.join(flat)} of {model} did not grow measurably (by {MIN_GROWTH:.0%}) with the "
                         f"parameter count over the measured sizes ({int(p.min()):,} to {int(p.max()):,} parameters), "
                         f"so no limit is extrapolated; measure larger sizes")
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
                rows.append({"question": "model size beyond which memory, not time, limits", "group": label,
                             "answer": f"not resolved: {e}", "value": np.nan, "basis": "model_size"})
                continue
            other = "time" if lim["limit"] == "memory" else "memory"
            other_p = lim["p_time"] if lim["limit"] == "memory" else lim["p_mem"]
            text.append(f"{label}: with {_fmt_bytes(memory_budget_bytes)} and {step_time_budget_s:g} s per step, "
                        f"{lim['limit']} limits a process first, at about {lim['limit_params']:.3g} parameters "
                        f"({other} would allow {other_p:.3g}; {lim['bytes_per_param']:.3g} B and "
                        f"{lim['seconds_per_param']:.3g} s per parameter).")
            rows.append({"question": "model size beyond which memory, not time, limits", "group": label,
                         "answer": (f"memory limits first: at {lim['p_mem']:.3g} params" if lim["limit"] == "memory"
                                    else f"time limits first: at {lim['p_time']:.3g} params"),
                         "value": lim["limit_params"], "basis": "model_size"})


# -- data-parallel options ----------------------------------------------------------------------
# An option counts as faster than plain DDP only when its step is this much shorter: single option runs have no
# interval, and repeated runs of one config here differ by several percent.
OPTION_MARGIN = 0.10


def within_margin(values: pd.Series, margin: float = OPTION_MARGIN) -> pd.Series:
    """Which of ``values`` (times: smaller is better) lie within ``margin`` (relative) of the smallest: the
    candidates a single run cannot tell apart, so a guideline names them together instead of picking one
    that the next run may not pick."""
    v = values.astype(float)
    return v <= v.min() * (1 + margin)


def _intervals_overlap(a, b, margin: float = OPTION_MARGIN) -> bool | None:
    """Whether the 95% intervals of the overhead fractions of points ``a`` and ``b``, each widened upward by
    ``margin`` (relative), overlap; None when either has no finite interval. With two runs per point an interval
    is about the range of the runs, so intervals that merely do not touch flip between study runs (the exposed
    communication of 1x2 and 2x1, one host apart from the launch: '14% [12%, 16%]' and '16% [14%, 18%]' in one
    run, '14% [13%, 15%]' clear of 2x1's in the next)."""
    return _ranges_overlap(a, b, "overhead", "overhead", margin)


def _ranges_overlap(a, b, col_a: str, col_b: str, margin: float = 0.0) -> bool | None:
    """Whether the interval ``a[col_a_lo], a[col_a_hi]`` and ``b[col_b_lo], b[col_b_hi]``, each widened upward by
    ``margin`` (relative), overlap; None when either bound is not finite."""
    lo_a, hi_a = float(a.get(f"{col_a}_lo", np.nan)), float(a.get(f"{col_a}_hi", np.nan))
    lo_b, hi_b = float(b.get(f"{col_b}_lo", np.nan)), float(b.get(f"{col_b}_hi", np.nan))
    if not np.isfinite([lo_a, hi_a, lo_b, hi_b]).all():
        return None
    return bool(lo_a <= hi_b * (1 + margin) and lo_b <= hi_a * (1 + margin))


def _overlaps(a, b) -> bool:
    """Whether the 95% intervals of the overhead fractions of points ``a`` and ``b`` overlap (no interval: only
    a point with itself, or with its own placement)."""
    both = _intervals_overlap(a, b)
    if both is None:
        return a is b or (a.get("placement") == b.get("placement"))
    return both


def _step_intervals_overlap(opt) -> bool:
    """Whether an option's step-time interval overlaps plain DDP's (an option row of the options table); no
    interval on either side counts as overlapping: a single run cannot show a difference beyond its noise."""
    both = _ranges_overlap(opt, opt, "t_allreduce", "plain_t_allreduce")
    single = (opt.get("t_allreduce_lo") == opt.get("t_allreduce_hi")
              and opt.get("plain_t_allreduce_lo") == opt.get("plain_t_allreduce_hi"))
    return True if both is None or single else both


def _ms_ci(row, prefix: str) -> str:
    mid = row.get("step_time_s" if prefix == "t_allreduce" else "plain_step_time_s", np.nan)
    return f"{mid * 1e3:.3g} ms [{row[prefix + '_lo'] * 1e3:.3g}, {row[prefix + '_hi'] * 1e3:.3g}]"


def _options(df: pd.DataFrame, tolerance: float, rows: list, text: list) -> None:
    table = results.options_table(df, tolerance=tolerance)
    if table.empty or table["is_plain"].all():
        return
    for p, g in table.groupby("placement", sort=False):
        opts = g[~g["is_plain"] & ~g["plain_missing"]]
        emu = (opts["emulate_latency_s"] > 0) | (opts["emulate_bandwidth_bytes_per_s"] > 0)
        opts = opts[~emu]  # options are judged on the machine's own link
        if opts.empty:
            continue
        harm = opts[opts["harms_convergence"]]
        ok = opts[~opts["harms_convergence"] & opts["val_loss_rel_delta"].notna()]
        if ok.empty:
            answer = f"none keeps the validation loss within {tolerance:.1%} of plain DDP"
            value = np.nan
        else:
            best = ok.loc[ok["step_time_ratio"].idxmin()]
            answer = (f"{best['option']}: step {best['step_time_ratio']:.2f}x plain DDP, exposed "
                      f"{best['exposed_s'] * 1e3:.3g} ms (plain {best['plain_exposed_s'] * 1e3:.3g} ms), validation "
                      f"loss {best['val_loss_rel_delta']:+.2%}")
            if not best["step_time_ratio"] < 1 - OPTION_MARGIN:  # within run-to-run spread of plain DDP
                answer = (f"plain DDP: no option is more than {OPTION_MARGIN:.0%} faster (the best, {answer})")
            elif _step_intervals_overlap(best):  # faster in the medians, not beyond the runs' spread
                answer = (f"plain DDP: no option is faster beyond the 95% intervals of the step times (the best, "
                          f"{answer}; step {_ms_ci(best, 't_allreduce')} against plain "
                          f"{_ms_ci(best, 'plain_t_allreduce')})")
            value = float(best["step_time_ratio"])
        harm_txt = "; ".join(f"{r['option']} ({r['val_loss_rel_delta']:+.1%})" for _, r in harm.iterrows())
        text.append(f"{p}: of {len(opts)} data-parallel option(s), the fastest that keeps the validation loss after "
                    f"the same samples within {tolerance:.1%} of plain DDP is {answer}"
                    + (f"; harming convergence: {harm_txt}" if harm_txt else "; none harms convergence") + ".")
        rows.append({"question": f"{p}: fastest data-parallel option within {tolerance:.1%} of plain DDP's loss",
                     "group": "communication", "answer": answer, "value": value, "basis": "communication options"})


# -- FSDP ----------------------------------------------------------------------------------------
def _fsdp(df: pd.DataFrame, rows: list, text: list) -> None:
    table = results.fsdp_table(results.model_size_table(df))
    if table.empty:
        return
    kind = _uniq_text(df, "peak_mem_kind")
    for model, g in table.groupby("model", sort=True):
        n = results.fsdp_pays_from(g, model)
        top = g.sort_values("n_params").iloc[-1]
        if n is None:
            answer = (f"no measured size: at the largest ({int(top['n_params']):,} parameters) FSDP's peak memory "
                      f"per process is {top['mem_ratio']:.2f}x DDP's and its step {top['step_ratio']:.2f}x")
            why = (" On CPU the peak is the process's resident set, which the framework dominates at these sizes "
                   f"(analytic state: {_fmt_bytes(top['state_ddp_bytes'])} under DDP, "
                   f"{_fmt_bytes(top['state_fsdp_bytes'])} per process under FSDP)."
                   if "rss" in kind else "")
            text.append(f"{model}, {top['placement']}: the data show no size where FSDP pays: {answer}.{why}")
        else:
            r = g[g["n_params"] == n].iloc[0]
            answer = (f"from {n:,} parameters: peak memory per process {r['mem_ratio']:.2f}x DDP's, step "
                      f"{r['step_ratio']:.2f}x")
            text.append(f"{model}, {r['placement']}: FSDP starts to pay {answer} (and at every larger size measured).")
        rows.append({"question": "model size from which FSDP lowers peak memory per process", "group": model,
                     "answer": answer, "value": float(n) if n else np.nan, "basis": "model_size"})


def _uniq_text(df: pd.DataFrame, col: str) -> str:
    return ",".join(sorted({str(v) for v in df[col].dropna()})) if col in df else ""


# -- time to accuracy --------------------------------------------------------------------------------
def _tta(df: pd.DataFrame, rows: list, text: list) -> None:
    table = results.time_to_accuracy_table(df)
    if table.empty:
        text.append("Time to accuracy: no series with two placements of one global or per-process batch.")
        return
    keys = _group_keys(table)
    target = _uniq_text(df, "target_val_loss")
    for key, g in results._groupby(table, keys + ["series", "series_batch"]):
        label = _label({k: v for k, v in key.items() if k in keys})
        what = (f"global batch {key['series_batch']}" if key["series"] == "strong"
                else f"{key['series_batch']} samples per process")
        label = f"{label}, {key['series']} ({what})"
        done = g[g["time_to_target_s"].notna()]
        if done.empty:
            answer = f"none reached validation loss {target}"
            text.append(f"{label}: no placement reached the target validation loss {target} (best final loss "
                        f"{g['final_val_loss'].min():.4g}); train longer or raise the target.")
            value = np.nan
        else:
            full = done[done["all_reached"]]
            pool = (full if not full.empty else done).sort_values("time_to_target_s")
            best = pool.iloc[0]
            ci = _ci_s(best)
            lo, hi = (pool.get(c, pd.Series(np.nan, index=pool.index)) for c in ("time_to_target_lo", "time_to_target_hi"))
            # tied unless its interval starts more than the margin above the best's: with two or three runs a
            # point's interval is about the range of its runs, and a 2-process run here takes either of two
            # step times (2.2 or 4.4 ms at 1x2 on digits), so intervals that merely do not touch flip between
            # study runs (1x1 named in one of two runs of 64b3775, tied in the other)
            overlap = (lo <= float(hi.iloc[0]) * (1 + OPTION_MARGIN)) & np.isfinite(hi.iloc[0]) & np.isfinite(lo)
            tied = pool[within_margin(pool["time_to_target_s"]) | overlap]
            if len(tied) > 1:
                names = ", ".join(sorted(tied["placement"], key=results.placement_key))
                answer = (f"no measurable difference between {names}: within {OPTION_MARGIN:.0%} of "
                          f"{best['placement']}'s {ci} or of its 95% interval, to validation loss {target}")
            else:
                answer = (f"{best['placement']} ({int(best['nnodes'])} node(s) x {int(best['nproc_per_node'])}): "
                          f"{ci} to validation loss {target} ({int(best['n_reached'])}/{int(best['n_runs'])} runs)")
            rest = "; ".join(f"{r['placement']} {_ci_s(r)}" + ("" if r["all_reached"] else
                                                              f" ({int(r['n_reached'])}/{int(r['n_runs'])} reached)")
                             for _, r in done.iterrows() if r["placement"] != best["placement"])
            missed = [r["placement"] for _, r in g.iterrows() if r["n_reached"] == 0]
            text.append(f"{label}: {best['placement']} reaches the target soonest, in {ci} of training "
                        + (f"(not measurably sooner than {', '.join(tied['placement'][1:])}: within "
                           f"{OPTION_MARGIN:.0%} of its time or of its 95% interval) " if len(tied) > 1 else "")
                        + f"("
                        f"{best['steps_to_target']:.0f} steps, {best['samples_to_target']:,.0f} samples)"
                        + (f"; also: {rest}" if rest else "")
                        + (f"; never reached at {', '.join(missed)}" if missed else "") + ".")
            value = float(best["time_to_target_s"])
        rows.append({"question": "placement that reaches the target soonest", "group": label, "answer": answer,
                     "value": value, "basis": "time_to_accuracy"})


def _ci_s(row) -> str:
    v, lo, hi = row["time_to_target_s"], row.get("time_to_target_lo", np.nan), row.get("time_to_target_hi", np.nan)
    if np.isfinite(lo) and np.isfinite(hi) and (lo != v or hi != v):
        return f"{v:.3g} s [{lo:.3g}, {hi:.3g}]"
    return f"{v:.3g} s"


# -- compounding ----------------------------------------------------------------------------------
def _kernel_name(row) -> str:
    """The kernel a compounding row ran, naming the one asked for when it fell back."""
    return row["kernel"] if not row["fell_back"] else f"{row['kan_impl']} (ran {row['kernel']})"


def _compounding(df: pd.DataFrame, rows: list, text: list) -> None:
    table = results.compounding_table(df)
    if table.empty:
        return
    keys = _group_keys(table)
    for key, g in results._groupby(table, keys):
        label = _label(key)
        best = g.loc[g["step_time_s"].idxmin()]
        kname = _kernel_name(best)
        multi = g[(g["world_size"] > 1) & (g["kernel"] != g["baseline_kernel"]) & g["compounding"].notna()]
        comp = "; ".join(f"{r['kernel']} at {r['placement']}: measured {r['measured']:.2f}x vs product "
                         f"{r['product']:.2f}x (efficiency {r['efficiency']:.0%} vs {r['efficiency_ref']:.0%} with the "
                         f"{r['baseline_kernel']} kernel)" for _, r in multi.iterrows())
        answer = (f"{kname} at {best['placement']}: {best['step_time_s'] * 1e3:.3g} ms per step, "
                  f"{best['measured']:.2f}x the {best['baseline_kernel']} kernel on {g.iloc[0]['placement']}")
        tied = g[within_margin(g["step_time_s"])].sort_values("step_time_s")
        if len(tied) > 1:
            names = ", ".join(f"{_kernel_name(r)} at {r['placement']}" for _, r in tied.iterrows())
            answer = f"no measurable difference between {names}: within {OPTION_MARGIN:.0%} of {answer}"
        text.append(f"{label}: the fastest combination is {answer}" + (f"; {comp}" if comp else "") + ".")
        rows.append({"question": "fastest kernel x placement", "group": label, "answer": answer,
                     "value": float(best["step_time_s"]), "basis": "compounding"})


def compute_guidelines(df: pd.DataFrame, target_efficiency: float = 0.8,
                       memory_budget_bytes: float = 80 * 2**30, step_time_budget_s: float = 1.0,
                       bench: pd.DataFrame | None = None, bench_time_col: str = "time_s_p10",
                       val_loss_tolerance: float = 0.01) -> Guidelines:
    """All guidelines that the records in ``df`` (any mix of studies, as from
    :func:`kanlib.results.load_records`) allow, one answer per group of records.

    bench: collective-benchmark rows (kanlib.collbench.load_bench) of the same folder; the communication
    model is fitted on them (``bench_time_col``: the per-size time fitted, see
    :func:`kanlib.commmodel.fit_collbench`), and without them the guidelines say it is not fitted.
    val_loss_tolerance: the relative increase of the validation loss over plain DDP beyond which a
    data-parallel option counts as harming convergence."""
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
        fits = None
        if bench is not None and not bench.empty:
            from kanlib import commmodel

            try:
                fits = commmodel.fit_collbench(bench, time_col=bench_time_col)
            except ValueError as e:  # e.g. only single-process benchmark runs
                text.append(f"Communication model: the collective benchmark could not be fitted: {e}.")
        try:
            _comm(of["communication"], target_efficiency, rows, text, fits)
            _options(of["communication"], val_loss_tolerance, rows, text)
        except KeyError as e:  # no pair of timed and no-op runs
            text.append(f"Communication: {e.args[0]}.")
    if "model_size" in studies:
        _size(of["model_size"], memory_budget_bytes, step_time_budget_s, rows, text)
        _fsdp(of["model_size"], rows, text)
    if "time_to_accuracy" in studies:
        _tta(of["time_to_accuracy"], rows, text)
    if "compounding" in studies:
        _compounding(of["compounding"], rows, text)
    if not rows and not text:
        text.append(f"No study records to derive guidelines from (have studies: {sorted(studies)}).")
    note = df.attrs.get("code_note", "")
    if note:
        text.append(note)
    return Guidelines(pd.DataFrame(rows, columns=COLUMNS), text)


def from_out_dir(out_dir: str, code: str = "newest", **kwargs) -> Guidelines:
    """:func:`compute_guidelines` over every record under ``out_dir`` (code versions chosen by ``code``,
    see :func:`kanlib.results.load_records`) and the collective-benchmark records there; with no
    record, a Guidelines whose only sentence says "no records under ..."."""
    from kanlib import collbench

    try:
        df = results.load_records(out_dir, code=code)
    except results.NoRecordsError as e:
        return Guidelines(pd.DataFrame(columns=COLUMNS), [str(e)])
    kwargs.setdefault("bench", collbench.load_bench(out_dir))
    return compute_guidelines(df, **kwargs)


def compare(a: Guidelines, b: Guidelines) -> pd.DataFrame:
    """The answers of two sets of guidelines side by side (e.g. two runs of the same study): one row per
    (question, group) of either, with ``answer_a``, ``answer_b`` and ``same`` (the same :func:`decision`). A
    study says the same thing twice when every row is ``same``; a question only one of them answers is not."""
    keys = ["question", "group"]
    left = a.table[keys + ["answer"]].rename(columns={"answer": "answer_a"})
    right = b.table[keys + ["answer"]].rename(columns={"answer": "answer_b"})
    both = left.merge(right, on=keys, how="outer")
    decided = [both[c].map(lambda v: decision(v) if isinstance(v, str) else None) for c in ("answer_a", "answer_b")]
    both["same"] = decided[0].notna() & (decided[0] == decided[1])
    return both.reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m kanlib.guidelines OUT [OUT2]``: the guidelines of the records under OUT; with OUT2, both
    side by side and whether they agree (exit status 1 when any answer differs)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kanlib.guidelines", description=main.__doc__)
    ap.add_argument("out_dir", help="a study's output folder (records under <out_dir>/<study>/)")
    ap.add_argument("other", nargs="?", help="a second output folder to compare with")
    ap.add_argument("--target-efficiency", type=float, default=0.8)
    args = ap.parse_args(argv)
    first = from_out_dir(args.out_dir, target_efficiency=args.target_efficiency)
    if args.other is None:
        print(first)
        return 0
    table = compare(first, from_out_dir(args.other, target_efficiency=args.target_efficiency))
    with pd.option_context("display.max_rows", None, "display.max_colwidth", 60, "display.width", 200):
        print(table.to_string(index=False))
    differ = int((~table["same"]).sum())
    print(f"{len(table) - differ} of {len(table)} answers the same" + (f"; {differ} differ" if differ else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
