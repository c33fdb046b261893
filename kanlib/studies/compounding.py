"""Compounding: does a faster KAN kernel's speedup multiply with the data-parallel speedup?

Grouped by the kernel path that ran (``kan_path``), the measured combination ``T(ref, N0) N0 / T(k, N)`` is set
beside the product of the kernel speedup and the reference kernel's DDP speedup; below 1, the faster kernel
exposes communication. Guideline: the fastest kernel x placement.
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

NAME = SECTION = RECORDS = "compounding"
TITLE = "Compounding: KAN kernel x data parallelism"
PUBLISHED = "claimed complementary (operator-level x data-parallel), not measured together"
AXES = ("nnodes", "nproc_per_node", "kan_impl")
SWEPT = ("nnodes", "nproc_per_node", "kan_impl")
EXPLORER = View(x=("world_size", "global_batch", "n_params"), series=("kan_impl", "kan_path"))
KERNEL_ORDER = ("reference", "fast", "compiled")
KERNEL_COLORS = {"reference": "#9ecae1", "fast": "#4292c6", "compiled": "#08306b"}
"""KAN kernel paths as shades of the KAN colour (light: reference, dark: compiled)."""


def design(df: pd.DataFrame) -> groups.Design:
    """How this study's records split (:func:`kanlib.analysis.groups.design`)."""
    return groups.design(df, NAME, AXES, SWEPT)


def kernel_of(df: pd.DataFrame) -> pd.Series:
    """The KAN kernel path each record actually ran (``kan_path``; several paths joined by ``+``), falling
    back to the requested ``kan_impl`` for records that do not say (schema 1, non-KAN models)."""
    path = df["kan_path"] if "kan_path" in df else pd.Series("", index=df.index)
    impl = df["kan_impl"] if "kan_impl" in df else pd.Series("", index=df.index)
    path = path.fillna("").astype(str)
    return path.where(path != "", impl.fillna("").astype(str))


def _kernel_rank(k: str) -> tuple:
    return (KERNEL_ORDER.index(k) if k in KERNEL_ORDER else len(KERNEL_ORDER), k)


def _group_rows(key: dict, g: pd.DataFrame, n_boot: int, seed: int) -> list[dict]:
    """The rows of one group: every kernel (as ran, and as asked for) at every placement, against the baseline."""
    pts = groups.placements(g)
    p0 = pts[0]
    n0 = p0[0] * p0[1]
    kernels = sorted({(k, i) for k, i in zip(g["kernel"], g["kan_impl"])},
                     key=lambda ki: (_kernel_rank(ki[0]), _kernel_rank(ki[1])))
    t = {(k, i, p): groups.at(g[(g["kernel"] == k) & (g["kan_impl"] == i)], *p)["step_time_s"].to_numpy(float)
         for k, i in kernels for p in pts}
    at_base = [ki for ki in kernels if t[(*ki, p0)].size]
    if not at_base:
        return []
    ref = next((ki for ki in at_base if ki[0] == "reference"), None) or \
        max(at_base, key=lambda ki: float(np.median(t[(*ki, p0)])))
    t_ref0 = t[(*ref, p0)]
    rows = []
    for k, i in kernels:
        t0 = t[(k, i, p0)]
        ks, ks_lo, ks_hi = stats.ratio_ci(t_ref0, t0, n_boot, seed=seed) if t0.size else (np.nan,) * 3
        for p in pts:
            v = t[(k, i, p)]
            if not v.size:
                continue
            n = p[0] * p[1]
            med, lo, hi = stats.median_ci(v, n_boot, seed)
            ds, ds_lo, ds_hi = stats.ratio_ci(t0, v, n_boot, n0, seed) if t0.size else (np.nan,) * 3
            ref_p = t[(*ref, p)]
            ds_ref = float(np.median(t_ref0)) * n0 / float(np.median(ref_p)) if ref_p.size else np.nan
            ms, ms_lo, ms_hi = stats.ratio_ci(t_ref0, v, n_boot, n0, seed)
            product = ks * ds_ref
            rows.append({**key, "kernel": k, "kan_impl": i, "fell_back": k != i, "baseline_kernel": ref[0],
                         "world_size": n, "nnodes": p[0], "nproc_per_node": p[1], "placement": groups.placement_of(*p),
                         "inter_node": p[0] > 1, "n_runs": int(v.size), "step_time_s": med, "step_time_lo": lo,
                         "step_time_hi": hi, "kernel_speedup": ks, "kernel_speedup_lo": ks_lo,
                         "kernel_speedup_hi": ks_hi, "ddp_speedup": ds, "ddp_speedup_lo": ds_lo,
                         "ddp_speedup_hi": ds_hi, "efficiency": ds / n, "efficiency_ref": ds_ref / n,
                         "efficiency_change": ds / n - ds_ref / n, "product": product, "measured": ms,
                         "measured_lo": ms_lo, "measured_hi": ms_hi, "compounding": ms / product
                         if product and np.isfinite(product) else np.nan})
    return rows


