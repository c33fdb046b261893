"""Data-parallel options of the communication study against plain DDP: hook compression (bf16, fp16),
PowerSGD, gradient accumulation, ``gradient_as_bucket_view``, ``static_graph``, bucket size.

Each option runs as its own point with its no-op twin; its step time, exposed communication and the validation
loss after the same samples are set beside plain DDP at the same point. Guideline: the fastest option that keeps
the validation loss within a tolerance of plain DDP's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kanlib.analysis import fmt, groups, stats, style
from kanlib.analysis.context import Context, Goals
from kanlib.analysis.explorer import View
from kanlib.analysis.section import StudyAnalysis
from kanlib.analysis.style import go, make_subplots
from kanlib.analysis.table import Table
from kanlib.studies import communication
from kanlib.studies.communication import OPTION_FIELDS, PLAIN_BUCKET_MB

NAME = "options"
SECTION = RECORDS = "communication"
TITLE = "Data-parallel options against plain DDP"
PUBLISHED = "plain DDP only"
AXES, SWEPT, EXPLORER = communication.AXES, communication.SWEPT, View()
HARM_COLOR = "#d62728"


def _as_plain(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with a missing option value read as its plain value (records that predate a field ran with it)."""
    df = df.copy()
    for f, v in OPTION_FIELDS.items():
        if f in df:
            df[f] = df[f].astype(object).where(df[f].notna(), v)
    return df


def table(df: pd.DataFrame, tolerance: float = 0.01, n_boot: int = stats.N_BOOT, seed: int = stats.SEED,
          comm: Table | None = None) -> Table:
    """Each data-parallel option of a communication study against plain DDP.

    From :func:`kanlib.studies.communication.table` (step time with the option's communication, exposed
    communication by the no-op-hook method; ``comm``, when given, is that table of the same records) and each
    point's ``final_val_loss`` (median over repeats: every option trains on the same samples, so it is the
    validation loss after the same samples). Plain DDP is the same point (group, placement, NCCL algorithm,
    emulated link) with the timed hook and no option; an option that only changes the bucket size is compared
    with plain DDP at :data:`PLAIN_BUCKET_MB`, any other with plain DDP at its own bucket size. Columns:
    ``option``, ``is_plain``, the point's fields, ``step_time_s``, ``exposed_s``, ``overhead_fraction``,
    ``val_loss``, ``plain_step_time_s``, ``plain_exposed_s``, ``plain_val_loss``, ``step_time_ratio``,
    ``exposed_delta_s``, ``val_loss_delta``, ``val_loss_rel_delta`` and ``harms_convergence`` (relative increase
    above ``tolerance``); NaN where plain DDP was not measured at that point (``plain_missing``). Points run
    through an emulated link are the calibration's, not options: they are left out.
    """
    if not tolerance >= 0:
        raise ValueError(f"tolerance: must be >= 0, got {tolerance!r}")
    filled = _as_plain(df)
    missing = any(f in df and df[f].isna().any() for f in OPTION_FIELDS)
    t = comm if comm is not None and not missing else communication.table(filled, n_boot=n_boot, seed=seed)
    d = t.data
    if d.empty:
        return t
    d = d[(d["emulate_latency_s"] == 0) & (d["emulate_bandwidth_bytes_per_s"] == 0)]
    if d.empty:
        return t.with_data(d)
    out = _with_plain(_option_rows(d, groups.with_placement(filled), t.group_fields()), t.group_fields())
    out["plain_missing"] = out["plain_step_time_s"].isna()
    out["step_time_ratio"] = out["step_time_s"] / out["plain_step_time_s"]
    out["exposed_delta_s"] = out["exposed_s"] - out["plain_exposed_s"]
    out["val_loss_delta"] = out["val_loss"] - out["plain_val_loss"]
    out["val_loss_rel_delta"] = out["val_loss_delta"] / out["plain_val_loss"]
    out["harms_convergence"] = out["val_loss_rel_delta"] > tolerance
    out = out.sort_values(["nnodes", "nproc_per_node", "is_plain", "option"], ascending=[True, True, False, True],
                          kind="stable").reset_index(drop=True)
    return t.with_data(out)


