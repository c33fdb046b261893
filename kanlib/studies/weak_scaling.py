"""Weak scaling: a fixed per-process batch over a growing number of processes.

Throughput ``X(N) = global_batch / T(N)``, the weak-scaling efficiency ``E_w = X(N) N0 / (N X(N0))`` and, against
the first multi-process point of the same kind of placement, ``E_w,multi`` (the published study saw a drop from
1 to several GPUs, then stability). Guideline: the smallest per-process batch that keeps the target.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kanlib.analysis import claims, fmt, groups, stats, style
from kanlib.analysis.context import Context, Goals, disturbed_why, unanswered
from kanlib.analysis.explorer import View
from kanlib.analysis.section import StudyAnalysis
from kanlib.analysis.style import go
from kanlib.analysis.table import Table

NAME = SECTION = RECORDS = "weak_scaling"
TITLE = "Weak scaling (fixed per-process batch)"
PUBLISHED = "a drop in efficiency from 1 to several GPUs, then stable"
STABLE_FROM_FIRST_MULTI = 0.9
"""'Then stable': every larger world size keeps at least this share of the first multi-process point's throughput
per process."""
AXES = ("nnodes", "nproc_per_node", "global_batch")
"""What varies within a group: global batch = per-process batch x N; the per-process batch is a group field."""
SWEPT = ("nnodes", "nproc_per_node", "global_batch", "local_batch")
EXPLORER = View(x=("world_size", "local_batch", "n_params"))


def design(df: pd.DataFrame) -> groups.Design:
    """How this study's records split (:func:`kanlib.analysis.groups.design`)."""
    return groups.design(df, NAME, AXES, SWEPT)


def table(df: pd.DataFrame, by: tuple[str, ...] | None = None, n_boot: int = stats.N_BOOT,
          seed: int = stats.SEED) -> Table:
    """Weak scaling at a fixed per-process batch: per (group, placement) the median throughput
    ``X(N) = global_batch / T(N)`` with its bootstrap interval, the per-process throughput ``X(N) / N``,
    the weak-scaling efficiency ``E_w = X(N) N0 / (N X(N0))`` against the group's smallest world size
    ``N0`` (with a bootstrap interval), and ``E_w,multi = X(N) N1 / (N X(N1))`` against the first
    multi-process point ``N1`` of the same kind of placement (one node, or across nodes).

    Groups: the per-process batch ``local_batch`` and every other config field that differs (model,
    widths, ...), never only the batch. NaN for ``E_w,multi`` where it is not defined.
    """
    df, dropped = groups.valid(groups.with_placement(df), "step_time_s")
    df["local_batch"] = df["global_batch"] // df["world_size"]
    df["throughput"] = df["global_batch"] / df["step_time_s"]
    d = groups.groups_of(df, NAME, AXES, SWEPT, tuple(by or ()) + ("local_batch",))
    rows = []
    for key, g in groups.groupby(df, d.groups):
        pts = groups.placements(g)
        x = {p: groups.at(g, *p)["throughput"].to_numpy(float) for p in pts}
        p0 = pts[0]
        n0 = p0[0] * p0[1]
        x0 = float(np.median(x[p0]))
        first_multi = {}
        for p in pts:
            fam = groups.family(p[0])
            if p[0] * p[1] > 1 and fam not in first_multi:
                first_multi[fam] = p
        for p in pts:
            n = p[0] * p[1]
            med, lo, hi = stats.median_ci(x[p], n_boot, seed)
            if p == p0:
                e_lo = e_hi = 1.0 * n0 / n * med / x0
            else:
                _, e_lo, e_hi = stats.ratio_ci(x[p], x[p0], n_boot, n0 / n, seed)
            p1 = first_multi.get(groups.family(p[0]))
            multi = np.nan
            if p1 is not None and n >= p1[0] * p1[1]:
                n1 = p1[0] * p1[1]
                multi = med * n1 / (n * float(np.median(x[p1])))
            rows.append({**key, "world_size": n, "nnodes": p[0], "nproc_per_node": p[1],
                         "placement": groups.placement_of(*p), "inter_node": p[0] > 1, "n_runs": int(x[p].size),
                         "throughput": med, "throughput_lo": lo, "throughput_hi": hi,
                         "per_process_throughput": med / n,
                         "weak_efficiency": med * n0 / (n * x0), "weak_efficiency_lo": e_lo,
                         "weak_efficiency_hi": e_hi, "weak_efficiency_multi": multi})
    return groups.finish(pd.DataFrame(rows), d, dropped, "step_time_s")


Y_TITLES = ("throughput X (samples/s)", "E_w = X(N) / (N X(1)) (% of ideal)", "E_w vs first multi-process (%)")
"""The y-axis title of each row of :func:`figure`."""


