"""The same model at the same placement, measured by several studies: their efficiencies side by side, and why they
differ.

Strong scaling, weak scaling, compounding and time to accuracy each give a parallel efficiency at every
multi-process placement, and a default study measures one model in several of them (``[32, 128, 128, 1]`` at 1x2:
76% strong, 87% weak, 93-94% compounding). The numbers are not one measure taken thrice, and :func:`reconcile`
says how they differ.

Every one of them is a one-process time per sample over the time per sample of one of the N processes:

- strong scaling ``S/N = T1(B) / (N TN(B))`` and compounding's ``ddp_speedup / N`` (the same at its own global
  batch and kernel): the one process does the whole global batch ``B``, each of N processes ``B/N``;
- weak scaling ``E_w = T1(b) / TN(N b)`` and time to accuracy's weak series: the one process does what each of the
  N does, ``b``;
- time to accuracy's strong series: ``step_speedup / N``, as strong scaling.

So ``efficiency = baseline_per_sample_s / per_process_per_sample_s``, with ``baseline_per_sample_s = T(N0) /
B(N0)`` and ``per_process_per_sample_s = T(N) / local_batch``: two studies differ either in their one-process
step (per sample: a larger batch may run faster or slower per sample) or in their N-process step (per process:
less work per process leaves the same all-reduce a larger share of the step), and every other setting they do not
share (steps, warm-up, task, learning rate, code version ...) is named.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kanlib.analysis import fmt, groups, load, stats
from kanlib.analysis.context import Context
from kanlib.studies import compounding, strong_scaling, time_to_accuracy, weak_scaling

IDENTITY = ("model", "widths", "grid_size", "spline_order", "kernel", "precision")
"""What makes two records the same model: the architecture, the KAN kernel that ran and the precision."""
PLACEMENT = ("nnodes", "nproc_per_node", "world_size", "placement")
NOT_COMPARED = set(IDENTITY) | set(PLACEMENT) | set(groups.BOOKKEEPING) | {"kan_impl", "kan_path", "local_batch"}
"""Fields never listed as 'what else differs': the identity and placement themselves (equal by construction), the
kernel as asked for (``kernel`` is what ran) and bookkeeping. ``global_batch`` is listed: it is what a study sets."""

UNRECORDED = "unrecorded"
"""The value of a field a study's records do not have (written by older code)."""

COLUMNS = ["set", *IDENTITY, "placement", "world_size", "study", "series", "measure", "efficiency", "efficiency_lo",
           "efficiency_hi", "n_runs", "global_batch", "local_batch", "baseline_placement", "baseline_batch",
           "baseline_step_time_s", "step_time_s", "baseline_per_sample_s", "per_process_per_sample_s",
           "work_per_process_s", "differs", "values"]
"""The columns of :func:`reconcile`'s table, one row per (study, series) measure of one model at one placement:

- ``set``: the number of the (model, placement) the row belongs to (rows of one set are compared);
- ``model``, ``widths``, ``grid_size``, ``spline_order``, ``kernel`` (the KAN kernel path that ran), ``precision``,
  ``placement``, ``world_size``: what is the same;
- ``study``, ``series`` (which of the study's series: e.g. ``512 per process`` or ``global batch 4096``),
  ``measure`` (what the efficiency is);
- ``efficiency`` with ``efficiency_lo``/``efficiency_hi`` (the study's 95% interval) and ``n_runs`` at the placement;
- ``global_batch``, ``local_batch`` (samples per process per step at the placement);
- ``baseline_placement``, ``baseline_batch``, ``baseline_step_time_s``: the study's one-process point (its smallest
  placement, normally 1x1), its global batch and median step time (s);
- ``step_time_s``: the median step time at the placement (s);
- ``baseline_per_sample_s = baseline_step_time_s / baseline_batch`` and ``per_process_per_sample_s = step_time_s /
  local_batch`` (s per sample): ``efficiency`` is their ratio (up to the medians of ratios);
- ``work_per_process_s = baseline_per_sample_s x local_batch``: the compute of one process's share, timed on one
  process (s);
- ``differs``: the config fields whose values differ between the rows of the set (comma-separated, '' for none);
  ``values``: this row's values of them (``field=value; ...``)."""


def _with_kernel(df: pd.DataFrame) -> pd.DataFrame:
    df = groups.with_placement(df)
    df["kernel"] = compounding.kernel_of(df)
    df["local_batch"] = df["global_batch"] // df["world_size"]
    return df


