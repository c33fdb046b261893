"""DataFrame in, Plotly figure out: one builder per study, the renderers that make figures show
everywhere, and an ipywidgets explorer.

One visual language across every figure (:data:`MODEL_COLORS`, :func:`placement_symbol`,
:data:`FAMILY_DASH`): a model always has the same colour, a placement (nodes x processes per node)
always the same marker, and a line is solid within one node and dashed across nodes. Each figure
has one legend: a key of models, placements and line styles (legend-only entries, no data); data
traces belong to their model's legend group, so clicking a model hides all of its traces. Groups of
records that differ in configuration (:func:`kanlib.results.design`) get a subplot each. A series
with a single point is not drawn as a line; ``fig.layout.meta["not_drawn"]`` names what was left out,
for the caption.

Figures are plain ``go.Figure`` objects. :func:`use_offline_renderers` makes notebook outputs carry
both the plotly mime bundle (JupyterLab renders it in untrusted notebooks) and HTML with plotly.js
embedded once and no MathJax (nbconvert exports, opened offline). ``save_html`` writes a
self-contained file with plotly.js embedded.
"""

from __future__ import annotations

import math
import os
import zlib

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kanlib import results

TEMPLATE = "plotly_white"
MODEL_COLORS = {"kan": "#1f77b4", "mlp": "#ff7f0e", "kan_rbf": "#2ca02c", "kan_cheb": "#9467bd"}
"""One colour per model, the same in every figure."""
_EXTRA_COLORS = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#d62728")
_SYMBOLS = {"1x1": "circle", "1x2": "square", "2x1": "diamond", "2x2": "cross", "1x4": "triangle-up",
            "4x1": "triangle-down", "4x2": "star", "2x4": "x", "1x8": "pentagon", "8x1": "hexagon"}
_EXTRA_SYMBOLS = ("hourglass", "bowtie", "triangle-left", "triangle-right", "star-square", "diamond-wide",
                  "hexagram", "circle-cross", "square-x", "octagon")
FAMILY_DASH = {"one node": "solid", "across nodes": "dash"}
"""Line style of a series: its processes on one node, or spread over several nodes."""
GREY = "#555555"
FACET_COLS = 3  # subplots per row before wrapping


def model_color(model: str) -> str:
    """The colour of ``model`` (fixed for the known models; a stable colour from its name otherwise)."""
    if model in MODEL_COLORS:
        return MODEL_COLORS[model]
    return _EXTRA_COLORS[zlib.crc32(str(model).encode()) % len(_EXTRA_COLORS)]


def placement_symbol(placement: str) -> str:
    """The marker of a placement ``"NxP"`` (fixed for common ones; a stable symbol from the name otherwise)."""
    if placement in _SYMBOLS:
        return _SYMBOLS[placement]
    return _EXTRA_SYMBOLS[zlib.crc32(str(placement).encode()) % len(_EXTRA_SYMBOLS)]


def px_colors() -> list[str]:
    """The model colours in legend order (kept for callers of the old name)."""
    return list(MODEL_COLORS.values())


# -- renderers -------------------------------------------------------------------------------
OFFLINE_RENDERER = "plotly_mimetype+kanlib_notebook"


def use_offline_renderers() -> str:
    """Make every ``fig.show()`` in this kernel carry two outputs: ``application/vnd.plotly.v1+json``
    (JupyterLab's plotly extension draws it even in an untrusted notebook) and ``text/html`` that
    draws the figure with plotly.js embedded once per notebook and no MathJax (plotly's own
    ``notebook`` renderer asks a CDN for MathJax in every figure: a console error offline).
    Returns the renderer name now the default."""
    import plotly.io as pio
    from plotly.io._base_renderers import NotebookRenderer

    class OfflineNotebookRenderer(NotebookRenderer):
        """plotly's notebook renderer without its MathJax CDN script (figures here use no LaTeX)."""

        def to_mimebundle(self, fig_dict):
            from plotly.io import to_html

            html = to_html(fig_dict, config=self.config, auto_play=self.auto_play,
                           include_plotlyjs=False, include_mathjax=False, full_html=False,
                           default_width="100%", default_height=525, validate=False)
            return {"text/html": html}

    if "kanlib_notebook" not in pio.renderers:
        pio.renderers["kanlib_notebook"] = OfflineNotebookRenderer()
    pio.renderers.default = OFFLINE_RENDERER
    return OFFLINE_RENDERER