def table(df: pd.DataFrame, n_boot: int = stats.N_BOOT, seed: int = stats.SEED) -> Table:
    """Does a faster KAN kernel's speedup multiply with the data-parallel speedup?

    Rows per (group, kernel, placement). The kernel is what ran (``kan_path``, :func:`kernel_of`), kept
    apart by the requested ``kan_impl`` too (``compiled`` that fell back to the eager path is its own
    row, ``fell_back`` True). With the group's smallest placement ``N0`` and the slowest kernel measured
    there as the baseline (``reference`` when present), medians over repeats:

    - ``kernel_speedup = T(ref, N0) / T(k, N0)``;
    - ``ddp_speedup = T(k, N0) N0 / T(k, N)``, ``efficiency = ddp_speedup / N``;
    - ``product = kernel_speedup x ddp_speedup(ref, N)``: the combination if the two compounded;
    - ``measured = T(ref, N0) N0 / T(k, N)``: the combination as measured (bootstrap 95% interval);
    - ``compounding = measured / product = ddp_speedup(k, N) / ddp_speedup(ref, N)``: below 1 when the
      faster kernel exposes communication and lowers the parallel efficiency
      (``efficiency_change = efficiency - efficiency(ref)``).
    """
    df, dropped = groups.valid(groups.with_placement(df), "step_time_s")
    df["kernel"] = kernel_of(df)
    d = groups.groups_of(df, NAME, AXES, SWEPT)
    rows = []
    for key, g in groups.groupby(df, d.groups):
        rows += _group_rows(key, g, n_boot, seed)
    return groups.finish(pd.DataFrame(rows), d, dropped, "step_time_s")


def table_of(ctx: Context) -> Table:
    """:func:`table` of the study's records, once per build."""
    return ctx.cached((NAME, "table"), lambda: table(ctx.runs(RECORDS).data))


def kernel_color(kernel: str) -> str:
    """The colour of a kernel path (its first path when several ran)."""
    return KERNEL_COLORS.get(str(kernel).split("+")[0], style.GREY)


def kernel_name(kernel: str, impl: str) -> str:
    """The kernel a row ran, naming the one asked for when it fell back: ``compiled (ran fast)``."""
    return kernel if kernel == impl else f"{impl} (ran {kernel})"


