"""Strong scaling: a fixed global batch over a growing number of processes, per placement and work size.

Speedup ``S = T(N0) N0 / T(N)``, efficiency ``S / N`` and the Karp-Flatt serial fraction per (group, placement),
medians over repeats with bootstrap 95% intervals; efficiency against the work per process across work sizes.
The Karp-Flatt fraction is the study's one serial-fraction measure, clipped to [0, 1] (:func:`serial_fraction`).
Guideline: the placement with the most processes that keeps the target efficiency,
and per placement the least work per process that does.
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

NAME = SECTION = RECORDS = "strong_scaling"
TITLE = "Strong scaling (fixed global batch)"
PAPER = claims.PUBLISHED
PUBLISHED = (f"speedup {PAPER['speedup']}x, efficiency {PAPER['efficiency']:.1%} at {PAPER['world_size']} GPUs over "
             f"{PAPER['nnodes']} nodes ({PAPER['nnodes']}x{PAPER['nproc_per_node']})")
CONFIRM_WITHIN = 0.10
"""A measured efficiency at the largest world size confirms the published one within this many points."""
AXES = ("nnodes", "nproc_per_node")
"""What varies within a group: the placement."""
SWEPT = ("nnodes", "nproc_per_node", "global_batch", "widths", "n_train")
"""What one sweep of the study varies (runners/plans.py); records that differ in anything else come from several."""
EXPLORER = View(x=("world_size", "global_batch", "local_batch", "n_params"))
WORK_FIELDS = {"global_batch", "widths", "n_train", "local_batch"}
"""The group fields that set the work per process (a work size)."""


def design(df: pd.DataFrame) -> groups.Design:
    """How this study's records split (:func:`kanlib.analysis.groups.design`)."""
    return groups.design(df, NAME, AXES, SWEPT)