def figure(table: Table, title: str = "Weak scaling", target: float = Goals.target_efficiency) -> go.Figure:
    """Throughput and weak-scaling efficiency against world size, a subplot pair per group
    (per-process batch, ...), the ``target`` efficiency as a long-dashed line; a third row of efficiency against
    the first multi-process point only when some line has two multi-process points (else it would be a lone
    dot)."""
    facets = style.facets(table.data, table.group_fields(drop=("model",)))
    multi_ok = any(len(s.dropna(subset=["weak_efficiency_multi"])) >= 2
                   for _, g in facets for _, gm in g.groupby("model") for _, s in style.series(gm, "throughput"))
    rows = ["Throughput (samples/s)", "Weak-scaling efficiency E_w"] + (["E_w vs first multi-process point"]
                                                                        if multi_ok else [])
    fig, cols = style.grid(len(facets), len(rows), [f for f, _ in facets], rows)
    not_drawn, families = [], set()
    for i, (label, g) in enumerate(facets):
        n = sorted(g["world_size"].unique())
        for m, gm in g.groupby("model", sort=True):
            lines = style.series(gm, "throughput")
            if not lines:
                not_drawn.append(f"{m} ({label or 'all'}: one placement only)")
            for fam, s in lines:
                families.add(fam)
                _add_series(fig, s, m, fam, i, cols, len(rows), multi_ok)
        for k, y in enumerate(Y_TITLES[:len(rows)]):
            r, c = style.cell(i, k, cols, len(rows))
            fig.update_xaxes(tickvals=n, row=r, col=c)
            fig.update_yaxes(rangemode="tozero", row=r, col=c, **({"tickformat": ".0%"} if k else {}))
            style.axis_titles(fig, "world size N (processes)", y, r, c)
            if k == 1:
                style.target_line(fig, target, r, c)
    style.legend_key(fig, sorted(table.data["model"].unique()), style.drawn_placements(fig, table.data),
                     sorted(families), extra=[style.target_key(target)])
    fig.update_layout(title=title, template=style.TEMPLATE)
    return style.with_meta(fig, not_drawn=not_drawn, multi_row=multi_ok, target=target)



def _add_series(fig: go.Figure, s: pd.DataFrame, m: str, fam: str, i: int, cols: int, n_rows: int,
                multi_ok: bool) -> None:
    """One model's line of one facet in every panel of the weak-scaling figure."""
    hover = [f"{m} {p}<br>N={w}<br>X={x:.4g}/s<br>E_w={fmt.ci_text(e, lo, hi, fmt.pct)}<br>runs={k}"
             for p, w, x, e, lo, hi, k in zip(s["placement"], s["world_size"], s["throughput"],
                                              s["weak_efficiency"], s["weak_efficiency_lo"],
                                              s["weak_efficiency_hi"], s["n_runs"])]
    look = dict(mode="lines+markers", legendgroup=str(m), showlegend=False, name=f"{m} {fam}",
                line=dict(color=style.model_color(m), dash=style.FAMILY_DASH[fam]),
                marker=dict(symbol=style.symbols(s), size=10, color=style.model_color(m)),
                hovertext=hover, hoverinfo="text")
    r, c = style.cell(i, 0, cols, n_rows)
    fig.add_trace(go.Scatter(x=s["world_size"], y=s["throughput"], **style.error_bars(s, "throughput"), **look), r, c)
    r, c = style.cell(i, 1, cols, n_rows)
    fig.add_trace(go.Scatter(x=s["world_size"], y=s["weak_efficiency"], **style.error_bars(s, "weak_efficiency"),
                             **look), r, c)
    sm = s.dropna(subset=["weak_efficiency_multi"])
    if multi_ok and len(sm) >= 2:
        r, c = style.cell(i, 2, cols, n_rows)
        fig.add_trace(go.Scatter(x=sm["world_size"], y=sm["weak_efficiency_multi"],
                                 **{**look, "marker": dict(symbol=style.symbols(sm), size=10,
                                                           color=style.model_color(m)),
                                    "hovertext": None, "hoverinfo": None}), r, c)


def analyze(ctx: Context) -> StudyAnalysis:
    """The table and the throughput and efficiency figure."""
    t = ctx.cached((NAME, "table"), lambda: table(ctx.runs(RECORDS).data))
    a = StudyAnalysis(NAME, table=t)
    fig = figure(t)
    extra = ("" if (fig.layout.meta or {}).get("multi_row") else
             " Efficiency against the first multi-process point is not drawn: it needs two multi-process world sizes "
             "of one kind of placement; the table has it where defined.")
    a.add_figure("throughput_efficiency", fig, (
        "Throughput and weak-scaling efficiency X(N)/(N X(1)) per group (per-process batch, ...), medians with "
        f"bootstrap 95% bars; the long-dashed line is the guidelines' target efficiency "
        f"({Goals.target_efficiency:.0%}). "
        "Colour: model; marker: placement; dashed lines cross nodes. See the drop from one "
        "process to the first multi-process point, and whether efficiency then stays flat." + extra
        + style.not_drawn(fig)))
    return a