def figure(table: Table, title: str = "Kernel speedup x data-parallel speedup") -> go.Figure:
    """Per placement and kernel (:func:`table`): the measured combined speedup over the reference kernel on the
    smallest placement (bar, with its interval) and the product of the kernel speedup and the reference kernel's
    DDP speedup (diamond outline over the same bar: what compounding would give); right: each kernel's parallel
    efficiency. Colour: kernel path (shades of the KAN colour)."""
    t = table.data
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Combined speedup: measured (bar) vs product (diamond)",
                                                        "Parallel efficiency of each kernel"))
    places = sorted(set(t["placement"]), key=groups.placement_key)
    kernels = list(dict.fromkeys(zip(t["kernel"], t["kan_impl"])))
    width = 0.8 / max(1, len(kernels))
    for j, (k, impl) in enumerate(kernels):
        g = t[(t["kernel"] == k) & (t["kan_impl"] == impl)]
        name = kernel_name(k, impl)
        col = kernel_color(k)
        # numeric x: the bar and its diamond share a position (a category axis would centre the diamond)
        x = [places.index(p) + (j - (len(kernels) - 1) / 2) * width for p in g["placement"]]
        fig.add_trace(go.Bar(x=x, y=g["measured"], width=width, name=f"{name} measured", legendgroup=name,
                             showlegend=False, marker=dict(color=col), **style.error_bars(g, "measured")), 1, 1)
        fig.add_trace(go.Scatter(x=x, y=g["product"], mode="markers", name=f"{name} product", legendgroup=name,
                                 showlegend=False, marker=dict(symbol="diamond-open", size=12, color=col,
                                                               line=dict(width=2)),
                                 hovertext=[f"{name} {p}: product {a:.2f}x, measured {b:.2f}x" for p, a, b in
                                            zip(g["placement"], g["product"], g["measured"])], hoverinfo="text"), 1, 1)
        fig.add_trace(go.Bar(x=x, y=g["efficiency"], width=width, name=f"{name} efficiency", legendgroup=name,
                             showlegend=False, marker=dict(color=col),
                             **style.error_bars(g.assign(efficiency_lo=g["ddp_speedup_lo"] / g["world_size"],
                                                         efficiency_hi=g["ddp_speedup_hi"] / g["world_size"]),
                                                "efficiency")), 1, 2)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"kernel {name}", legendgroup=name,
                                 marker=dict(symbol="square", size=12, color=col)))
    style.legend_key(fig, extra=[("diamond outline: kernel speedup x reference DDP speedup",
                                  dict(mode="markers", marker=dict(symbol="diamond-open", size=12, color=style.GREY)))])
    fig.update_yaxes(rangemode="tozero")
    fig.update_xaxes(tickvals=list(range(len(places))), ticktext=places,
                     title_text="placement (nodes x processes per node)")
    style.axis_titles(fig, None, "speedup over the reference kernel on the smallest placement (x)", 1, 1)
    style.axis_titles(fig, None, "parallel efficiency S/N (% of ideal)", 1, 2)
    fig.update_yaxes(tickformat=".0%", row=1, col=2)
    fig.update_layout(title=title, template=style.TEMPLATE, height=460)
    return fig


def analyze(ctx: Context) -> StudyAnalysis:
    """The figure and a sentence per faster kernel beyond one process; no table when nothing was measured."""
    t = table_of(ctx)
    a = StudyAnalysis(NAME, table=t if not t.empty else None)
    if t.empty:
        return a
    d = t.data
    a.add_figure("compounding", figure(t), (
        "Per placement and kernel path (what ran: kan_path): the measured speedup over the reference kernel on the "
        "smallest placement (bar, bootstrap 95% interval) beside the product of the kernel speedup and the "
        "reference kernel's DDP speedup (outline); right, each kernel's parallel efficiency. A bar below its "
        "outline, and a lower efficiency for a faster kernel, mean the faster kernel exposes communication."))
    for _, r in d[(d["world_size"] > 1) & (d["kernel"] != d["baseline_kernel"])].iterrows():
        a.lines.append(f"{kernel_name(r['kernel'], r['kan_impl'])} at "
                       f"{r['placement']}: kernel {fmt.x(r['kernel_speedup'])} x DDP {fmt.x(r['ddp_speedup'])}; "
                       f"product {fmt.x(r['product'])}, measured "
                       f"{fmt.ci_text(r['measured'], r['measured_lo'], r['measured_hi'], fmt.x)} (ratio "
                       f"{r['compounding']:.2f}); efficiency {fmt.pct(r['efficiency'])} vs "
                       f"{fmt.pct(r['efficiency_ref'])} with the {r['baseline_kernel']} kernel.")
    fb = d[d["fell_back"]]
    if not fb.empty:
        a.lines.append("Requested kernels that ran another path (grouped by what ran): " + ", ".join(
            sorted({f"{i} ran {k} at {p}" for i, k, p in zip(fb["kan_impl"], fb["kernel"], fb["placement"])})) + ".")
    return a


