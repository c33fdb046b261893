"""Time to accuracy: training to a target validation loss, per placement, in strong and weak series.

A strong series holds one global batch at several world sizes (its time-to-target speedup should equal the step
speedup); a weak series holds one per-process batch (its global batch grows with N, and so may the samples
needed: statistical efficiency). Both are found in the same records. Guideline: the placement that reaches the
target soonest.

Compilation is kept out of the time to target (:func:`without_warmup`): the record's ``time_to_target_s`` sums
every step's wall time, the warm-up steps' too, and a compiled kernel's first step can take seconds where the
steps after it take milliseconds (4.69 s beside 0.06 s of training in one default study). The warm-up steps
(``measured`` 0 in ``steps.csv``) count at the run's median measured step time instead; a run where that cannot
be done, or whose compilation spilled past the warm-up, keeps its recorded time and is named.
"""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pandas as pd

from kanlib.analysis import fmt, groups, load, stats, style
from kanlib.analysis.context import Context, Goals
from kanlib.analysis.explorer import View
from kanlib.analysis.section import StudyAnalysis
from kanlib.analysis.style import go, make_subplots
from kanlib.analysis.table import Table
from kanlib.records import STEPS_NAME

NAME = SECTION = RECORDS = "time_to_accuracy"
TITLE = "Time to accuracy (training to a target validation loss)"
PUBLISHED = "not measured: step throughput only"
AXES = ("nnodes", "nproc_per_node", "global_batch", "local_batch", "n_train", "lr_base_batch")
"""What varies within a group: a strong series shares a global batch, a weak one a per-process batch."""
SWEPT = ("nnodes", "nproc_per_node", "global_batch", "lr_rule", "lr_base_batch", "n_train")
EXPLORER = View(x=("world_size", "global_batch", "local_batch"), series=("lr_rule",))


COMPILE_SHARE = 0.5
"""A measured step counts as one that compiled when its excess over the median step is at least this share of the
compilation time the warm-up does not account for (``compile_s`` less the warm-up's excess): a stall of another
process is milliseconds, a recompilation is most of the spilled compile time."""
MATERIAL = 0.1
"""...and at least this share of the run's time to target (smaller, it would not move the comparison)."""


def design(df: pd.DataFrame) -> groups.Design:
    """How this study's records split (:func:`kanlib.analysis.groups.design`)."""
    return groups.design(df, NAME, AXES, SWEPT)


def _run_name(r) -> str:
    """A run as the page names it: its folder (the run key), or its run key without one."""
    path = str(r.get("record_path", "") or "")
    return os.path.basename(os.path.dirname(path)) if path else str(r.get("run_key", "?"))


def steady_step_times(s: pd.DataFrame) -> tuple[np.ndarray, str]:
    """The step times of one run's ``steps.csv`` rows ``s`` (sorted by step, one attempt, s) with each warm-up
    step (``measured`` 0) counted at the median measured step time, and ``''``; or the times as recorded and why
    the warm-up cannot be taken out (rows of several attempts, or no measured step)."""
    t = s["step_time_s"].to_numpy(float)
    if s["attempt"].nunique() > 1:
        return t, (f"resumed (attempts {', '.join(str(a) for a in sorted(s['attempt'].unique()))}): each attempt "
                   f"warmed up again and the record's time holds the earlier ones' training, not in steps.csv")
    measured = s["measured"].to_numpy(int) == 1
    if not (measured & np.isfinite(t)).any():
        return t, "no measured step (the target was reached within the warm-up): nothing to count the warm-up at"
    return np.where(measured, t, float(np.nanmedian(t[measured]))), ""