# -- shared pieces ---------------------------------------------------------------------------
def _err(table: pd.DataFrame, col: str, lo: str | None = None, hi: str | None = None) -> dict:
    lo, hi = lo or f"{col}_lo", hi or f"{col}_hi"
    if lo not in table or hi not in table:
        return {}
    return {"error_y": dict(type="data", symmetric=False, array=(table[hi] - table[col]).clip(lower=0).tolist(),
                            arrayminus=(table[col] - table[lo]).clip(lower=0).tolist(), thickness=1)}


def _facet_fields(table: pd.DataFrame, drop=("model",)) -> list[str]:
    return [f for f in table.attrs.get("group_fields", []) if f not in drop and f in table]


def _facets(table: pd.DataFrame, fields: list[str]) -> list[tuple[str, pd.DataFrame]]:
    return [(results.group_label(k, fields) if fields else "", g) for k, g in results._groupby(table, fields)]


def _grid(n_facets: int, rows_per_facet: int, titles: list[str], row_titles: list[str], height_per_row=300,
          shared_x=False, log_x=False):
    cols = min(n_facets, FACET_COLS)
    facet_rows = math.ceil(n_facets / cols)
    subplot_titles = []
    for fr in range(facet_rows):
        for r in range(rows_per_facet):
            for c in range(cols):
                i = fr * cols + c
                subplot_titles.append(
                    (f"{row_titles[r]}" + (f"<br><sup>{titles[i]}</sup>" if titles[i] else "")) if i < n_facets else "")
    fig = make_subplots(rows=facet_rows * rows_per_facet, cols=cols, subplot_titles=subplot_titles,
                        vertical_spacing=min(0.12, 0.6 / max(1, facet_rows * rows_per_facet)),
                        horizontal_spacing=0.08)
    fig.update_layout(height=max(380, height_per_row * facet_rows * rows_per_facet + 80))
    return fig, cols


def _cell(i: int, r: int, cols: int, rows_per_facet: int) -> tuple[int, int]:
    """(row, col) of facet ``i``'s ``r``-th panel (1-based)."""
    return (i // cols) * rows_per_facet + r + 1, i % cols + 1


def _legend_key(fig: go.Figure, models=(), placements=(), families=(), extra=()) -> None:
    """Legend-only entries (no data points): one per model colour, placement marker and line style."""
    for m in models:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"model {m}", legendgroup=str(m),
                                 line=dict(color=model_color(m), width=3)))
    for p in placements:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"placement {p} (nodes x procs)",
                                 legendgroup=f"placement {p}",
                                 marker=dict(symbol=placement_symbol(p), color=GREY, size=10)))
    for f in families:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"line: {f}", legendgroup=f"family {f}",
                                 line=dict(color=GREY, dash=FAMILY_DASH[f])))
    for name, style in extra:
        fig.add_trace(go.Scatter(x=[None], y=[None], name=name, legendgroup=name, **style))


def _series(g: pd.DataFrame, ycol: str) -> list[tuple[str, pd.DataFrame]]:
    """The lines of one model in one group: its one-node placements by world size, and its multi-node
    placements by world size, each starting from the group's baseline (smallest N) so a line leaves the
    same point. A line needs at least two points."""
    g = g[np.isfinite(pd.to_numeric(g[ycol], errors="coerce").to_numpy(float))]
    if g.empty:
        return []
    g = g.sort_values(["world_size", "nnodes"], kind="stable")
    base = g.iloc[[0]]
    out = []
    one = g[g["nnodes"] == 1]
    if len(one) >= 2:
        out.append(("one node", one))
    multi = g[g["nnodes"] > 1]
    if len(multi):
        line = pd.concat([base, multi]) if base["nnodes"].iloc[0] == 1 else multi
        if len(line) >= 2:
            out.append(("across nodes", line))
    return out


def _symbols(g: pd.DataFrame) -> list[str]:
    return [placement_symbol(p) for p in g["placement"]]