def _median(df: pd.DataFrame, col: str) -> float:
    v = groups.numbers(df, col)
    return float(np.nanmedian(v)) if np.isfinite(v).any() else np.nan


SERIES = {"compounding": ["kernel", "kan_impl"], "time_to_accuracy": ["series", "series_batch"]}
"""The columns beyond a study's group fields that make one series of its table (one baseline each)."""


def _points(t: pd.DataFrame, keys: list[str]) -> list[tuple]:
    """``(row, its series' baseline row)`` for every row of a study's table ``t`` beyond its series' smallest
    placement (``keys``: the columns that make a series)."""
    out = []
    for _, g in groups.groupby(t, keys):
        g = g.sort_values(["world_size", "nnodes"])
        out += [(r, g.iloc[0]) for _, r in g.iloc[1:].iterrows()]
    return out


def _measures(ctx: Context) -> list[dict]:
    """Every multi-process efficiency of the four studies that measure one, each with its records."""
    found = []

    def runs(study):
        try:
            return _with_kernel(ctx.runs(study).data)
        except load.NoRecordsError:
            return None

    specs = [
        (strong_scaling, lambda: ctx.cached((strong_scaling.NAME, "table"),
                                            lambda: strong_scaling.table(ctx.runs(strong_scaling.RECORDS).data))),
        (weak_scaling, lambda: ctx.cached((weak_scaling.NAME, "table"),
                                          lambda: weak_scaling.table(ctx.runs(weak_scaling.RECORDS).data))),
        (compounding, lambda: compounding.table_of(ctx)),
        (time_to_accuracy, lambda: time_to_accuracy.table_of(ctx)),
    ]
    for mod, make in specs:
        recs = runs(mod.RECORDS)
        if recs is None or recs.empty:
            continue
        tab = make()
        if tab.empty:
            continue
        fields = tab.group_fields()
        for r, b in _points(tab.data, fields + SERIES.get(mod.NAME, [])):
            found.append(_measure(mod.NAME, r, b, fields, recs))
    return [m for m in found if m is not None]


def _measure(study: str, r: pd.Series, b: pd.Series, fields: list[str], recs: pd.DataFrame) -> dict | None:
    """The efficiency of table row ``r`` (baseline row ``b``) with its interval, work per process, and the records
    at its placement (None when none matches)."""
    key = {f: r[f] for f in fields}
    n, n0 = int(r["world_size"]), int(b["world_size"])
    series, measure = "", ""
    if study == "strong_scaling":
        eff = (r["efficiency"], r["efficiency_lo"], r["efficiency_hi"])
        measure = "S/N = T1(B) / (N TN(B)), fixed global batch"
        key.update({k: r[k] for k in ("global_batch",) if k in r and pd.notna(r[k])})
        series = f"global batch {int(key['global_batch'])}" if "global_batch" in key else ""
    elif study == "weak_scaling":
        eff = (r["weak_efficiency"], r["weak_efficiency_lo"], r["weak_efficiency_hi"])
        measure = "E_w = T1(b) / TN(N b), fixed per-process batch"
        series = f"{int(r['local_batch'])} per process"
    elif study == "compounding":  # the kernel's DDP speedup over N, against the same kernel's baseline
        eff = (r["ddp_speedup"] / n, r["ddp_speedup_lo"] / n, r["ddp_speedup_hi"] / n)
        measure = "DDP speedup of the kernel / N = T1(B) / (N TN(B)), fixed global batch"
        key.update(kernel=r["kernel"], kan_impl=r["kan_impl"])
        series = f"kernel {r['kernel']}"
    else:  # time to accuracy: step speedups of its strong (one global batch) and weak (one per-process batch) series
        if r["series"] == "strong":
            eff = (r["step_speedup"] / n, r["step_speedup_lo"] / n, r["step_speedup_hi"] / n)
            measure = "step speedup / N = T1(B) / (N TN(B)), fixed global batch"
            key["global_batch"] = r["series_batch"]
            series = f"strong, global batch {int(r['series_batch'])}"
        else:
            eff = (r["step_speedup"] / n0, r["step_speedup_lo"] / n0, r["step_speedup_hi"] / n0)
            measure = "step time ratio T1(b) / TN(N b), fixed per-process batch"
            key["local_batch"] = r["series_batch"]
            series = f"weak, {int(r['series_batch'])} per process"
    others = [f"{f}={fmt.value(groups.hashable(r[f]))}" for f in fields if f not in IDENTITY
              and f not in ("global_batch", "local_batch")]
    series = ", ".join([series] + others) if series else ", ".join(others)
    at = groups.select_records(groups.at(recs, int(r["nnodes"]), int(r["nproc_per_node"])), key)
    base = groups.select_records(groups.at(recs, int(b["nnodes"]), int(b["nproc_per_node"])), key)
    if at.empty or base.empty:
        return None
    ident = {f: _one(at, f) for f in IDENTITY}
    gb, gb0 = _median(at, "global_batch"), _median(base, "global_batch")
    t_n, t_0 = _median(at, "step_time_s"), _median(base, "step_time_s")
    local = gb / n
    per0 = t_0 / gb0
    return {**ident, "placement": r["placement"], "world_size": n, "study": study, "series": series,
            "measure": measure, "efficiency": float(eff[0]), "efficiency_lo": float(eff[1]),
            "efficiency_hi": float(eff[2]), "n_runs": int(len(at)), "global_batch": int(gb), "local_batch": int(local),
            "baseline_placement": b["placement"], "baseline_batch": int(gb0), "baseline_step_time_s": t_0,
            "step_time_s": t_n, "baseline_per_sample_s": per0, "per_process_per_sample_s": t_n / local,
            "work_per_process_s": per0 * local, "_records": at}