def table(df: pd.DataFrame, metric: str = "step_time_s", by: tuple[str, ...] | None = None,
          n_boot: int = stats.N_BOOT, seed: int = stats.SEED) -> Table:
    """Strong-scaling table: one row per (group, placement) with the median of ``metric`` over
    repeats, its bootstrap 95% interval, the speedup ``T(N0) / T(N) * N0`` (interval from resampling
    both), the efficiency ``S / N`` (with its interval) and the Karp-Flatt serial fraction (clipped to [0, 1]:
    beyond it the speedup is below 1 or superlinear, :func:`serial_fraction`).

    Groups are every config field that differs between the records (:func:`design`), plus ``by``.
    ``N0`` is the group's smallest world size (normally 1; on the fewest nodes when several
    placements have it). Placements stay apart: ``1x2`` and ``2x1`` are two rows at N = 2.
    ``work_per_process_s = T(N0) N0 / N`` is the compute a process would do at N with perfect scaling
    (the x axis of "efficiency against work per process"). Columns: the group fields, ``world_size``,
    ``nnodes``, ``nproc_per_node``, ``placement``, ``inter_node``, ``n_runs``, ``<metric>`` with
    ``_lo``/``_hi``, ``speedup``/``_lo``/``_hi``, ``efficiency``/``_lo``/``_hi``, ``karp_flatt``,
    ``local_batch``, ``work_per_process_s``. The table's note says what separates the groups.
    """
    if metric not in df:
        raise KeyError(f"column {metric!r} is not in the records (have: {', '.join(df.columns)})")
    df, dropped = groups.valid(groups.with_placement(df), metric)
    d = groups.groups_of(df, NAME, AXES, SWEPT, by)
    rows = []
    for key, g in groups.groupby(df, d.groups):
        pts = groups.placements(g)
        n0_nodes, n0_ppn = pts[0]
        n0 = n0_nodes * n0_ppn
        base = groups.at(g, n0_nodes, n0_ppn)[metric].to_numpy(float)
        t0 = float(np.median(base))
        for nodes, ppn in pts:
            n = nodes * ppn
            at = groups.at(g, nodes, ppn)
            v = at[metric].to_numpy(float)
            med, lo, hi = stats.median_ci(v, n_boot, seed)
            sp = t0 / med * n0
            if (nodes, ppn) == (n0_nodes, n0_ppn):  # the baseline's speedup is n0 by definition
                sp_lo = sp_hi = sp
            else:
                _, sp_lo, sp_hi = stats.ratio_ci(base, v, n_boot, n0, seed)
            gb = int(at["global_batch"].iloc[0]) if "global_batch" in at else 0
            work = {k: at[k].iloc[0] for k in ("widths", "global_batch") if k in at and k not in key}
            rows.append({**key, **work, "world_size": n, "nnodes": nodes, "nproc_per_node": ppn,
                         "placement": groups.placement_of(nodes, ppn), "inter_node": nodes > 1, "n_runs": int(v.size),
                         metric: med, f"{metric}_lo": lo, f"{metric}_hi": hi, f"{metric}_runs": tuple(v.tolist()),
                         "speedup": sp, "speedup_lo": sp_lo, "speedup_hi": sp_hi,
                         "efficiency": sp / n, "efficiency_lo": sp_lo / n, "efficiency_hi": sp_hi / n,
                         "local_batch": gb // n if gb else np.nan, "work_per_process_s": t0 * n0 / n})
    out = pd.DataFrame(rows)
    if not out.empty:  # a serial fraction is a fraction: beyond [0, 1] the speedup is below 1 or superlinear
        out["karp_flatt"] = np.clip(stats.karp_flatt(out["speedup"], out["world_size"]), 0.0, 1.0)
    return groups.finish(out, d, dropped, metric)


# -- figures -------------------------------------------------------------------------------------
def figure(table: Table, title: str = "Strong scaling", target: float = Goals.target_efficiency) -> go.Figure:
    """Speedup and parallel efficiency against world size (medians, bootstrap 95% bars), with the
    ideal, one subplot pair per group (work size, ...); colour = model, marker = placement, solid =
    within one node, dashed = across nodes. Every speedup panel shares one y range, every efficiency panel
    another (groups compare at a glance), and each efficiency panel carries the ``target`` (the guidelines'
    target efficiency) as a long-dashed line."""
    facets = style.facets(table.data, table.group_fields(drop=("model",)))
    fig, cols = style.grid(len(facets), 2, [f for f, _ in facets], ["Speedup T(1)/T(N)", "Efficiency S/N"])
    not_drawn, families = [], set()
    d = table.data
    top_speedup = 1.08 * max(_top(d, "speedup"), float(d["world_size"].max()) if len(d) else 1.0)
    top_eff = max(1.05, 1.05 * _top(d, "efficiency"))
    for i, (label, g) in enumerate(facets):
        n = sorted(g["world_size"].unique())
        r1, c = style.cell(i, 0, cols, 2)
        r2, _ = style.cell(i, 1, cols, 2)
        if len(n) >= 2:
            fig.add_trace(go.Scatter(x=n, y=n, mode="lines", name="ideal", legendgroup="ideal", showlegend=i == 0,
                                     line=dict(dash="dot", color="grey"), hoverinfo="skip"), r1, c)
            fig.add_trace(go.Scatter(x=n, y=[1.0] * len(n), mode="lines", name="ideal", legendgroup="ideal",
                                     showlegend=False, line=dict(dash="dot", color="grey"), hoverinfo="skip"), r2, c)
        for m, gm in g.groupby("model", sort=True):
            lines = style.series(gm, "speedup")
            if not lines:
                not_drawn.append(f"{m} ({label or 'all'}: one placement only)")
            for fam, s in lines:
                families.add(fam)
                hover = [f"{m} {p}<br>N={w}<br>S={sp:.2f} [{lo:.2f}, {hi:.2f}]<br>E={e:.0%}<br>T={t * 1e3:.3g} ms"
                         f"<br>runs={k}" for p, w, sp, lo, hi, e, t, k in
                         zip(s["placement"], s["world_size"], s["speedup"], s["speedup_lo"], s["speedup_hi"],
                             s["efficiency"], s["step_time_s"], s["n_runs"])]
                look = dict(mode="lines+markers", legendgroup=str(m), showlegend=False,
                            line=dict(color=style.model_color(m), dash=style.FAMILY_DASH[fam]),
                            marker=dict(symbol=style.symbols(s), size=10, color=style.model_color(m)),
                            hovertext=hover, hoverinfo="text")
                fig.add_trace(go.Scatter(x=s["world_size"], y=s["speedup"], name=f"{m} {fam}",
                                         **style.error_bars(s, "speedup"), **look), r1, c)
                fig.add_trace(go.Scatter(x=s["world_size"], y=s["efficiency"], name=f"{m} {fam}",
                                         **style.error_bars(s, "efficiency"), **look), r2, c)
        for r in (r1, r2):
            fig.update_xaxes(tickvals=n, row=r, col=c)
            style.axis_titles(fig, "world size N (processes)", None, r, c)
        style.axis_titles(fig, None, "speedup S (x)", r1, c)
        style.axis_titles(fig, None, "efficiency E = S/N (% of ideal)", r2, c)
        fig.update_yaxes(range=[0, top_speedup], row=r1, col=c)
        fig.update_yaxes(range=[0, top_eff], tickformat=".0%", row=r2, col=c)
        style.target_line(fig, target, r2, c)
    style.legend_key(fig, sorted(table.data["model"].unique()), style.drawn_placements(fig, table.data),
                     sorted(families), extra=[style.target_key(target)])
    fig.update_layout(title=title, template=style.TEMPLATE)
    return style.with_meta(fig, not_drawn=not_drawn, target=target)


def _top(d: pd.DataFrame, col: str) -> float:
    """The highest of ``col`` and its interval's high end in ``d`` (0 when none is finite)."""
    vals = np.r_[d[col].to_numpy(float), d[f"{col}_hi"].to_numpy(float)] if col in d else np.array([])
    vals = vals[np.isfinite(vals)]
    return float(vals.max()) if vals.size else 0.0


def work_figure(table: Table, title: str = "Efficiency against work per process",
                target: float = Goals.target_efficiency) -> go.Figure | None:
    """Efficiency at each multi-process placement against the work a process does per step
    (``T(1) / N``, log scale), across the groups of work size: shows how much work per process a
    placement needs to scale (the long-dashed line is the ``target``). One line per (model, placement, other group
    fields) with at least two work sizes; None when no line has two."""
    t = table.data[table.data["world_size"] > 1]
    other = [f for f in table.group_fields(drop=("model",)) if f not in WORK_FIELDS]
    fig = go.Figure()
    fams, drawn = set(), False
    for key, g in groups.groupby(t, ["model", "placement"] + other):
        g = g.sort_values("work_per_process_s")
        if len(g) < 2:
            continue
        drawn = True
        m, p = key["model"], key["placement"]
        fam = groups.family(int(g["nnodes"].iloc[0]))
        fams.add(fam)
        label = groups.group_label(key, other)
        hover = [f"{m} {p} {label}<br>widths={list(w)}, B={b}<br>work/process={x * 1e3:.3g} ms<br>"
                 f"E={fmt.ci_text(e, lo, hi, fmt.pct)}" for w, b, x, e, lo, hi in
                 zip(g["widths"], g["global_batch"], g["work_per_process_s"], g["efficiency"], g["efficiency_lo"],
                     g["efficiency_hi"])]
        fig.add_trace(go.Scatter(x=g["work_per_process_s"] * 1e3, y=g["efficiency"], mode="lines+markers",
                                 name=f"{m} {p} {label}".strip(), legendgroup=str(m), showlegend=False,
                                 line=dict(color=style.model_color(m), dash=style.FAMILY_DASH[fam]),
                                 marker=dict(symbol=style.placement_symbol(p), size=10, color=style.model_color(m)),
                                 hovertext=hover, hoverinfo="text", **style.error_bars(g, "efficiency")))
    if not drawn:
        return None
    fig.add_hline(y=1.0, line=dict(dash="dot", color="grey"))
    style.target_line(fig, target)
    style.legend_key(fig, sorted(t["model"].unique()), style.drawn_placements(fig, t), sorted(fams),
                     extra=[style.target_key(target)])
    fig.update_xaxes(type="log", title_text="work per process per step, T(1)/N (ms)")
    fig.update_yaxes(title_text="efficiency E = S/N (% of ideal)", rangemode="tozero", tickformat=".0%")
    fig.update_layout(title=title, template=style.TEMPLATE, height=460)
    return fig


def _work_caption(t: pd.DataFrame) -> str:
    parts = []
    for p, g in t[t["world_size"] > 1].groupby("placement"):
        g = g.sort_values("work_per_process_s")
        if len(g) < 2:
            continue
        lo, hi = g.iloc[0], g.iloc[-1]
        way = "rises" if hi["efficiency"] > lo["efficiency"] else "does not rise"
        parts.append(f"at {p} it {way}, from {lo['efficiency']:.0%} at {lo['work_per_process_s'] * 1e3:.3g} ms to "
                     f"{hi['efficiency']:.0%} at {hi['work_per_process_s'] * 1e3:.3g} ms")
    return ("Efficiency against the work a process does per step, T(1)/N (log scale), one line per "
            f"placement across the work sizes; the long-dashed line is the target ({Goals.target_efficiency:.0%}). "
            "Efficiency should rise with work per process (little work "
            "per process is latency-bound): " + "; ".join(parts) + ".")


def serial_fraction(row) -> str:
    """A row's Karp-Flatt serial fraction as printed: in [0, 1] always. Above 1 the speedup is below 1 (slower than
    the baseline: overhead, not a serial part, explains it), below 0 it is superlinear; either is printed at the
    bound it passed with the reason. '' at the baseline (N0, where it is undefined)."""
    v = row["karp_flatt"]
    if not np.isfinite(v):
        return ""
    if row["speedup"] < 1:
        return "1 (capped: slower than N0, overhead beyond any serial part)"
    if row["speedup"] > row["world_size"]:
        return "0 (capped: superlinear speedup)"
    return f"{v:.3f}"


def serial_fractions(t: Table) -> list[str]:
    """Per group: the Karp-Flatt serial fraction at each multi-process placement (the one serial-fraction measure
    of this study, never above 1: :func:`serial_fraction`); a fraction rising with N means overhead that grows with
    N, such as communication, rather than a fixed serial part."""
    out = []
    for key, g in groups.groupby(t.data, t.group_fields()):
        g = g[np.isfinite(g["karp_flatt"].to_numpy(float))].sort_values(["world_size", "nnodes"], kind="stable")
        if g.empty:
            continue
        out.append(f"{groups.group_label(key)}: Karp-Flatt serial fraction "
                   + ", ".join(f"{r['placement']} {serial_fraction(r)}" for _, r in g.iterrows()))
    return out


def analyze(ctx: Context) -> StudyAnalysis:
    """The table, the speedup and efficiency figure, the work figure (when there are work sizes) and the serial
    fractions (printed below in a notebook)."""
    t = ctx.cached((NAME, "table"), lambda: table(ctx.runs(RECORDS).data))
    a = StudyAnalysis(NAME, table=t)
    fig = figure(t)
    a.add_figure("speedup_efficiency", fig, (
        "Speedup T(1)/T(N) and efficiency S/N per group (subplot), medians over repeats with bootstrap 95% bars; "
        f"the dotted line is ideal scaling, the long-dashed line the guidelines' target efficiency "
        f"({Goals.target_efficiency:.0%}); every group shares one y range per row. Colour: model; marker: placement "
        "(nodes x processes per node); solid lines stay on one node, dashed lines cross nodes. See how far each "
        "point falls below ideal, and whether "
        "crossing nodes costs more than adding processes on one node." + style.not_drawn(fig)))
    w = work_figure(t)
    if w is not None:
        a.add_figure("work", w, _work_caption(t.data))
    a.printed = serial_fractions(t)
    return a


def display_table(t: Table) -> pd.DataFrame:
    """The table as a reader needs it: step time in ms, speedup as x, efficiency in %, 95% intervals in brackets."""
    d = t.data
    if d.empty:
        return pd.DataFrame()
    out = {**{f: d[f].map(fmt.value) for f in t.group_fields()}, "placement": d["placement"], "runs": d["n_runs"],
           "step time (ms)": fmt.ci_column(d, "step_time_s", fmt.ms),
           "speedup": fmt.ci_column(d, "speedup", fmt.x),
           "efficiency": fmt.ci_column(d, "efficiency", fmt.pct),
           "Karp-Flatt serial fraction": [serial_fraction(r) for _, r in d.iterrows()]}
    return pd.DataFrame(out).reset_index(drop=True)


def finding(a: StudyAnalysis) -> list[dict]:
    """Speedup and efficiency at the largest N per placement (the most work per process there), and how
    efficiency moves with the work per process."""
    if a.empty or a.table is None or a.table.empty:
        return []
    t = a.table.data
    n = int(t["world_size"].max())
    parts = []
    for p, g in t[t["world_size"] == n].groupby("placement"):
        r = g.sort_values("work_per_process_s").iloc[-1]  # the most work per process at that placement
        grp = groups.group_label({f: r[f] for f in a.table.group_fields()})
        parts.append(f"{p}: speedup {fmt.row_ci(r, 'speedup', fmt.x)}, efficiency "
                     f"{fmt.row_ci(r, 'efficiency', fmt.pct)} ({grp})")
    m = t[t["world_size"] > 1]
    if len(m) > 1:
        rising = {p: g.sort_values("work_per_process_s")["efficiency"].iloc[-1] >
                  g.sort_values("work_per_process_s")["efficiency"].iloc[0]
                  for p, g in m.groupby("placement") if len(g) > 1}
        up = [p for p, r in rising.items() if r]
        flat = [p for p, r in rising.items() if not r]
        trend = (f", rising with work per process at {', '.join(up)}" if up else "") + \
                (f"{';' if up else ','} not rising with work per process at {', '.join(flat)}" if flat else "")
        parts.append(f"over {len(m)} multi-process points efficiency ranges {m['efficiency'].min():.0%}-"
                     f"{m['efficiency'].max():.0%}{trend}")
    return [{"study": SECTION, "topic": f"Strong scaling at the largest N ({n})",
             "ours": "; ".join(parts) if n > 1 else "only N = 1 measured", "published": PUBLISHED}]


# -- guideline -------------------------------------------------------------------------------------
def largest_efficient_world_size(strong: pd.DataFrame, target: float) -> tuple[int, float]:
    """Largest N whose efficiency, and that of every smaller measured N of the same kind of placement,
    reaches ``target`` (a lucky point beyond a failing one does not count). Returns ``(N, efficiency
    at N)``; the smallest measured N (efficiency 1 by definition) when no larger one qualifies."""
    best = largest_efficient_placement(strong, target)
    return int(best["world_size"]), float(best["efficiency"])


def reaches(row, target: float) -> bool:
    """Whether a row's efficiency reaches ``target`` on its 95% interval (:func:`kanlib.analysis.stats.reaches`, the
    rule of every threshold decision: the whole interval does, or the median does and the low end is within the
    decision margin). Before the host allocator was fixed (83b254b) the mid-size work of the default study measured
    70-75% at two processes in five quiet runs and 99-101% in a sixth (a bimodal one-process baseline): on the
    medians alone the answer flipped; after it, six studies measured 63-71% with low ends of 57-66%."""
    return stats.reaches_row(row, "efficiency", target) == "yes"


def near(rows, target: float) -> str:
    """The ``near`` note of a threshold answer (:func:`kanlib.analysis.stats.near_note`) over ``rows`` (an
    iterable of rows): those whose efficiency interval holds ``target``."""
    return stats.near_note([f"{r.get('placement', '')} {fmt.pct_ci(r, 'efficiency')}".strip() for r in rows
                            if stats.holds_row(r, "efficiency", target)], target)


def within_note(rows, target: float) -> str:
    """'; not shown, their 95% intervals hold 80%: 1x2 70% [56%, 81%]' for the ``rows`` (an iterable of rows) whose
    intervals hold ``target`` without all of it reaching it; '' when none does."""
    held = [r for r in rows if stats.reaches_row(r, "efficiency", target) == "within"]
    if not held:
        return ""
    return (f"; not shown, their 95% intervals hold {target:.0%}: "
            + ", ".join(f"{r.get('placement', '')} {fmt.pct_ci(r, 'efficiency')}".strip() for r in held))


def largest_efficient_placement(strong: pd.DataFrame, target: float) -> pd.Series:
    """The row of ``strong`` (one group of :func:`table`) with the most processes whose efficiency, and that of
    every smaller placement of its kind (one node, or across nodes), reaches ``target`` on its interval
    (:func:`reaches`); ties go to the higher efficiency. The baseline row when none qualifies."""
    t = strong.sort_values(["world_size", "nnodes"], kind="stable")
    base = t.iloc[0]
    best = base
    for fam in ("one node", "across nodes"):
        chain = t[(t["nnodes"] == 1) if fam == "one node" else (t["nnodes"] > 1)]
        for _, row in chain.iterrows():
            if row["world_size"] == base["world_size"] and row["nnodes"] == base["nnodes"]:
                continue
            if not reaches(row, target):
                break
            if (row["world_size"], row["efficiency"]) > (best["world_size"], best["efficiency"]):
                best = row
    return best


def _placement_answer(g: pd.DataFrame, label: str, target: float, text: list) -> dict:
    """The guideline row of one group: the placement with the most processes that keeps ``target``."""
    multi = g[g["world_size"] > 1]
    best = largest_efficient_placement(g, target)
    if best["world_size"] == g["world_size"].min():
        top = multi.loc[multi["efficiency"].fillna(-1).idxmax()]
        fit_txt = f"Karp-Flatt serial fraction there {serial_fraction(top)}"
        held = within_note([r for _, r in multi.iterrows()], target)
        answer = (f"none of {', '.join(multi['placement'])}: best {top['placement']} at {fmt.pct_ci(top, 'efficiency')}"
                  + held)
        text.append(f"{label}: no multi-process placement reaches {target:.0%} strong-scaling efficiency; the best "
                    f"is {top['placement']} ({int(top['nnodes'])} node(s) x {int(top['nproc_per_node'])} "
                    f"processes) at {fmt.pct_ci(top, 'efficiency')}, speedup {top['speedup']:.2f}x; {fit_txt}. "
                    f"More work per process is needed at this size" + (f" ({held[2:]})" if held else "") + ".")
        value = float(top["efficiency"])
    else:
        fit_txt = f"Karp-Flatt serial fraction there {serial_fraction(best)}"
        answer = (f"{best['placement']} ({int(best['nnodes'])} node(s) x {int(best['nproc_per_node'])} processes): "
                  f"{fmt.pct_ci(best, 'efficiency')}")
        # other placements of the same world size that meet it too are named with it, in placement order, so
        # that which of them measured higher this time does not change the answer
        same_n = multi[(multi["world_size"] == best["world_size"]).to_numpy()
                       & np.array([reaches(r, target) for _, r in multi.iterrows()], dtype=bool)]
        if len(same_n) > 1:
            same_n = same_n.sort_values("placement", key=lambda c: c.map(groups.placement_key))
            answer = (f"{', '.join(same_n['placement'])} (N={int(best['world_size'])}): "
                      + "; ".join(f"{r['placement']} {fmt.pct_ci(r, 'efficiency')}" for _, r in same_n.iterrows()))
        others = multi[(multi["placement"] != best["placement"])]
        alt = "; ".join(f"{r['placement']} {fmt.pct_ci(r, 'efficiency')}" for _, r in others.iterrows())
        text.append(f"{label}: use up to {best['placement']} ({int(best['nnodes'])} node(s) x "
                    f"{int(best['nproc_per_node'])} processes per node), which keeps {fmt.pct_ci(best, 'efficiency')} "
                    f"efficiency (speedup {best['speedup']:.2f}x)" + (f"; also measured: {alt}" if alt else "")
                    + f"; {fit_txt}.")
        value = float(best["efficiency"])
    # the placements the answer depends on: up to the first world size beyond the one taken
    beyond = multi.loc[multi["world_size"] > best["world_size"], "world_size"]
    upto = beyond.min() if len(beyond) else multi["world_size"].max()
    return {"question": f"placement with efficiency >= {target:g}", "group": label, "answer": answer,
            "value": value, "basis": NAME,
            "near": near([r for _, r in multi[multi["world_size"] <= upto].iterrows()], target)}


def _least_work(t: Table, target: float, rows: list, text: list) -> None:
    """Per placement (across work sizes): the least work per process that reaches ``target``."""
    keys = t.group_fields()
    other = [k for k in keys if k not in WORK_FIELDS and k != "model"]
    if not any(k in WORK_FIELDS for k in keys):
        return
    for key, g in groups.groupby(t.data[t.data["world_size"] > 1], ["model", "placement"] + other):
        g = g.sort_values("work_per_process_s")
        if len(g) < 2:
            continue
        label = groups.model_label({k: v for k, v in key.items() if k != "placement"})
        ok = g[[reaches(r, target) for _, r in g.iterrows()]]
        if ok.empty:
            top = g.loc[g["efficiency"].fillna(-1).idxmax()]
            answer = (f"none of {len(g)} work sizes: best {fmt.pct_ci(top, 'efficiency')} at "
                      f"{top['work_per_process_s'] * 1e3:.3g} ms per process")
            text.append(f"{label}, {key['placement']}: none of the {len(g)} measured work sizes reaches {target:.0%}; "
                        f"the most work per process ({top['work_per_process_s'] * 1e3:.3g} ms, widths "
                        f"{list(top['widths'])}, global batch {int(top['global_batch'])}) gives "
                        f"{fmt.pct_ci(top, 'efficiency')}.")
            value = float(top["efficiency"])
        else:
            r = ok.iloc[0]
            answer = (f"widths {list(r['widths'])}, global batch {int(r['global_batch'])}: "
                      f"{r['work_per_process_s'] * 1e3:.3g} ms per process, {fmt.pct_ci(r, 'efficiency')}")
            text.append(f"{label}, {key['placement']}: {target:.0%} efficiency needs at least "
                        f"{r['work_per_process_s'] * 1e3:.3g} ms of work per process per step (measured: widths "
                        f"{list(r['widths'])}, global batch {int(r['global_batch'])}, {fmt.pct_ci(r, 'efficiency')}).")
            value = float(r["work_per_process_s"])
        # the work sizes the answer depends on: the one taken and the smaller ones (every one when none is taken)
        upto = g if ok.empty else g[g["work_per_process_s"] <= ok.iloc[0]["work_per_process_s"]]
        rows.append({"question": f"{key['placement']}: least work per process with efficiency >= {target:g}",
                     "group": label, "answer": answer, "value": value, "basis": NAME,
                     "near": stats.near_note([f"{r['work_per_process_s'] * 1e3:.3g} ms per process "
                                              f"{fmt.pct_ci(r, 'efficiency')}" for _, r in upto.iterrows()
                                              if stats.holds_row(r, "efficiency", target)], target)})


def guideline(ctx: Context, goals: Goals) -> tuple[list[dict], list[str]]:
    """Per group: the placement (nodes x processes per node) with the most processes whose efficiency, and that of
    every smaller placement of its kind, reaches the target; per placement, the least work per process that does."""
    t = ctx.cached((NAME, "table"), lambda: table(ctx.runs(RECORDS).data))
    target = goals.target_efficiency
    rows, text = [], []
    for key, g in groups.groupby(t.data, t.group_fields()):
        label = groups.model_label(key)
        if g[g["world_size"] > 1].empty:
            # measured but disturbed is not "not measured": the answer says how many runs were left out, and counts
            # as unanswered (kanlib.guidelines.compare)
            left = groups.select_records(ctx.left_out(NAME), key)
            left = left[left["world_size"] > 1] if len(left) else left
            if len(left):
                answer = unanswered("every multi-process run was disturbed", left)
                text.append(f"{label}: no placement can be recommended: {answer.split(': ', 2)[2]}, every "
                            f"multi-process run measured ({disturbed_why(left)}).")
            else:
                answer = "not measured: no multi-process placement"
                text.append(f"{label}: strong scaling has no multi-process placement measured, so no placement can "
                            f"be recommended (measured: {', '.join(g['placement'])}).")
            rows.append({"question": f"placement with efficiency >= {target:g}", "group": label,
                         "answer": answer, "value": np.nan, "basis": NAME})
            continue
        rows.append(_placement_answer(g, label, target, text))
    _least_work(t, target, rows, text)
    return rows, text


def judge(a: StudyAnalysis, machine: dict, other: str, guidelines=None, ctx=None) -> dict:
    """The verdict on the published strong scaling: the efficiency at the largest world size (its most work per
    process) within :data:`CONFIRM_WITHIN` of the paper's, where this machine is comparable."""
    t = a.table.data
    top = t[t["world_size"] == t["world_size"].max()].sort_values("work_per_process_s").iloc[-1]
    num = f"{top['placement']}: efficiency {fmt.row_ci(top, 'efficiency', fmt.pct)}"
    ok = abs(float(top["efficiency"]) - PAPER["efficiency"]) <= CONFIRM_WITHIN
    return claims.verdict(ok, num, f"within {CONFIRM_WITHIN * 100:.0f} points of {PAPER['efficiency']:.1%}",
                          f"more than {CONFIRM_WITHIN * 100:.0f} points from {PAPER['efficiency']:.1%}", other)


CLAIMS = (claims.Claim("Strong scaling", PUBLISHED, judge, NAME),)
"""The published claim this study answers."""