def _meta(fig: go.Figure, **kw) -> go.Figure:
    meta = dict(fig.layout.meta or {})
    meta.update(kw)
    fig.update_layout(meta=meta)
    return fig


def data_traces(fig: go.Figure) -> list:
    """The traces that draw data (not legend-key entries)."""
    return [t for t in fig.data if t.x is not None and any(v is not None for v in t.x)]


# -- strong scaling --------------------------------------------------------------------------
def strong_scaling_figure(table: pd.DataFrame, by=None, title: str = "Strong scaling") -> go.Figure:
    """Speedup and parallel efficiency against world size (medians, bootstrap 95% bars), with the
    ideal, one subplot pair per group (work size, ...); colour = model, marker = placement, solid =
    within one node, dashed = across nodes. ``by`` is accepted for older callers and ignored: groups
    come from the table."""
    fields = _facet_fields(table)
    facets = _facets(table, fields)
    fig, cols = _grid(len(facets), 2, [f for f, _ in facets], ["Speedup T(1)/T(N)", "Efficiency S/N"])
    not_drawn, families = [], set()
    for i, (label, g) in enumerate(facets):
        n = sorted(g["world_size"].unique())
        r1, c = _cell(i, 0, cols, 2)
        r2, _ = _cell(i, 1, cols, 2)
        if len(n) >= 2:
            fig.add_trace(go.Scatter(x=n, y=n, mode="lines", name="ideal", legendgroup="ideal", showlegend=i == 0,
                                     line=dict(dash="dot", color="grey"), hoverinfo="skip"), r1, c)
            fig.add_trace(go.Scatter(x=n, y=[1.0] * len(n), mode="lines", name="ideal", legendgroup="ideal",
                                     showlegend=False, line=dict(dash="dot", color="grey"), hoverinfo="skip"), r2, c)
        for m, gm in g.groupby("model", sort=True):
            lines = _series(gm, "speedup")
            if not lines:
                not_drawn.append(f"{m} ({label or 'all'}: one placement only)")
            for fam, s in lines:
                families.add(fam)
                hover = [f"{m} {p}<br>N={w}<br>S={sp:.2f} [{lo:.2f}, {hi:.2f}]<br>E={e:.0%}<br>T={t * 1e3:.3g} ms"
                         f"<br>runs={k}" for p, w, sp, lo, hi, e, t, k in
                         zip(s["placement"], s["world_size"], s["speedup"], s["speedup_lo"], s["speedup_hi"],
                             s["efficiency"], s["step_time_s"], s["n_runs"])]
                style = dict(mode="lines+markers", legendgroup=str(m), showlegend=False,
                             line=dict(color=model_color(m), dash=FAMILY_DASH[fam]),
                             marker=dict(symbol=_symbols(s), size=10, color=model_color(m)),
                             hovertext=hover, hoverinfo="text")
                fig.add_trace(go.Scatter(x=s["world_size"], y=s["speedup"], name=f"{m} {fam}",
                                         **_err(s, "speedup"), **style), r1, c)
                fig.add_trace(go.Scatter(x=s["world_size"], y=s["efficiency"], name=f"{m} {fam}",
                                         **_err(s, "efficiency"), **style), r2, c)
        fig.update_xaxes(tickvals=n, title_text="world size N (processes)", row=r2, col=c)
        fig.update_xaxes(tickvals=n, row=r1, col=c)
        fig.update_yaxes(rangemode="tozero", row=r2, col=c)
    _legend_key(fig, sorted(table["model"].unique()), _drawn_placements(fig, table), sorted(families))
    fig.update_layout(title=title, template=TEMPLATE)
    return _meta(fig, not_drawn=not_drawn)


def _drawn_placements(fig: go.Figure, table: pd.DataFrame) -> list[str]:
    """Placements whose marker some data trace draws (the legend promises no other)."""
    symbols = set()
    for t in data_traces(fig):
        try:
            s = t.marker.symbol
        except AttributeError:  # bars have no marker symbol
            s = None
        if isinstance(s, (list, tuple)):
            symbols.update(s)
        elif s:
            symbols.add(s)
    ps = sorted(set(table["placement"]), key=results.placement_key)
    return [p for p in ps if placement_symbol(p) in symbols]