def display_table(t: Table) -> pd.DataFrame:
    """Per kernel and placement: step time, kernel and DDP speedups, their product beside the measured
    combination, and each kernel's efficiency beside the baseline kernel's."""
    d = t.data
    if d.empty:
        return pd.DataFrame()
    out = {**{f: d[f].map(fmt.value) for f in t.group_fields()},
           "kernel": [kernel_name(k, i) for k, i in zip(d["kernel"], d["kan_impl"])],
           "placement": d["placement"], "runs": d["n_runs"],
           "step (ms)": fmt.ci_column(d, "step_time_s", fmt.ms, "step_time_lo", "step_time_hi"),
           "kernel speedup": fmt.ci_column(d, "kernel_speedup", fmt.x),
           "DDP speedup": fmt.ci_column(d, "ddp_speedup", fmt.x),
           "product (if they compound)": d["product"].map(fmt.x),
           "measured combination": fmt.ci_column(d, "measured", fmt.x),
           "measured / product": d["compounding"].map(lambda v: f"{v:.2f}" if np.isfinite(v) else "n/a"),
           "efficiency (baseline kernel's)": [f"{fmt.pct(a)} ({fmt.pct(b)})" for a, b in
                                              zip(d["efficiency"], d["efficiency_ref"])]}
    return pd.DataFrame(out).reset_index(drop=True)


def finding(a: StudyAnalysis) -> list[dict]:
    """At the largest N: each faster kernel's measured combination beside the product of the two speedups."""
    if a.table is None or a.table.empty:
        return []
    t = a.table.data
    m = t[(t["world_size"] == t["world_size"].max()) & (t["kernel"] != t["baseline_kernel"])]
    parts = [f"{r['kernel']} at {r['placement']}: measured {fmt.x(r['measured'])} vs product {fmt.x(r['product'])} "
             f"(efficiency {fmt.pct(r['efficiency'])} vs {fmt.pct(r['efficiency_ref'])})" for _, r in m.iterrows()]
    return [{"study": SECTION, "topic": "Kernel speedup x DDP speedup", "ours": "; ".join(parts) or "one kernel only",
             "published": PUBLISHED}]


def guideline(ctx: Context, goals: Goals) -> tuple[list[dict], list[str]]:
    """Per group: the fastest kernel x placement (several named together within the margin), and whether the
    kernel and DDP speedups multiply."""
    t = table_of(ctx)
    rows, text = [], []
    if t.empty:
        return rows, text
    for key, g in groups.groupby(t.data, t.group_fields()):
        label = groups.model_label(key)
        best = g.loc[g["step_time_s"].idxmin()]
        multi = g[(g["world_size"] > 1) & (g["kernel"] != g["baseline_kernel"]) & g["compounding"].notna()]
        comp = "; ".join(f"{r['kernel']} at {r['placement']}: measured {r['measured']:.2f}x vs product "
                         f"{r['product']:.2f}x (efficiency {r['efficiency']:.0%} vs {r['efficiency_ref']:.0%} with the "
                         f"{r['baseline_kernel']} kernel)" for _, r in multi.iterrows())
        answer = (f"{kernel_name(best['kernel'], best['kan_impl'])} at {best['placement']}: "
                  f"{best['step_time_s'] * 1e3:.3g} ms per step, "
                  f"{best['measured']:.2f}x the {best['baseline_kernel']} kernel on {g.iloc[0]['placement']}")
        tied = g[stats.within_margin(g["step_time_s"])].sort_values("step_time_s")
        if len(tied) > 1:
            names = ", ".join(f"{kernel_name(r['kernel'], r['kan_impl'])} at {r['placement']}"
                              for _, r in tied.iterrows())
            answer = f"no measurable difference between {names}: within {stats.MARGIN:.0%} of {answer}"
        text.append(f"{label}: the fastest combination is {answer}" + (f"; {comp}" if comp else "") + ".")
        rows.append({"question": "fastest kernel x placement", "group": label, "answer": answer,
                     "value": float(best["step_time_s"]), "basis": NAME})
    return rows, text