def _option_rows(d: pd.DataFrame, recs: pd.DataFrame, group_fields: list[str]) -> pd.DataFrame:
    """One row per point of the communication table: its option set, label and median validation loss."""
    point_fields = list(dict.fromkeys(group_fields + ["nnodes", "nproc_per_node", "bucket_cap_mb", "nccl_algo",
                                                      "comm_hook", "emulate_latency_s",
                                                      "emulate_bandwidth_bytes_per_s"]))
    rows = []
    for _, r in d.iterrows():
        key = {f: r[f] for f in point_fields if f in r}
        sel = groups.select_records(recs, key)
        opts = {f: (r[f] if f in r else groups.constant(recs, f, v)) for f, v in OPTION_FIELDS.items()}
        val = groups.numbers(sel, "final_val_loss")
        row = {**r.to_dict(), **opts,
               "option": communication.option_label(opts, r["bucket_cap_mb"], groups.constant(sel, "powersgd_rank", 1)),
               "step_time_s": r["t_allreduce_s"], "val_loss": float(np.nanmedian(val)) if np.isfinite(val).any()
               else np.nan}
        row["is_plain"] = row["option"] == "plain DDP"
        rows.append(row)
    return pd.DataFrame(rows)


def _with_plain(out: pd.DataFrame, group_fields: list[str]) -> pd.DataFrame:
    """``plain_<column>``: plain DDP's values at each option's point (NaN where plain DDP was not measured)."""
    # PowerSGD's rank is the option's own parameter, not a difference of the point plain DDP must share
    rest = [f for f in group_fields if f not in OPTION_FIELDS and f not in ("bucket_cap_mb", "powersgd_rank")]
    same = rest + ["nnodes", "nproc_per_node", "nccl_algo", "emulate_latency_s", "emulate_bandwidth_bytes_per_s"]
    plain_cols = ("step_time_s", "t_allreduce_lo", "t_allreduce_hi", "exposed_s", "val_loss")
    for c in plain_cols:
        out[f"plain_{c}"] = np.nan
    for i, r in out.iterrows():
        is_default = all(groups.hashable(r[f]) == groups.hashable(v) for f, v in OPTION_FIELDS.items())
        cap = PLAIN_BUCKET_MB if is_default else r["bucket_cap_mb"]
        want = {f: r[f] for f in same if f in out}
        cand = groups.select_records(out, {**want, **OPTION_FIELDS, "bucket_cap_mb": cap})
        if cand.empty and is_default:  # no 25 MiB point: compare with plain DDP at the same bucket size
            cand = groups.select_records(out, {**want, **OPTION_FIELDS, "bucket_cap_mb": r["bucket_cap_mb"]})
        if not cand.empty:
            for c in plain_cols:
                out.at[i, f"plain_{c}"] = cand.iloc[0][c]
    return out


def table_of(ctx: Context, tolerance: float | None = None) -> Table:
    """:func:`table` of the communication records at ``tolerance`` (default: the context's), once per build."""
    tolerance = ctx.val_loss_tolerance if tolerance is None else tolerance
    return ctx.cached((NAME, "table", tolerance), lambda: table(
        ctx.runs(RECORDS).data, tolerance=tolerance, comm=communication.table_of(ctx)))