def work_figure(table: pd.DataFrame, title: str = "Efficiency against work per process") -> go.Figure | None:
    """Efficiency at each multi-process placement against the work a process does per step
    (``T(1) / N``, log scale), across the groups of work size: shows how much work per process a
    placement needs to scale. One line per (model, placement, other group fields) with at least two
    work sizes; None when no line has two."""
    t = table[table["world_size"] > 1]
    work = {"global_batch", "widths", "n_train", "local_batch"}
    other = [f for f in _facet_fields(table) if f not in work]
    fig = go.Figure()
    fams, drawn = set(), False
    for key, g in results._groupby(t, ["model", "placement"] + other):
        g = g.sort_values("work_per_process_s")
        if len(g) < 2:
            continue
        drawn = True
        m, p = key["model"], key["placement"]
        fam = results._family(int(g["nnodes"].iloc[0]))
        fams.add(fam)
        label = results.group_label(key, other)
        hover = [f"{m} {p} {label}<br>widths={list(w)}, B={b}<br>work/process={x * 1e3:.3g} ms<br>E={e:.0%} "
                 f"[{lo:.0%}, {hi:.0%}]" for w, b, x, e, lo, hi in
                 zip(g["widths"], g["global_batch"], g["work_per_process_s"], g["efficiency"], g["efficiency_lo"],
                     g["efficiency_hi"])]
        fig.add_trace(go.Scatter(x=g["work_per_process_s"] * 1e3, y=g["efficiency"], mode="lines+markers",
                                 name=f"{m} {p} {label}".strip(), legendgroup=str(m), showlegend=False,
                                 line=dict(color=model_color(m), dash=FAMILY_DASH[fam]),
                                 marker=dict(symbol=placement_symbol(p), size=10, color=model_color(m)),
                                 hovertext=hover, hoverinfo="text", **_err(g, "efficiency")))
    if not drawn:
        return None
    fig.add_hline(y=1.0, line=dict(dash="dot", color="grey"))
    _legend_key(fig, sorted(t["model"].unique()), _drawn_placements(fig, t), sorted(fams))
    fig.update_xaxes(type="log", title_text="work per process per step, T(1)/N (ms)")
    fig.update_yaxes(title_text="efficiency S/N", rangemode="tozero")
    fig.update_layout(title=title, template=TEMPLATE, height=460)
    return fig