def _one(df: pd.DataFrame, col: str):
    """The value of ``col`` in ``df`` (a list for widths), several joined by '/', '' when the records lack it."""
    vals = list(dict.fromkeys(groups.hashable(v) for v in df[col].dropna())) if col in df else []
    if len(vals) == 1:
        return list(vals[0]) if isinstance(vals[0], tuple) else vals[0]
    return "/".join(sorted(fmt.value(v) for v in vals))


def _values(df: pd.DataFrame, col: str) -> str:
    """The distinct values of ``col`` in ``df`` as text (``unrecorded`` when the records lack it)."""
    if col not in df:
        return UNRECORDED
    vals = sorted({fmt.value(groups.hashable(v)) for v in df[col]}, key=str)
    return "/".join(vals) if vals else UNRECORDED


def _differing(entries: list[dict]) -> list[str]:
    """The config (and code, host, device) fields whose values differ between the entries' records at the
    placement (a baseline's batch is in ``baseline_batch``)."""
    cands = [f for f in dict.fromkeys(groups.config_fields() + list(groups.RECORD_GROUP_FIELDS))
             if f not in NOT_COMPARED]
    out = []
    for f in cands:
        seen = {_values(e["_records"], f) for e in entries}
        if len(seen) > 1:
            out.append(f)
    return out


def _label(r) -> str:
    return f"{r['study']} ({r['series']})" if r["series"] else r["study"]


def _identity_text(r) -> str:
    w = list(r["widths"]) if isinstance(r["widths"], (list, tuple)) else r["widths"]
    parts = [str(r["model"]), f"widths {w}"]
    if r["model"] == "kan":
        parts += [f"grid {fmt.value(r['grid_size'])}", f"order {fmt.value(r['spline_order'])}",
                  f"kernel {r['kernel']}"]
    if r["precision"] != "":
        parts.append(str(r["precision"]))
    return ", ".join(parts)