def figure(table: Table, tolerance: float, title: str = "Data-parallel options against plain DDP") -> go.Figure:
    """Per option and placement (:func:`table`): step time relative to plain DDP, exposed communication, and the
    validation loss after the same samples relative to plain DDP (the shaded band is ``tolerance``). Colour:
    model; marker: placement; a red outline marks an option whose validation loss is worse than plain DDP's by
    more than the tolerance."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=("Step time / plain DDP", "Exposed communication (ms)",
                                                        "Validation loss vs plain DDP (%)"), horizontal_spacing=0.1)
    t = table.data.copy()
    if "model" not in t:
        t["model"] = "kan"
    for key, g in groups.groupby(t, ["model", "placement"]):
        m, p = key["model"], key["placement"]
        harm = g["harms_convergence"].fillna(False).astype(bool).to_numpy()
        marker = dict(symbol=style.placement_symbol(p), size=11, color=style.model_color(m),
                      line=dict(color=[HARM_COLOR if h else style.model_color(m) for h in harm],
                                width=[3 if h else 0 for h in harm]))
        hover = [f"{o} at {p}<br>step {s * 1e3:.3g} ms ({fmt.slower_faster(r)} than plain)<br>exposed "
                 f"{e * 1e3:.3g} ms<br>val loss "
                 f"{v:.5g} ({d:+.2%} vs plain)" for o, s, r, e, v, d in
                 zip(g["option"], g["step_time_s"], g["step_time_ratio"], g["exposed_s"], g["val_loss"],
                     g["val_loss_rel_delta"])]
        look = dict(mode="markers", legendgroup=str(m), showlegend=False, name=f"{m} {p}", marker=marker,
                    hovertext=hover, hoverinfo="text")
        fig.add_trace(go.Scatter(x=g["option"], y=g["step_time_ratio"], **look), 1, 1)
        fig.add_trace(go.Scatter(x=g["option"], y=g["exposed_s"] * 1e3, **look), 1, 2)
        fig.add_trace(go.Scatter(x=g["option"], y=g["val_loss_rel_delta"] * 100, **look), 1, 3)
    fig.add_hline(y=1.0, line=dict(dash="dot", color="grey"), row=1, col=1)
    fig.add_hrect(y0=-tolerance * 100, y1=tolerance * 100, fillcolor="grey", opacity=0.15, line_width=0, row=1, col=3)
    style.legend_key(fig, sorted(t["model"].unique()), style.drawn_placements(fig, t),
                     extra=[(f"red outline: validation loss > {tolerance:.1%} above plain DDP",
                             dict(mode="markers", marker=dict(symbol="circle", size=11, color="white",
                                                              line=dict(color=HARM_COLOR, width=3))))])
    fig.update_xaxes(tickangle=-30)
    for col, y in enumerate(("step time / plain DDP's (x)", "exposed communication (ms per step)",
                             "validation loss vs plain DDP (%)"), start=1):
        style.axis_titles(fig, "option", y, 1, col)
    fig.update_layout(title=title, template=style.TEMPLATE, height=500)
    return fig


def display_table(t: Table) -> pd.DataFrame:
    """Each option at each placement: step and exposed time beside plain DDP's, validation loss, convergence."""
    o = t.data
    return pd.DataFrame({
        "option": o["option"], "placement": o["placement"], "bucket (MiB)": o["bucket_cap_mb"].map(lambda v: f"{v:g}"),
        "runs": o["n_runs"], "step (ms)": o["step_time_s"].map(fmt.ms),
        "step vs plain": o["step_time_ratio"].map(fmt.slower_faster),
        "exposed (ms)": o["exposed_s"].map(fmt.ms), "plain exposed (ms)": o["plain_exposed_s"].map(fmt.ms),
        "val loss": o["val_loss"].map(lambda v: f"{v:.5g}" if np.isfinite(v) else "n/a"),
        "vs plain": o["val_loss_rel_delta"].map(fmt.signed_pct),
        "convergence": ["harmed" if h else ("n/a" if not np.isfinite(d) else "kept") for h, d in
                        zip(o["harms_convergence"], o["val_loss_rel_delta"])]})


def _judged(o: pd.DataFrame) -> pd.DataFrame:
    """The options with plain DDP measured at their point, on the machine's own link."""
    return o[~o["is_plain"] & ~o["plain_missing"] & ~groups.emulated(o)]


def analyze(ctx: Context) -> StudyAnalysis:
    """The options figure and table, and a sentence per option (when the study ran any)."""
    a = StudyAnalysis(NAME)
    t = table_of(ctx)
    o = t.data
    if o.empty or not (~o["is_plain"]).any():
        return a
    tol = ctx.val_loss_tolerance
    a.add_figure("options", figure(t, tol), (
        f"Step time, exposed communication and validation loss after the same samples of each data-parallel "
        f"option, relative to plain DDP (timed hook, no option, same placement) at the same point. A red outline "
        f"marks an option whose validation loss is more than {tol:.1%} above plain DDP's."))
    a.add_table("options", display_table(t), "Data-parallel options against plain DDP")
    a.extra["options"] = o
    for _, r in _judged(o).iterrows():
        a.lines.append(f"{r['option']} at {r['placement']}: step {fmt.slower_faster(r['step_time_ratio'])} than plain "
                       f"DDP, exposed "
                       f"{r['exposed_s'] * 1e3:.3g} ms vs {r['plain_exposed_s'] * 1e3:.3g} ms, validation loss "
                       f"{fmt.signed_pct(r['val_loss_rel_delta'])}"
                       + (" (harms convergence)" if r["harms_convergence"] else "") + ".")
    return a