# -- weak scaling ----------------------------------------------------------------------------
def weak_scaling_figure(table: pd.DataFrame, title: str = "Weak scaling") -> go.Figure:
    """Throughput and weak-scaling efficiency against world size, a subplot pair per group
    (per-process batch, ...); a third row of efficiency against the first multi-process point only
    when some line has two multi-process points (else it would be a lone dot)."""
    fields = _facet_fields(table)
    facets = _facets(table, fields)
    multi_ok = any(len(s.dropna(subset=["weak_efficiency_multi"])) >= 2
                   for _, g in facets for _, gm in g.groupby("model") for _, s in _series(gm, "throughput"))
    rows = ["Throughput (samples/s)", "Weak-scaling efficiency E_w"] + (["E_w vs first multi-process point"]
                                                                        if multi_ok else [])
    fig, cols = _grid(len(facets), len(rows), [f for f, _ in facets], rows)
    not_drawn, families = [], set()
    for i, (label, g) in enumerate(facets):
        n = sorted(g["world_size"].unique())
        for m, gm in g.groupby("model", sort=True):
            lines = _series(gm, "throughput")
            if not lines:
                not_drawn.append(f"{m} ({label or 'all'}: one placement only)")
            for fam, s in lines:
                families.add(fam)
                hover = [f"{m} {p}<br>N={w}<br>X={x:.4g}/s<br>E_w={e:.0%} [{lo:.0%}, {hi:.0%}]<br>runs={k}"
                         for p, w, x, e, lo, hi, k in zip(s["placement"], s["world_size"], s["throughput"],
                                                          s["weak_efficiency"], s["weak_efficiency_lo"],
                                                          s["weak_efficiency_hi"], s["n_runs"])]
                style = dict(mode="lines+markers", legendgroup=str(m), showlegend=False, name=f"{m} {fam}",
                             line=dict(color=model_color(m), dash=FAMILY_DASH[fam]),
                             marker=dict(symbol=_symbols(s), size=10, color=model_color(m)),
                             hovertext=hover, hoverinfo="text")
                r, c = _cell(i, 0, cols, len(rows))
                fig.add_trace(go.Scatter(x=s["world_size"], y=s["throughput"], **_err(s, "throughput"), **style), r, c)
                r, c = _cell(i, 1, cols, len(rows))
                fig.add_trace(go.Scatter(x=s["world_size"], y=s["weak_efficiency"], **_err(s, "weak_efficiency"),
                                         **style), r, c)
                sm = s.dropna(subset=["weak_efficiency_multi"])
                if multi_ok and len(sm) >= 2:
                    r, c = _cell(i, 2, cols, len(rows))
                    fig.add_trace(go.Scatter(x=sm["world_size"], y=sm["weak_efficiency_multi"],
                                             **{**style, "marker": dict(symbol=_symbols(sm), size=10,
                                                                        color=model_color(m)),
                                                "hovertext": None, "hoverinfo": None}), r, c)
        for k in range(len(rows)):
            r, c = _cell(i, k, cols, len(rows))
            fig.update_xaxes(tickvals=n, row=r, col=c)
            fig.update_yaxes(rangemode="tozero", row=r, col=c)
        r, c = _cell(i, len(rows) - 1, cols, len(rows))
        fig.update_xaxes(title_text="world size N (processes)", row=r, col=c)
    _legend_key(fig, sorted(table["model"].unique()), _drawn_placements(fig, table), sorted(families))
    fig.update_layout(title=title, template=TEMPLATE)
    return _meta(fig, not_drawn=not_drawn, multi_row=multi_ok)


# -- communication ---------------------------------------------------------------------------
def _comm_point_labels(t: pd.DataFrame) -> pd.Series:
    parts = [t["placement"], t["bucket_cap_mb"].map(lambda v: f"{v:g} MiB")]
    if "nccl_algo" in t and t["nccl_algo"].nunique() > 1:
        parts.append(t["nccl_algo"].replace("", "NCCL's choice"))
    if t["comm_hook"].nunique() > 1:
        parts.append(t["comm_hook"])
    emu = (t["emulate_latency_s"] > 0) | (t["emulate_bandwidth_bytes_per_s"] > 0)
    if emu.any():
        parts.append(np.where(emu, [f"link {a * 1e6:g} us" + (f", {b / 1e9:g} GB/s" if b else "")
                                    for a, b in zip(t["emulate_latency_s"], t["emulate_bandwidth_bytes_per_s"])],
                              "no emulation"))
    out = pd.Series(parts[0].astype(str).to_numpy(), index=t.index)
    for p in parts[1:]:
        out = out + ", " + pd.Series(np.asarray(p, dtype=str), index=t.index)
    return out