def display_table(t: Table) -> pd.DataFrame:
    """Throughput with its interval, per process, and both weak-scaling efficiencies in %."""
    d = t.data
    if d.empty:
        return pd.DataFrame()
    out = {**{f: d[f].map(fmt.value) for f in t.group_fields()}, "placement": d["placement"], "runs": d["n_runs"],
           "throughput (samples/s)": fmt.ci_column(d, "throughput", lambda v: f"{v:,.0f}"),
           "per process (samples/s)": [f"{v:,.0f}" for v in d["per_process_throughput"]],
           "E_w": fmt.ci_column(d, "weak_efficiency", fmt.pct),
           "E_w vs first multi-process": [fmt.pct(v) if np.isfinite(v) else "" for v in d["weak_efficiency_multi"]]}
    return pd.DataFrame(out).reset_index(drop=True)


def finding(a: StudyAnalysis) -> list[dict]:
    """The drop from one process to the first multi-process point, then the stability after it."""
    if a.empty or a.table is None or a.table.empty:
        return []
    t = a.table.data
    parts = []
    for p, g in t[t["world_size"] > 1].groupby("placement"):
        first = g[g["world_size"] == g["world_size"].min()]
        r = first.sort_values("local_batch").iloc[-1]
        parts.append(f"{p} (N={int(r['world_size'])}, {int(r['local_batch'])} samples/process): E_w "
                     f"{fmt.row_ci(r, 'weak_efficiency', fmt.pct)}"
                     f", a drop of {1 - r['weak_efficiency']:.0%}")
    stable = t.dropna(subset=["weak_efficiency_multi"])
    stable = stable[stable["world_size"] > stable.groupby("placement")["world_size"].transform("min")]
    if stable.empty:
        parts.append("stability after the drop not measurable here: one multi-process world size per placement")
    else:
        r = stable.sort_values("world_size").iloc[-1]
        parts.append(f"then {r['weak_efficiency_multi']:.0%} of the first multi-process point's efficiency at "
                     f"N={int(r['world_size'])} ({r['placement']})")
    return [{"study": SECTION, "topic": "Weak scaling: the drop, then stability",
             "ours": "; ".join(parts) or "no multi-process point", "published": PUBLISHED}]


def smallest_efficient_batch(weak: pd.DataFrame, target: float, placement: str | None = None
                             ) -> tuple[int | None, int, float]:
    """Smallest per-process batch whose weak-scaling efficiency reaches ``target`` at the largest measured world size
    (of ``placement``, when given) on its 95% interval (:func:`kanlib.analysis.stats.reaches`, the rule of every
    threshold decision: the whole interval does, or the median does and the interval's low end is within the
    decision margin of it). Returns ``(batch, N, efficiency)``; batch None when none does (efficiency then the best
    measured, NaN if none is finite).

    Not on the median alone: before the host allocator was fixed (83b254b) the single-process baseline of the
    compute-bound batch ran at 30-32 or at 37-39 ms from one run to the next in one launch, so the 2048-per-process
    efficiency at 1x2 came out 75% in one quiet study run and 90% in the next. Not on the whole interval alone
    either: with the allocator fixed it measured 86% [81%, 90%] and 81% [77%, 85%] in two quiet studies (the
    baseline ran 8% faster in the second session), and the answer flipped at the interval's low end."""
    w = weak if placement is None else weak[weak["placement"] == placement]
    n_max = int(w["world_size"].max())
    at = w[w["world_size"] == n_max].sort_values("local_batch")
    ok = at[[stats.reaches_row(r, "weak_efficiency", target) == "yes" for _, r in at.iterrows()]]
    if ok.empty:
        finite = at["weak_efficiency"].where(np.isfinite(at["weak_efficiency"]))
        return None, n_max, float(finite.max()) if finite.notna().any() else float("nan")
    row = ok.iloc[0]
    return int(row["local_batch"]), n_max, float(row["weak_efficiency"])