def _warmup_out(r) -> tuple[float, float, str]:
    """For one record that reached its target: ``(time to target without the warm-up's excess, s; that excess, s;
    '')``, or the recorded time, NaN and why it could not be taken out."""
    ttt = float(r["time_to_target_s"])
    run_dir = os.path.dirname(str(r.get("record_path", "") or ""))
    if not run_dir or not os.path.exists(os.path.join(run_dir, STEPS_NAME)):
        return ttt, np.nan, "no steps.csv: its warm-up steps cannot be told apart"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a truncated last row is named by the loader elsewhere
        s = load.load_steps(run_dir)
    s = s.sort_values(["step", "attempt"]).drop_duplicates("step", keep="last")
    n = int(r["steps_to_target"]) if pd.notna(r.get("steps_to_target")) else len(s)
    s = s[s["step"] < n]
    if len(s) < n:
        return ttt, np.nan, f"steps.csv holds {len(s)} of the {n} steps to the target"
    steady, why = steady_step_times(s)
    if why:
        return ttt, np.nan, why
    excess = float(np.nansum(s["step_time_s"].to_numpy(float) - steady))
    if not ttt - excess > 0:
        return ttt, np.nan, f"its warm-up in steps.csv ({excess:.3g} s) is not within its recorded time ({ttt:.3g} s)"
    measured = s[s["measured"] == 1]
    median = float(np.nanmedian(measured["step_time_s"]))
    compile_s = float(r["compile_s"]) if pd.notna(r.get("compile_s")) else 0.0  # older records: none
    spilled = compile_s - max(excess, 0.0)  # compilation the warm-up does not account for (s)
    worst = measured.loc[measured["step_time_s"].idxmax()] if len(measured) else None
    if (spilled > 0 and worst is not None and worst["step_time_s"] - median >= COMPILE_SHARE * spilled
            and worst["step_time_s"] - median >= MATERIAL * (ttt - excess)):
        return ttt, np.nan, (f"compiled after the warm-up: compile_s {compile_s:.3g} s, {spilled:.3g} s more "
                             f"than the warm-up took, and measured step {int(worst['step'])} took "
                             f"{worst['step_time_s']:.3g} s (median {median:.3g} s)")
    return ttt - excess, excess, ""