def communication_figure(table: pd.DataFrame, title: str = "Communication overhead") -> go.Figure:
    """Per point (placement, bucket size, ...): step time split into compute (light bar, hidden
    communication included) and exposed communication (solid bar) in the model's colour, the total
    all-reduce time (placement marker), and the exposed share of the step with its interval."""
    fields = _facet_fields(table, drop=())
    facets = _facets(table, fields)
    fig, cols = _grid(len(facets), 2, [f for f, _ in facets],
                      ["Step time: compute + exposed communication (ms)", "Exposed share of the step (overhead)"])
    for i, (label, g) in enumerate(facets):
        g = g.sort_values(["world_size", "nnodes", "bucket_cap_mb"], kind="stable")
        x = _comm_point_labels(g)
        for m, gm in g.groupby("model", sort=True):
            xm, col = x[gm.index], model_color(m)
            r, c = _cell(i, 0, cols, 2)
            fig.add_trace(go.Bar(x=xm, y=gm["compute_s"] * 1e3, name=f"{m} compute", legendgroup=str(m),
                                 showlegend=False, marker=dict(color=col, opacity=0.35)), r, c)
            fig.add_trace(go.Bar(x=xm, y=gm["exposed_s"] * 1e3, name=f"{m} exposed", legendgroup=str(m),
                                 showlegend=False, marker=dict(color=col)), r, c)
            fig.add_trace(go.Scatter(x=xm, y=gm["comm_total_s"] * 1e3, mode="markers", name=f"{m} total comm",
                                     legendgroup=str(m), showlegend=False,
                                     marker=dict(symbol=_symbols(gm), size=11, color="white",
                                                 line=dict(color=col, width=2))), r, c)
            r, c = _cell(i, 1, cols, 2)
            fig.add_trace(go.Scatter(x=xm, y=gm["overhead_fraction"], mode="markers", name=f"{m} overhead",
                                     legendgroup=str(m), showlegend=False,
                                     marker=dict(symbol=_symbols(gm), size=11, color=col),
                                     **_err(gm, "overhead_fraction", "overhead_lo", "overhead_hi")), r, c)
        r, c = _cell(i, 1, cols, 2)
        fig.update_yaxes(range=[0, 1.05], tickformat=".0%", row=r, col=c)
    _legend_key(fig, sorted(table["model"].unique()), _drawn_placements(fig, table),
                extra=[("bar: compute (light), exposed (solid)", dict(mode="markers", marker=dict(
                        symbol="square", color=GREY, size=12))),
                       ("hollow marker: total all-reduce time", dict(mode="markers", marker=dict(
                           symbol="circle", color="white", size=11, line=dict(color=GREY, width=2))))])
    fig.update_layout(barmode="stack", title=title, template=TEMPLATE)
    return fig


def comm_model_figure(pred: pd.DataFrame, measured: pd.DataFrame | None = None, model=None,
                      title: str = "Alpha-beta model: extrapolated strong scaling", color: str | None = None) -> go.Figure:
    """Predicted communication time and efficiency against world size (log scale), with measured
    all-reduce times when given. The fitted constants go in the title; a constant the data could not
    resolve is named as such, never printed as 0."""
    color = color or model_color("kan")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("All-reduce time per step (s)", "Predicted efficiency"))
    fig.add_trace(go.Scatter(x=pred["world_size"], y=pred["comm_s"], mode="lines", name="model: all-reduce time",
                             line=dict(color=color)), 1, 1)
    if measured is not None and not measured.empty:
        fig.add_trace(go.Scatter(x=measured["world_size"], y=measured["comm_total_s"], mode="markers",
                                 name="measured all-reduce time",
                                 marker=dict(size=10, color=color,
                                             symbol=[placement_symbol(results.placement_of(a, b)) for a, b in
                                                     zip(measured["nnodes"], measured["nproc_per_node"])])), 1, 1)
    fig.add_trace(go.Scatter(x=pred["world_size"], y=pred["efficiency"], mode="lines", name="predicted efficiency",
                             line=dict(color=color, dash="dash")), 1, 2)
    sub = ""
    if model is not None:
        lat = f"latency {model.alpha:.3g} s" if model.alpha > 0 else "latency not resolved"
        bw = f"bandwidth {model.bandwidth_bytes_per_s:.3g} B/s" if model.beta > 0 else "bandwidth not resolved"
        sub = f"<br><sup>{lat}, {bw}; {model.algo}; fitted to {model.n_points} runs</sup>"
    fig.update_xaxes(type="log", title_text="world size N")
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_yaxes(range=[0, 1.05], row=1, col=2)
    fig.update_layout(title=title + sub, template=TEMPLATE, height=440)
    return fig