def _sentences(s: pd.DataFrame, differs: list[str]) -> list[str]:
    """What one set's rows say together: each measure, where the difference lies, and what else differs."""
    r0 = s.iloc[0]
    listing = "; ".join(f"{_label(r)} {fmt.row_ci(r, 'efficiency', fmt.pct)}" for _, r in s.iterrows())
    lines = [f"{_identity_text(r0)} at {r0['placement']} is measured by {s['study'].nunique()} studies: {listing}."]
    spread0, spread_n = _spread(s["baseline_per_sample_s"]), _spread(s["per_process_per_sample_s"])
    parts = "; ".join(f"{_label(r)} {_per_sample(r['baseline_per_sample_s'])} ({r['baseline_placement']}, batch "
                      f"{r['baseline_batch']}) over {_per_sample(r['per_process_per_sample_s'])} ({r['local_batch']} "
                      f"per process)" for _, r in s.iterrows())
    where = ("mostly in the one-process baseline" if np.log(spread0) > 2 * np.log(spread_n) else
             "mostly in the multi-process step" if np.log(spread_n) > 2 * np.log(spread0) else
             "in both the one-process baseline and the multi-process step")
    lines.append(f"Each is a one-process time per sample over the time per sample of one of {r0['world_size']} "
                 f"processes: {parts}. The one-process times per sample differ by up to {_times(spread0)} between "
                 f"them, the {r0['placement']} ones by up to {_times(spread_n)}: the difference lies {where}.")
    fixed_global = s["measure"].str.contains("fixed global batch")
    if fixed_global.any() and (~fixed_global).any():
        lines.append("Strong scaling (and compounding, and time to accuracy's strong series) holds the global batch: "
                     "its one process runs all of it, N times what each of the N runs, so its efficiency also holds "
                     "how the one-process step changes with batch; weak scaling gives the one process what each of "
                     "the N gets.")
    order = s.sort_values("work_per_process_s")
    eff = order["efficiency"].to_numpy(float)
    if len(order) > 1 and order["work_per_process_s"].nunique() > 1:
        works = "; ".join(f"{_label(r)} {r['local_batch']} samples ({_per_sample(r['work_per_process_s'])} of "
                          f"one-process compute)" for _, r in order.iterrows())
        if np.all(np.diff(eff) >= 0):
            lines.append(f"Work per process at {r0['placement']}: {works}; the efficiency rises with it, as a fixed "
                         f"all-reduce is a smaller share of a longer step.")
        else:
            lines.append(f"Work per process at {r0['placement']}: {works}; the efficiency does not rise with it, so "
                         f"the work per process does not explain the difference.")
    few = s[s["n_runs"] < stats.MIN_RUNS]
    if len(few):
        lines.append("Fewer than " + f"{stats.MIN_RUNS} runs (an interval that means little): "
                     + ", ".join(f"{_label(r)} {r['n_runs']}" for _, r in few.iterrows()) + ".")
    if differs:
        vals = []
        for f in differs:
            by_value: dict = {}
            for _, r in s.iterrows():
                by_value.setdefault(_field(r, f), []).append(_label(r))
            vals.append(f"{f} " + ", ".join(f"{v} in {' and '.join(labels)}" for v, labels in by_value.items()))
        lines.append(f"Other settings that differ between them: {'; '.join(vals)}.")
    else:
        lines.append("No other setting differs between them.")
    return lines


def _per_sample(v: float) -> str:
    """A time in the unit that keeps it short: ``63.1 us``, ``12.6 ms``, ``1.2 s``."""
    if not np.isfinite(v):
        return "n/a"
    return f"{fmt.us(v)} us" if v < 1e-3 else f"{fmt.ms(v)} ms" if v < 1 else f"{fmt.sec(v)} s"


def _spread(v: pd.Series) -> float:
    """The largest over the smallest of positive values (1: all equal)."""
    v = v.to_numpy(float)
    v = v[np.isfinite(v) & (v > 0)]
    return float(v.max() / v.min()) if len(v) else np.nan


def _times(ratio: float) -> str:
    """A ratio of two times as a difference a reader reads: ``12%`` below 2, else ``a factor of 3.4``."""
    return f"{ratio - 1:.0%}" if ratio < 2 else f"a factor of {ratio:.2g}"


def _field(r, f: str) -> str:
    for part in r["values"].split("; "):
        k, _, v = part.partition("=")
        if k == f:
            return v
    return UNRECORDED


def reconcile(ctx: Context) -> tuple[pd.DataFrame, list[str]]:
    """The same model (:data:`IDENTITY`: model, widths, grid, spline order, kernel that ran, precision) at the same
    multi-process placement, measured by more than one study (strong scaling, weak scaling, compounding, time to
    accuracy): one row per study and series (columns: :data:`COLUMNS`), and per such model and placement sentences
    that list each efficiency with its interval, say whether the difference lies in the one-process baseline or in
    the multi-process step, compare the work per process and name every other setting that differs. An empty frame
    and no sentence when no model is measured by two studies at one placement."""
    found = _measures(ctx)
    rows, lines = [], []
    by_set: dict = {}
    for m in found:
        ident = tuple(groups.hashable(m[f]) for f in IDENTITY) + (m["placement"],)
        by_set.setdefault(ident, []).append(m)
    n_set = 0
    for ident in sorted(by_set, key=lambda k: (groups.placement_key(k[-1]), repr(k[:-1]))):
        entries = by_set[ident]
        if len({e["study"] for e in entries}) < 2:
            continue
        differs = _differing(entries)
        set_rows = []
        for e in entries:
            row = {k: v for k, v in e.items() if k != "_records"}
            row.update(set=n_set, differs=", ".join(differs),
                       values="; ".join(f"{f}={_values(e['_records'], f)}" for f in differs))
            set_rows.append(row)
        s = pd.DataFrame(set_rows)
        lines += _sentences(s, differs)
        rows += set_rows
        n_set += 1
    return pd.DataFrame(rows, columns=COLUMNS), lines