def without_warmup(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with compilation kept out of ``time_to_target_s``: for each run that reached its target, its warm-up
    steps (``measured`` 0 in its ``steps.csv``: compilation, DDP's bucket rebuild) count at its median measured
    step time (:func:`steady_step_times`) instead of the time they took, so a run whose first step compiled for
    seconds and one that found its kernels compiled get the same time.

    Adds ``recorded_time_to_target_s`` (the record's), ``warmup_excess_s`` (the time taken out, s: the warm-up
    steps' time less as many median steps; NaN where nothing was taken out) and ``warmup_kept`` (why the recorded
    time was kept, '' when it was not): no ``steps.csv``, a resumed run, the target reached within the warm-up, or
    a measured step that compiled (``compile_s`` beyond the warm-up's excess and a measured step that took most of
    the rest, :data:`COMPILE_SHARE`; the evaluations' own compilation is outside the timed region and is not)."""
    df = df.copy()
    df["recorded_time_to_target_s"] = df["time_to_target_s"] if "time_to_target_s" in df else np.nan
    df["warmup_excess_s"], df["warmup_kept"] = np.nan, ""
    for i in df.index[_reached(df)]:
        r = df.loc[i]
        if not pd.notna(r.get("time_to_target_s")):
            continue
        t, excess, why = _warmup_out(r)
        df.loc[i, ["time_to_target_s", "warmup_excess_s", "warmup_kept"]] = [t, excess, why]
    return df


def _reached(at: pd.DataFrame) -> np.ndarray:
    return at["reached_target"].fillna(False).astype(bool).to_numpy() if "reached_target" in at \
        else np.zeros(len(at), bool)


def _median_of(at: pd.DataFrame, col: str, where=None) -> float:
    """The median of ``at[col]`` over the finite values (of the rows ``where``), NaN when there is none."""
    v = groups.numbers(at, col)
    if where is not None:
        if not where.any():
            return np.nan
        v = np.where(where, v, np.nan)
    return float(np.nanmedian(v)) if np.isfinite(v).any() else np.nan


def _row(key: dict, kind: str, batch, p: tuple, at: pd.DataFrame, base: pd.DataFrame, p0: tuple,
         n_boot: int, seed: int) -> dict:
    """One placement of one series: steps, samples and time to the target, and the speedups against ``p0``."""
    n, n0 = p[0] * p[1], p0[0] * p0[1]
    reached = _reached(at)
    ttt = groups.numbers(at, "time_to_target_s")
    ttt[~reached] = np.nan
    kept = np.where(reached, at["warmup_kept"].fillna("").astype(str), "") if "warmup_kept" in at \
        else np.full(len(at), "")
    names = [_run_name(r) for _, r in at.iterrows()]
    t_med, t_lo, t_hi = (stats.median_ci(ttt[np.isfinite(ttt)], n_boot, seed) if np.isfinite(ttt).any()
                         else (np.nan, np.nan, np.nan))
    row = {**key, "series": kind, "series_batch": int(batch), "world_size": n, "nnodes": p[0],
           "nproc_per_node": p[1], "placement": groups.placement_of(*p), "inter_node": p[0] > 1,
           "global_batch": int(at["global_batch"].iloc[0]), "local_batch": int(at["local_batch"].iloc[0]),
           "n_runs": int(len(at)), "n_reached": int(reached.sum()), "all_reached": bool(reached.all()),
           "steps_to_target": _median_of(at, "steps_to_target", reached),
           "samples_to_target": _median_of(at, "samples_to_target", reached),
           "time_to_target_s": t_med, "time_to_target_lo": t_lo, "time_to_target_hi": t_hi,
           "warmup_excess_s": _median_of(at, "warmup_excess_s", reached),
           "n_warmup_kept": int((kept != "").sum()),
           "warmup_kept": "; ".join(f"{name}: {why}" for name, why in zip(names, kept) if why),
           "step_time_s": float(np.median(groups.numbers(at, "step_time_s"))),
           "final_val_loss": _median_of(at, "final_val_loss"),
           "final_val_accuracy": _median_of(at, "final_val_accuracy"),
           "chance_accuracy": _median_of(at, "chance_accuracy")}
    b_reached = _reached(base)
    b_ttt = groups.numbers(base, "time_to_target_s")
    b_ttt[~b_reached] = np.nan
    if p == p0:
        reach = float(n0) if np.isfinite(t_med) else np.nan
        row.update(time_speedup=reach, time_speedup_lo=reach, time_speedup_hi=reach,
                   step_speedup=float(n0), step_speedup_lo=float(n0), step_speedup_hi=float(n0))
    else:
        ts, ts_lo, ts_hi = stats.ratio_ci(b_ttt, ttt, n_boot, n0, seed)
        ss, ss_lo, ss_hi = stats.ratio_ci(groups.numbers(base, "step_time_s"), groups.numbers(at, "step_time_s"),
                                          n_boot, n0, seed)
        row.update(time_speedup=ts, time_speedup_lo=ts_lo, time_speedup_hi=ts_hi,
                   step_speedup=ss, step_speedup_lo=ss_lo, step_speedup_hi=ss_hi)
    if kind == "weak":
        b_samples = np.where(b_reached, groups.numbers(base, "samples_to_target"), np.nan)
        samples = np.where(reached, groups.numbers(at, "samples_to_target"), np.nan)
        se, se_lo, se_hi = ((1.0, 1.0, 1.0) if p == p0 and reached.any() else
                            stats.ratio_ci(b_samples, samples, n_boot, seed=seed))
        row.update(statistical_efficiency=se, statistical_efficiency_lo=se_lo, statistical_efficiency_hi=se_hi)
    return row


def table(df: pd.DataFrame, n_boot: int = stats.N_BOOT, seed: int = stats.SEED) -> Table:
    """Time to a target validation loss, per series, group and placement.

    A **strong** series holds one global batch at several world sizes (the time-to-target speedup
    should equal the step speedup: the same samples per step, so the same steps to the target); a
    **weak** series holds one per-process batch (``local_batch``) at several world sizes, so the global
    batch grows with N and so may the samples needed (statistical efficiency). Both are found in the
    same records: a folder may hold both kinds. Groups: every other config field that differs
    (``lr_rule``, task, widths, ...).

    Per row, over the repeats that reached the target (``n_reached`` of ``n_runs``; medians of runs that
    did not are undefined, so ``all_reached`` says when a median leaves some out): ``steps_to_target``,
    ``samples_to_target``, ``time_to_target_s`` (training wall time, evaluations excluded, the warm-up steps
    counted at the median measured step: :func:`without_warmup`; ``_lo``/``_hi`` its bootstrap 95% interval),
    ``warmup_excess_s`` (the median time taken out, s), ``n_warmup_kept`` and ``warmup_kept`` (the runs whose
    recorded time, compilation and all, had to be kept, each named with why), ``step_time_s``,
    ``final_val_loss``, ``final_val_accuracy``. Against the
    series' smallest placement ``N0``: ``time_speedup = TTT(N0) N0 / TTT(N)`` and ``step_speedup = T(N0) N0
    / T(N)`` (each with an interval), and for weak series ``statistical_efficiency = samples(N0) /
    samples(N)`` (1: the larger batch needs no more samples; 0.5: twice as many).
    """
    df, dropped = groups.valid(groups.with_placement(df), "step_time_s")
    df["local_batch"] = df["global_batch"] // df["world_size"]
    df = without_warmup(df)
    d = groups.groups_of(df, NAME, AXES, SWEPT)
    rows = []
    for key, g in groups.groupby(df, d.groups):
        for kind, by in (("strong", "global_batch"), ("weak", "local_batch")):
            for batch, s in g.groupby(by, sort=True):
                pts = groups.placements(s)
                if s["world_size"].nunique() < 2 or (kind == "weak" and s["global_batch"].nunique() < 2):
                    continue  # a series spans world sizes; a weak one needs a global batch that grows with them
                base = groups.at(s, *pts[0])
                rows += [_row(key, kind, batch, p, groups.at(s, *p), base, pts[0], n_boot, seed) for p in pts]
    out = pd.DataFrame(rows)
    if not out.empty and "statistical_efficiency" not in out:
        out["statistical_efficiency"] = out["statistical_efficiency_lo"] = out["statistical_efficiency_hi"] = np.nan
    return groups.finish(out, d, dropped, "step_time_s")


def val_curves(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The validation-loss curve of every run in ``df`` (records with ``record_path``), from each run's
    ``steps.csv``: one row per evaluation with ``steps`` (optimizer steps done), ``samples``
    (steps x global batch), ``train_time_s`` (cumulative step time of rank 0 up to that step, s; the warm-up
    steps counted at the run's median measured step, as :func:`without_warmup` counts them), ``val_loss``,
    ``val_accuracy``, and the run's ``placement``, ``world_size``, ``global_batch``, ``lr_rule``, ``repeat``,
    ``run_key`` and ``record_path``. Runs without evaluations add no rows. Returns the curves and the run folders
    whose ``steps.csv`` is missing."""
    df = groups.with_placement(df)
    parts, missing = [], []
    for _, r in df.iterrows():
        run_dir = os.path.dirname(str(r.get("record_path", "")))
        if not os.path.exists(os.path.join(run_dir, STEPS_NAME)):
            missing.append(run_dir)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a truncated last row is dropped; the curve needs none of it
            s = load.load_steps(run_dir)
        s = s.sort_values(["step", "attempt"]).drop_duplicates("step", keep="last")
        s["train_time_s"] = np.nancumsum(steady_step_times(s)[0])
        s = s[np.isfinite(s["val_loss"].to_numpy(float))]
        if s.empty:
            continue
        out = pd.DataFrame({"steps": s["step"].to_numpy() + 1, "val_loss": s["val_loss"].to_numpy(float),
                            "val_accuracy": s["val_accuracy"].to_numpy(float),
                            "train_time_s": s["train_time_s"].to_numpy(float)})
        out["samples"] = out["steps"] * int(r["global_batch"])
        for c in ("placement", "world_size", "nnodes", "nproc_per_node", "global_batch", "lr_rule", "repeat", "run_key",
                  "record_path", "model", "task", "target_val_loss"):
            out[c] = r.get(c)
        parts.append(out)
    cols = ["steps", "samples", "train_time_s", "val_loss", "val_accuracy", "placement", "world_size", "nnodes",
            "nproc_per_node", "global_batch", "lr_rule", "repeat", "run_key", "record_path", "model", "task",
            "target_val_loss"]
    return (pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)), missing


# -- figures -------------------------------------------------------------------------------------
def curves_figure(curves: pd.DataFrame, title: str = "Validation loss on the way to the target") -> go.Figure:
    """Validation loss (log) against samples seen and against cumulative step time, one line per run
    (:func:`val_curves`), a subplot pair per learning-rate rule; colour: model; marker:
    placement; dashed: across nodes; the dotted line is the target."""
    rules = sorted(curves["lr_rule"].fillna("none").unique()) if len(curves) else ["none"]
    fig, cols = style.grid(len(rules), 2, [f"lr_rule={r}" if len(rules) > 1 else "" for r in rules],
                           ["Validation loss against samples", "Validation loss against step time (s)"],
                           height_per_row=340,
                           vertical_spacing=min(0.2, 0.7 / max(1, 2 * math.ceil(len(rules) / style.FACET_COLS))))
    fams = set()
    for i, rule in enumerate(rules):
        g = curves[curves["lr_rule"].fillna("none") == rule]
        for key, run in groups.groupby(g, ["record_path"]):
            fams.add(_add_curve(fig, run.sort_values("steps"), i, cols))
        targets = sorted({float(v) for v in g["target_val_loss"].dropna() if float(v) > 0})
        for k in range(2):
            r, c = style.cell(i, k, cols, 2)
            for tv in targets:
                fig.add_hline(y=tv, line=dict(dash="dot", color="grey"), row=r, col=c)
            fig.update_yaxes(type="log", row=r, col=c)
            style.axis_titles(fig, ("samples seen", "cumulative step time (s)")[k],
                              "validation loss (the task's loss, log scale)", r, c)
    style.legend_key(fig, sorted(curves["model"].dropna().unique()) if len(curves) else [],
                     style.drawn_placements(fig, curves) if len(curves) else [], sorted(fams),
                     extra=[("dotted: target validation loss",
                             dict(mode="lines", line=dict(color="grey", dash="dot")))])
    fig.update_layout(title=title, template=style.TEMPLATE)
    return fig


def _add_curve(fig: go.Figure, run: pd.DataFrame, i: int, cols: int) -> str:
    """One run's curve in both panels of facet ``i``; returns its line family."""
    r0 = run.iloc[0]
    m, p = str(r0["model"]), str(r0["placement"])
    fam = groups.family(int(r0["nnodes"]))
    look = dict(mode="lines+markers" if len(run) > 1 else "markers", legendgroup=m, showlegend=False,
                name=f"{m} {p} B={int(r0['global_batch'])} r{int(r0['repeat'])}",
                line=dict(color=style.model_color(m), dash=style.FAMILY_DASH[fam], width=1.5),
                marker=dict(symbol=style.placement_symbol(p), size=6, color=style.model_color(m)))
    hover = [f"{m} {p}, global batch {int(r0['global_batch'])}, repeat {int(r0['repeat'])}<br>step {s}, "
             f"{n:,} samples, {t:.3g} s<br>val loss {v:.4g}" for s, n, t, v in
             zip(run["steps"], run["samples"], run["train_time_s"], run["val_loss"])]
    r, c = style.cell(i, 0, cols, 2)
    fig.add_trace(go.Scatter(x=run["samples"], y=run["val_loss"], hovertext=hover, hoverinfo="text", **look), r, c)
    r, c = style.cell(i, 1, cols, 2)
    fig.add_trace(go.Scatter(x=run["train_time_s"], y=run["val_loss"], hovertext=hover, hoverinfo="text", **look), r, c)
    return fam


def speedup_figure(table: Table, title: str = "Time to target: speedup and statistical efficiency") -> go.Figure:
    """Left: strong series (one global batch) - per placement the step speedup (light bar) beside the
    time-to-target speedup (solid bar), each with its interval; they should match. Right: weak series
    (one per-process batch) - the statistical efficiency ``samples(N0) / samples(N)`` per placement, a
    bar per learning-rate rule (shade). Colour: model."""
    t = table.data
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Strong: step speedup (light) vs time-to-target speedup",
                                                        "Weak: statistical efficiency samples(N0)/samples(N)"))
    strong = t[t["series"] == "strong"]
    for key, g in groups.groupby(strong, ["model"]):
        m = key["model"]
        label = g["placement"] + np.where(g["series_batch"].nunique() > 1, ", B=" + g["series_batch"].astype(str), "")
        for col, name, op in (("step_speedup", "step", 0.35), ("time_speedup", "time to target", 1.0)):
            fig.add_trace(go.Bar(x=label, y=g[col], name=f"{m} {name} speedup", legendgroup=m, showlegend=False,
                                 marker=dict(color=style.model_color(m), opacity=op), **style.error_bars(g, col)), 1, 1)
    weak = t[t["series"] == "weak"]
    rules = sorted(weak["lr_rule"].fillna("none").unique()) if "lr_rule" in weak and len(weak) else []
    for key, g in groups.groupby(weak, ["model"]):
        m = key["model"]
        for j, rule in enumerate(rules):
            gr = g[g["lr_rule"].fillna("none") == rule]
            label = gr["placement"] + ", " + gr["local_batch"].astype(str) + "/process"
            fig.add_trace(go.Bar(x=label, y=gr["statistical_efficiency"], name=f"{m} lr_rule={rule}", legendgroup=m,
                                 showlegend=False, marker=dict(color=style.model_color(m), opacity=1.0 - 0.25 * j),
                                 text=[f"lr {rule}"] * len(gr), textposition="outside",
                                 **style.error_bars(gr, "statistical_efficiency")), 1, 2)
    fig.add_hline(y=1.0, line=dict(dash="dot", color="grey"), row=1, col=2)
    style.legend_key(fig, sorted(t["model"].unique()),
                     extra=[("light: step speedup; solid: time-to-target speedup",
                             dict(mode="markers", marker=dict(symbol="square", color=style.GREY, size=12)))])
    fig.update_yaxes(rangemode="tozero")
    style.axis_titles(fig, "placement (nodes x processes per node)", "speedup over the baseline (x)", 1, 1)
    style.axis_titles(fig, "placement, samples per process", "statistical efficiency samples(N0)/samples(N) (x)",
                      1, 2)
    fig.update_layout(barmode="group", title=title, template=style.TEMPLATE, height=460)
    return fig


def table_of(ctx: Context) -> Table:
    """:func:`table` of the study's records, once per build."""
    return ctx.cached((NAME, "table"), lambda: table(ctx.runs(RECORDS).data))


def _series_lines(t: pd.DataFrame) -> list[str]:
    """A sentence per placement beyond each series' first: the speedups of a strong series, the statistical
    efficiency of a weak one."""
    lines = []
    beyond_n0 = t[t["world_size"] > t.groupby(["series", "series_batch"])["world_size"].transform("min")] \
        if not t.empty else t
    for _, r in beyond_n0.iterrows():
        if r["series"] == "strong":
            lines.append(f"strong, global batch {r['series_batch']}, {r['placement']}: time-to-target speedup "
                         f"{fmt.ci_text(r['time_speedup'], r['time_speedup_lo'], r['time_speedup_hi'], fmt.x)} "
                         f"beside step speedup "
                         f"{fmt.ci_text(r['step_speedup'], r['step_speedup_lo'], r['step_speedup_hi'], fmt.x)}"
                         f" ({r['n_reached']}/{r['n_runs']} runs reached the target).")
        else:
            se = fmt.ci_text(r['statistical_efficiency'], r['statistical_efficiency_lo'],
                             r['statistical_efficiency_hi'], fmt.pct)
            lines.append(f"weak, {r['series_batch']} per process, lr_rule {r.get('lr_rule', 'none')}, {r['placement']} "
                         f"(global batch {r['global_batch']}): statistical efficiency {se}, time-to-target speedup "
                         f"{fmt.x(r['time_speedup'])}.")
    return lines


def warmup_lines(t: pd.DataFrame) -> list[str]:
    """What keeping compilation out of the time to target took out (:func:`without_warmup`), and a sentence per
    placement naming each run whose recorded time had to be kept, with why."""
    if t.empty or "warmup_excess_s" not in t:
        return []
    lines = []
    out = t["warmup_excess_s"].to_numpy(float)
    if np.isfinite(out).any():
        lines.append(f"Compilation kept out of the time to target: each run's warm-up steps (kernels compile, DDP "
                     f"builds its buckets) count at its median measured step, which took out a median of "
                     f"{fmt.sec(float(np.nanmedian(out)))} s per point (its runs' median; up to "
                     f"{fmt.sec(float(np.nanmax(out)))} s).")
    for _, r in t[t["n_warmup_kept"] > 0].iterrows():
        lines.append(f"{r['series']} ({r['series_batch']}), {r['placement']}: the time to target of "
                     f"{r['n_warmup_kept']} of {r['n_reached']} run(s) still holds its warm-up and compilation, "
                     f"which could not be taken out - {r['warmup_kept']}.")
    return lines


def analyze(ctx: Context) -> StudyAnalysis:
    """The validation-loss curves (from each run's steps.csv), the speedup figure and a sentence per series
    point; no table when no batch was measured at two placements."""
    t = table_of(ctx)
    curves, missing = val_curves(ctx.runs(RECORDS).data)
    a = StudyAnalysis(NAME, table=t if not t.empty else None)
    if len(curves):
        a.add_figure("curves", curves_figure(curves), (
            "Validation loss (evaluated every eval_every steps, outside the timed region) against samples seen and "
            "against cumulative step time (the warm-up steps, where kernels compile, counted at the run's median "
            "step), one line per run; the dotted line is the target. In strong mode (one "
            "global batch) the curves against samples coincide, so the faster step reaches the target sooner; in "
            "weak mode a larger global batch may need more samples."))
    if not t.empty:
        a.add_figure("speedup", speedup_figure(t), (
            "Strong series: the time-to-target speedup beside the step speedup, per placement (they should match: "
            "the same samples per step need the same steps). Weak series: statistical efficiency samples(N0)/"
            "samples(N) per learning-rate rule; 1 means the larger batch needs no more samples."))
    a.lines = _series_lines(t.data) + warmup_lines(t.data)
    if missing:
        a.lines.append(f"{len(missing)} run(s) have no steps.csv: no curve.")
    a.extra["curves"] = curves
    a.note = "" if not t.empty else "No series: a strong or weak series needs one batch at two or more placements."
    return a


def display_table(t: Table) -> pd.DataFrame:
    """Per series and placement: runs that reached the target, steps, samples and time to it, both speedups,
    statistical efficiency (weak series) and the final validation loss."""
    d = t.data
    if d.empty:
        return pd.DataFrame()
    out = {**{f: d[f].map(fmt.value) for f in t.group_fields()},
           "series": [f"{s} ({'B' if s == 'strong' else 'per process'} {b})" for s, b in
                      zip(d["series"], d["series_batch"])],
           "placement": d["placement"], "global batch": d["global_batch"],
           "reached": [f"{a}/{b}" for a, b in zip(d["n_reached"], d["n_runs"])],
           "steps to target": d["steps_to_target"].map(lambda v: f"{v:.0f}" if np.isfinite(v) else "n/a"),
           "samples to target": d["samples_to_target"].map(lambda v: f"{v:,.0f}" if np.isfinite(v) else "n/a"),
           "time to target (s)": fmt.ci_column(d, "time_to_target_s", fmt.sec, "time_to_target_lo",
                                               "time_to_target_hi"),
           "warm-up taken out (s)": [(f"{fmt.sec(v)}" if np.isfinite(v) else "none")
                                 + (f"; kept in {k} run(s), named below" if k else "")
                                 for v, k in zip(d["warmup_excess_s"].to_numpy(float), d["n_warmup_kept"])],
           "step (ms)": d["step_time_s"].map(fmt.ms),
           "time-to-target speedup": fmt.ci_column(d, "time_speedup", fmt.x),
           "step speedup": fmt.ci_column(d, "step_speedup", fmt.x)}
    if (d["series"] == "weak").any():
        out["statistical efficiency"] = [fmt.ci_text(v, a, b, fmt.pct) if s == "weak" else "" for s, v, a, b in
                                         zip(d["series"], d["statistical_efficiency"],
                                             d["statistical_efficiency_lo"], d["statistical_efficiency_hi"])]
    out["final val loss"] = d["final_val_loss"].map(lambda v: f"{v:.4g}" if np.isfinite(v) else "n/a")
    if np.isfinite(d["final_val_accuracy"].to_numpy(float)).any():
        out["final val accuracy (chance)"] = [f"{a:.1%} ({c:.1%})" if np.isfinite(a) else "n/a" for a, c in
                                              zip(d["final_val_accuracy"], d["chance_accuracy"])]
    return pd.DataFrame(out).reset_index(drop=True)


def finding(a: StudyAnalysis) -> list[dict]:
    """Per series at its largest placement: the time-to-target speedup (strong) or statistical efficiency (weak)."""
    if a.table is None or a.table.empty:
        return []
    parts = []
    for (kind, batch), g in a.table.data.groupby(["series", "series_batch"], sort=True):
        r = g.sort_values("world_size").iloc[-1]
        if kind == "strong":
            kept = int(g["n_warmup_kept"].sum())
            parts.append(f"strong (B={batch}) at {r['placement']}: time-to-target speedup "
                         f"{fmt.ci_text(r['time_speedup'], r['time_speedup_lo'], r['time_speedup_hi'], fmt.x)} vs step "
                         f"speedup {fmt.x(r['step_speedup'])}"
                         + (f" ({kept} run(s) with their compilation in the time, named in the section)" if kept
                            else ""))
            continue
        for _, rr in g[g["world_size"] == g["world_size"].max()].iterrows():
            se = fmt.ci_text(rr['statistical_efficiency'], rr['statistical_efficiency_lo'],
                             rr['statistical_efficiency_hi'], fmt.pct)
            parts.append(f"weak ({batch}/process, lr_rule {rr.get('lr_rule', 'none')}) at {rr['placement']}: "
                         f"statistical efficiency {se}")
    return [{"study": SECTION, "topic": "Time to the target validation loss", "ours": "; ".join(parts) or "no series",
             "published": PUBLISHED}]


# -- guideline -------------------------------------------------------------------------------------
def _time_ci(row) -> str:
    v, lo, hi = row["time_to_target_s"], row.get("time_to_target_lo", np.nan), row.get("time_to_target_hi", np.nan)
    if np.isfinite(lo) and np.isfinite(hi) and (lo != v or hi != v):
        return f"{v:.3g} s [{lo:.3g}, {hi:.3g}]"
    return f"{v:.3g} s"


def _soonest(g: pd.DataFrame, label: str, target: str, text: list) -> tuple[str, float, str]:
    """The answer for one series that reached the target somewhere, the best time, and its near-the-tie note
    (:func:`kanlib.analysis.stats.tie_unsettled`)."""
    done = g[g["time_to_target_s"].notna()]
    full = done[done["all_reached"]]
    pool = (full if not full.empty else done).sort_values("time_to_target_s")
    best = pool.iloc[0]
    ci = _time_ci(best)
    lo, hi = (pool.get(c, pd.Series(np.nan, index=pool.index)) for c in ("time_to_target_lo", "time_to_target_hi"))
    # tied unless its interval starts more than the margin above the best's: with two or three runs a
    # point's interval is about the range of its runs, and a 2-process run here takes either of two
    # step times (2.2 or 4.4 ms at 1x2 on digits), so intervals that merely do not touch flip between
    # study runs (1x1 named in one of two runs of 64b3775, tied in the other)
    overlap = (lo <= float(hi.iloc[0]) * (1 + stats.MARGIN)) & np.isfinite(hi.iloc[0]) & np.isfinite(lo)
    tied = pool[stats.within_margin(pool["time_to_target_s"]) | overlap]
    unsettled = stats.tie_unsettled(pool["time_to_target_s"], lo, hi)
    near = stats.near_tie_note([f"{r['placement']} {_time_ci(r)}" for (_, r), u in zip(pool.iterrows(), unsettled)
                                if u])
    if len(tied) > 1:
        names = ", ".join(sorted(tied["placement"], key=groups.placement_key))
        answer = (f"no measurable difference between {names}: within {stats.MARGIN:.0%} of "
                  f"{best['placement']}'s {ci} or of its 95% interval, to validation loss {target}")
    else:
        answer = (f"{best['placement']} ({int(best['nnodes'])} node(s) x {int(best['nproc_per_node'])}): "
                  f"{ci} to validation loss {target} ({int(best['n_reached'])}/{int(best['n_runs'])} runs)")
    rest = "; ".join(f"{r['placement']} {_time_ci(r)}" + ("" if r["all_reached"] else
                                                         f" ({int(r['n_reached'])}/{int(r['n_runs'])} reached)")
                     for _, r in done.iterrows() if r["placement"] != best["placement"])
    missed = [r["placement"] for _, r in g.iterrows() if r["n_reached"] == 0]
    text.append(f"{label}: {best['placement']} reaches the target soonest, in {ci} of training "
                + (f"(not measurably sooner than {', '.join(tied['placement'][1:])}: within "
                   f"{stats.MARGIN:.0%} of its time or of its 95% interval) " if len(tied) > 1 else "")
                + f"({best['steps_to_target']:.0f} steps, {best['samples_to_target']:,.0f} samples)"
                + (f"; also: {rest}" if rest else "")
                + (f"; never reached at {', '.join(missed)}" if missed else "") + ".")
    return answer, float(best["time_to_target_s"]), near


def guideline(ctx: Context, goals: Goals) -> tuple[list[dict], list[str]]:
    """Per group and series: the placement that reaches the target validation loss soonest (several named
    together when the data cannot rank them)."""
    t = table_of(ctx)
    rows, text = [], []
    if t.empty:
        text.append("Time to accuracy: no series with two placements of one global or per-process batch.")
        return rows, text
    keys = t.group_fields()
    target = groups.unique_text(ctx.runs(RECORDS).data, "target_val_loss")
    for key, g in groups.groupby(t.data, keys + ["series", "series_batch"]):
        label = groups.model_label({k: v for k, v in key.items() if k in keys})
        what = (f"global batch {key['series_batch']}" if key["series"] == "strong"
                else f"{key['series_batch']} samples per process")
        label = f"{label}, {key['series']} ({what})"
        near = ""
        if g["time_to_target_s"].notna().any():
            answer, value, near = _soonest(g, label, target, text)
        else:
            answer, value = f"none reached validation loss {target}", np.nan
            text.append(f"{label}: no placement reached the target validation loss {target} (best final loss "
                        f"{g['final_val_loss'].min():.4g}); train longer or raise the target.")
        rows.append({"question": "placement that reaches the target soonest", "group": label, "answer": answer,
                     "value": value, "basis": NAME, "near": near})
    return rows, text