# -- model size ------------------------------------------------------------------------------
def model_size_figure(table: pd.DataFrame, title: str = "Model-size scaling") -> go.Figure:
    """KAN against matched-parameter MLP: step time, peak memory, parameters per byte and time per
    parameter against the parameter count (log-log), one colour per model in all four panels (the
    first model's line is drawn wider, so a line hidden under another's still shows)."""
    fig = make_subplots(rows=2, cols=2, subplot_titles=("Step time (ms)", "Peak memory (MiB)",
                                                        "Parameters per byte of peak memory",
                                                        "Time per parameter (ns)"))
    models = sorted(table["model"].unique())
    other = [f for f in _facet_fields(table) if f not in ("grid_size", "widths")]
    panels = [((1, 1), "step_time_s", 1e3), ((1, 2), "peak_mem_bytes", 1 / 2**20),
              ((2, 1), "params_per_byte", 1.0), ((2, 2), "time_per_param_s", 1e9)]
    not_drawn = []
    for key, g in results._groupby(table, ["model"] + other):
        m = key["model"]
        g = g.sort_values("n_params")
        label = results.group_label(key, other)
        if len(g) < 2:
            not_drawn.append(f"{m} {label}: one size only".strip())
            continue
        hover = [f"{m} widths={list(w)} grid={gs}<br>{n:,} parameters" for w, gs, n in
                 zip(g["widths"], g["grid_size"], g["n_params"])]
        width = 4 if m == models[0] else 2
        for (r, c), col, scale in panels:
            err = _err(g.assign(**{col: g[col]}), col, "step_time_lo", "step_time_hi") if col == "step_time_s" else {}
            if err:
                err["error_y"]["array"] = [v * scale for v in err["error_y"]["array"]]
                err["error_y"]["arrayminus"] = [v * scale for v in err["error_y"]["arrayminus"]]
            fig.add_trace(go.Scatter(x=g["n_params"], y=g[col] * scale, mode="lines+markers",
                                     name=f"{m} {label}".strip(), legendgroup=str(m), showlegend=False,
                                     line=dict(color=model_color(m), width=width),
                                     marker=dict(symbol=_symbols(g), size=9, color=model_color(m)),
                                     hovertext=hover, **err), r, c)
    _legend_key(fig, models, _drawn_placements(fig, table))
    fig.update_xaxes(type="log", title_text="parameters")
    fig.update_yaxes(type="log")
    fig.update_layout(title=title, template=TEMPLATE, height=720)
    return _meta(fig, not_drawn=not_drawn)