def finding(a: StudyAnalysis) -> list[dict]:
    """Each option's step time and validation loss against plain DDP, and whether it harms convergence."""
    opts = a.extra.get("options") if not a.empty else None
    if opts is None or opts.empty:
        return []
    parts = [f"{r['option']} ({r['placement']}): step {fmt.slower_faster(r['step_time_ratio'])}, val loss "
             f"{fmt.signed_pct(r['val_loss_rel_delta'])}" + (" - harms convergence" if r["harms_convergence"] else "")
             for _, r in _judged(opts).iterrows()]
    if not parts:
        return []
    return [{"study": SECTION, "topic": "Data-parallel options against plain DDP", "ours": "; ".join(parts),
             "published": PUBLISHED}]


def _step_intervals_overlap(opt) -> bool:
    """Whether an option's step-time interval overlaps plain DDP's (an option row of the options table); no
    interval on either side counts as overlapping: a single run cannot show a difference beyond its noise."""
    both = stats.ranges_overlap(opt, opt, "t_allreduce", "plain_t_allreduce")
    single = (opt.get("t_allreduce_lo") == opt.get("t_allreduce_hi")
              and opt.get("plain_t_allreduce_lo") == opt.get("plain_t_allreduce_hi"))
    return True if both is None or single else both


def _ms_ci(row, prefix: str) -> str:
    mid = row.get("step_time_s" if prefix == "t_allreduce" else "plain_step_time_s", np.nan)
    return f"{mid * 1e3:.3g} ms [{row[prefix + '_lo'] * 1e3:.3g}, {row[prefix + '_hi'] * 1e3:.3g}]"


def _best_option(ok: pd.DataFrame) -> tuple[str, float]:
    """The answer naming the fastest option that keeps convergence, or plain DDP when none is faster beyond
    the margin or the runs' spread; and its step time against plain DDP's."""
    best = ok.loc[ok["step_time_ratio"].idxmin()]
    answer = (f"{best['option']}: step {fmt.slower_faster(best['step_time_ratio'])} than plain DDP, exposed "
              f"{best['exposed_s'] * 1e3:.3g} ms (plain {best['plain_exposed_s'] * 1e3:.3g} ms), validation "
              f"loss {best['val_loss_rel_delta']:+.2%}")
    if not best["step_time_ratio"] < 1 - stats.MARGIN:  # within run-to-run spread of plain DDP
        answer = f"plain DDP: no option is more than {stats.MARGIN:.0%} faster (the best, {answer})"
    elif _step_intervals_overlap(best):  # faster in the medians, not beyond the runs' spread
        answer = (f"plain DDP: no option is faster beyond the 95% intervals of the step times (the best, "
                  f"{answer}; step {_ms_ci(best, 't_allreduce')} against plain "
                  f"{_ms_ci(best, 'plain_t_allreduce')})")
    return answer, float(best["step_time_ratio"])


def guideline(ctx: Context, goals: Goals) -> tuple[list[dict], list[str]]:
    """Per placement: the fastest data-parallel option that keeps the validation loss after the same samples
    within the tolerance of plain DDP's (plain DDP when none is faster beyond the runs' spread)."""
    tolerance = goals.val_loss_tolerance
    try:
        table = table_of(ctx, tolerance).data
    except KeyError:  # no pair of timed and no-op runs: the communication study's guideline says so
        return [], []
    rows, text = [], []
    if table.empty or table["is_plain"].all():
        return rows, text
    for p, g in table.groupby("placement", sort=False):
        opts = g[~g["is_plain"] & ~g["plain_missing"]]
        opts = opts[~groups.emulated(opts)]  # options are judged on the machine's own link
        if opts.empty:
            continue
        harm = opts[opts["harms_convergence"]]
        ok = opts[~opts["harms_convergence"] & opts["val_loss_rel_delta"].notna()]
        if ok.empty:
            answer, value = f"none keeps the validation loss within {tolerance:.1%} of plain DDP", np.nan
        else:
            answer, value = _best_option(ok)
        harm_txt = "; ".join(f"{r['option']} ({r['val_loss_rel_delta']:+.1%})" for _, r in harm.iterrows())
        text.append(f"{p}: of {len(opts)} data-parallel option(s), the fastest that keeps the validation loss after "
                    f"the same samples within {tolerance:.1%} of plain DDP is {answer}"
                    + (f"; harming convergence: {harm_txt}" if harm_txt else "; none harms convergence") + ".")
        rows.append({"question": f"{p}: fastest data-parallel option within {tolerance:.1%} of plain DDP's loss",
                     "group": "communication", "answer": answer, "value": value, "basis": "communication options"})
    return rows, text