def guideline(ctx: Context, goals: Goals) -> tuple[list[dict], list[str]]:
    """Per group and placement: the smallest per-process batch whose weak-scaling efficiency reaches the target
    at the largest measured world size."""
    t = ctx.cached((NAME, "table"), lambda: table(ctx.runs(RECORDS).data))
    target = goals.target_efficiency
    rows, text = [], []
    for key, g in groups.groupby(t.data, t.group_fields(drop=("local_batch",))):
        label = groups.model_label(key)
        for p in sorted(set(g.loc[g["world_size"] > 1, "placement"]), key=groups.placement_key):
            b, n, e = smallest_efficient_batch(g, target, p)
            sizes = ", ".join(map(str, sorted(g.loc[g["placement"] == p, "local_batch"].unique())))
            if b is None:
                best = g[(g["placement"] == p)].sort_values("weak_efficiency").iloc[-1]
                held = [r for _, r in g[(g["placement"] == p) & (g["world_size"] == n)].iterrows()
                        if stats.reaches_row(r, "weak_efficiency", target) == "within"]
                note = (f"; not shown, its 95% interval holds {target:.0%}: "
                        + ", ".join(f"{int(r['local_batch'])} at {fmt.pct_ci(r, 'weak_efficiency')}" for r in held)
                        if held else "")
                answer = (f"none of {sizes}: best {int(best['local_batch'])} at {fmt.pct_ci(best, 'weak_efficiency')}"
                          + note)
                text.append(f"{label}, {p}: no measured per-process batch ({sizes}) reaches {target:.0%} "
                            f"weak-scaling efficiency at N={n} on its 95% interval (the whole interval, or the median "
                            f"with the low end within the {stats.MARGIN:.0%} margin); the best, "
                            f"{int(best['local_batch'])} samples per process, gives "
                            f"{fmt.pct_ci(best, 'weak_efficiency')}{note}: use larger batches per process.")
            else:
                row = g[(g["placement"] == p) & (g["local_batch"] == b)].iloc[0]
                answer = f"{b} samples per process: {fmt.pct_ci(row, 'weak_efficiency')}"
                text.append(f"{label}, {p}: use at least {b} samples per process; that keeps weak-scaling efficiency "
                            f"at {fmt.pct_ci(row, 'weak_efficiency')} at N={n}.")
            # the batches the answer depends on: the one taken and the smaller ones (every one when none is taken)
            at_n = g[(g["placement"] == p) & (g["world_size"] == n)].sort_values("local_batch")
            at_n = at_n if b is None else at_n[at_n["local_batch"] <= b]
            near = [f"{int(r['local_batch'])} at {fmt.pct_ci(r, 'weak_efficiency')}" for _, r in at_n.iterrows()
                    if stats.holds_row(r, "weak_efficiency", target)]
            rows.append({"question": f"{p}: smallest per-process batch with weak efficiency >= {target:g}",
                         "group": label, "answer": answer, "value": e, "basis": NAME,
                         "near": stats.near_note(near, target)})
        # a multi-process placement whose every run was disturbed and left out: unanswered, not silently absent
        left = groups.select_records(ctx.left_out(RECORDS), key)
        left = left[(left["world_size"] > 1) & ~left["placement"].isin(set(g["placement"]))] if len(left) else left
        for p, lp in left.groupby("placement", sort=False) if len(left) else ():
            answer = unanswered(f"every run at {p} was disturbed", lp)
            text.append(f"{label}, {p}: no per-process batch can be recommended: {answer.split(': ', 2)[2]}, every "
                        f"run measured there ({disturbed_why(lp)}).")
            rows.append({"question": f"{p}: smallest per-process batch with weak efficiency >= {target:g}",
                         "group": label, "answer": answer, "value": np.nan, "basis": NAME})
    return rows, text


def judge(a: StudyAnalysis, machine: dict, other: str, guidelines=None, ctx=None) -> dict:
    """The verdict on the published weak scaling: needs three or more world sizes (a drop, then stable); stable
    when every point beyond the first multi-process one keeps :data:`STABLE_FROM_FIRST_MULTI` of it."""
    t = a.table.data
    top = t[t["world_size"] == t["world_size"].max()].sort_values("weak_efficiency").iloc[-1]
    num = f"N={int(top['world_size'])} ({top['placement']}): E_w {fmt.row_ci(top, 'weak_efficiency', fmt.pct)}"
    if t["world_size"].nunique() < 3:
        return {"verdict": claims.NOT_COMPARABLE if other else "untested", "number": num,
                "why": "'then stable' needs three or more world sizes; "
                       + (other or f"measured {t['world_size'].nunique()}")}
    multi = t.dropna(subset=["weak_efficiency_multi"])
    stable = bool(len(multi)) and multi["weak_efficiency_multi"].min() >= STABLE_FROM_FIRST_MULTI
    return claims.verdict(stable, num, "stable beyond the first multi-process point", "keeps falling", other)


CLAIMS = (claims.Claim("Weak scaling", PUBLISHED, judge, NAME),)
"""The published claim this study answers."""