# -- files -----------------------------------------------------------------------------------
def save_html(fig: go.Figure, path: str) -> str:
    """Write ``fig`` as a self-contained HTML file (plotly.js embedded, no MathJax: opens with no network)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, include_mathjax=False, full_html=True)
    return path


# -- explorer --------------------------------------------------------------------------------
EXPLORER_X = {
    "strong_scaling": ("world_size", "global_batch", "local_batch", "n_params"),
    "weak_scaling": ("world_size", "local_batch", "n_params"),
    "communication": ("world_size", "bucket_cap_mb", "n_params"),
    "model_size": ("n_params", "grid_size", "depth", "global_batch"),
}
EXPLORER_METRICS = ("step_time_s", "samples_per_s", "wall_samples_per_s", "forward_s", "backward_s", "optimizer_s",
                    "comm_total_s", "peak_mem_bytes", "final_val_loss", "time_to_first_step_s", "compile_s")


def explorer_options(df: pd.DataFrame, study: str) -> dict:
    """What the explorer offers for ``study``'s records: x axes that vary there, metrics measured
    there (not all NaN), its models, and its parameter counts (for the range slider)."""
    d = df[df["study"] == study].copy()
    if d.empty:
        raise ValueError(f"study: no records of {study!r} (have: {', '.join(sorted(df['study'].unique()))})")
    if "widths" in d:
        d["depth"] = d["widths"].map(lambda w: len(w) - 1)
    if "global_batch" in d and "world_size" in d:
        d["local_batch"] = d["global_batch"] // d["world_size"]
    xs = [c for c in EXPLORER_X.get(study, ("world_size", "n_params")) if c in d and d[c].nunique() > 1]
    metrics = [c for c in EXPLORER_METRICS if c in d and pd.to_numeric(d[c], errors="coerce").notna().any()]
    sizes = sorted(int(v) for v in d["n_params"].unique()) if "n_params" in d else []
    return {"records": d, "x": xs or ["world_size"], "metrics": metrics, "models": sorted(d["model"].unique()),
            "sizes": sizes}


def explorer_figure(df: pd.DataFrame, study: str, x: str | None = None, metric: str = "step_time_s",
                    models=None, size_range=None) -> go.Figure:
    """The explorer's figure: median ``metric`` against ``x`` over ``study``'s records (bars: min-max
    over repeats), one line per model and placement (and hook, for communication), in the shared colours
    and markers."""
    opt = explorer_options(df, study)
    d = opt["records"]
    x = x or opt["x"][0]
    d = d[d["model"].isin(models or opt["models"])]
    if size_range is not None:
        d = d[(d["n_params"] >= size_range[0]) & (d["n_params"] <= size_range[1])]
    d = results._placement_cols(d)
    keys = ["model", "placement"] + (["comm_hook"] if study == "communication" else [])
    fig = go.Figure()
    for key, g in results._groupby(d, keys):
        agg = g.groupby(x)[metric].agg(["median", "min", "max"]).reset_index().dropna()
        if agg.empty:
            continue
        m, p = key["model"], key["placement"]
        fig.add_trace(go.Scatter(x=agg[x], y=agg["median"], mode="lines+markers" if len(agg) > 1 else "markers",
                                 name=" ".join(str(v) for v in key.values()), legendgroup=str(m),
                                 line=dict(color=model_color(m), dash=FAMILY_DASH[results._family(int(p.split("x")[0]))]),
                                 marker=dict(symbol=placement_symbol(p), size=9, color=model_color(m)),
                                 error_y=dict(type="data", symmetric=False, array=agg["max"] - agg["median"],
                                              arrayminus=agg["median"] - agg["min"], thickness=1)))
    fig.update_layout(template=TEMPLATE, height=420, xaxis_title=x, yaxis_title=metric,
                      title=f"{study}: median {metric} against {x} (bars: min-max over repeats)")
    return fig


def explorer(df: pd.DataFrame, study: str | None = None):
    """An ipywidgets panel over the records: study, x axis, metric, models and parameter range; it
    opens on ``study`` (default: the first), and every control's options follow the chosen study's
    records. The plot redraws on change (needs a live kernel)."""
    import ipywidgets as widgets
    from IPython.display import display

    studies = sorted(df["study"].unique())
    study_w = widgets.Dropdown(options=studies, value=study if study in studies else studies[0], description="study")
    x_w = widgets.Dropdown(description="x")
    metric_w = widgets.Dropdown(description="metric")
    model_w = widgets.SelectMultiple(description="model")
    size_w = widgets.SelectionRangeSlider(options=[0, 1], index=(0, 1), description="params")
    out = widgets.Output()
    busy = {"on": False}

    def refill(*_):
        busy["on"] = True  # the controls' own change events must not redraw half-updated choices
        opt = explorer_options(df, study_w.value)
        x_w.options, x_w.value = opt["x"], opt["x"][0]
        metric_w.options = opt["metrics"]
        metric_w.value = "step_time_s" if "step_time_s" in opt["metrics"] else opt["metrics"][0]
        model_w.options, model_w.value = opt["models"], tuple(opt["models"])
        sizes = opt["sizes"] if len(opt["sizes"]) > 1 else opt["sizes"] * 2
        size_w.options = sizes
        size_w.index = (0, len(sizes) - 1)
        size_w.disabled = len(opt["sizes"]) < 2
        busy["on"] = False
        redraw()

    def redraw(*_):
        if busy["on"]:
            return
        fig = explorer_figure(df, study_w.value, x_w.value, metric_w.value, list(model_w.value), size_w.value)
        out.clear_output(wait=True)
        with out:
            display(fig)

    study_w.observe(refill, names="value")
    for w in (x_w, metric_w, model_w, size_w):
        w.observe(redraw, names="value")
    refill()
    return widgets.VBox([widgets.HBox([study_w, x_w, metric_w]), widgets.HBox([model_w, size_w]), out])


def show_explorer(df: pd.DataFrame, study: str) -> None:
    """Display the explorer opened on ``study`` and, below it, a static copy of its first view, so an
    executed notebook or an HTML export (no kernel) still shows the figure."""
    from IPython.display import Markdown, display

    display(explorer(df, study))
    display(Markdown("*Static copy of the explorer's first view (the controls above need a live kernel):*"))
    explorer_figure(df, study).show()
