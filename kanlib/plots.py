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
          shared_x=False, log_x=False, vertical_spacing: float | None = None):
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
                        vertical_spacing=vertical_spacing if vertical_spacing is not None else
                        min(0.12, 0.6 / max(1, facet_rows * rows_per_facet)),
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
    "time_to_accuracy": ("world_size", "global_batch", "local_batch"),
    "compounding": ("world_size", "global_batch", "n_params"),
}
EXPLORER_METRICS = ("step_time_s", "samples_per_s", "wall_samples_per_s", "forward_s", "backward_s", "optimizer_s",
                    "comm_total_s", "peak_mem_bytes", "final_val_loss", "final_val_accuracy", "time_to_target_s",
                    "steps_to_target", "samples_to_target", "time_to_first_step_s", "compile_s")
EXPLORER_SERIES = {"communication": ("comm_hook", "grad_accum_steps", "gradient_as_bucket_view", "static_graph"),
                   "model_size": ("parallelism",), "time_to_accuracy": ("lr_rule",),
                   "compounding": ("kan_impl", "kan_path")}
"""Fields that make a line of their own in a study's explorer (where they vary), beside model and placement:
nothing of different configurations is pooled into one median."""


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
    keys = ["model", "placement"] + [f for f in EXPLORER_SERIES.get(study, ()) if f in d and results._varies(d[f])]
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


# -- the collective benchmark and the calibrated model ---------------------------------------------
LINK_COLORS = {"no emulation": "#333333", "emulated": "#d62728"}
"""Collective-benchmark series: the machine's own links, and an emulated inter-node link on top."""
TRANSFER_COLORS = {"transfer": "#555555", "waiting": "#bbbbbb"}


def _bench_label(r) -> str:
    emu = (r.get("emulate_latency_s") or 0) > 0 or (r.get("emulate_bandwidth_bytes_per_s") or 0) > 0
    text = f"{r['placement']} {r.get('backend', '')}"
    if r.get("nccl_algo"):
        text += f" {r['nccl_algo']}"
    if emu and int(r["nnodes"]) > 1:
        bw = r.get("emulate_bandwidth_bytes_per_s") or 0
        text += f", emulated {float(r['emulate_latency_s']) * 1e6:g} us" + (f", {bw / 1e9:g} GB/s" if bw else "")
    return text


def collbench_figure(bench: pd.DataFrame, fits: dict | None = None, time_col: str = "time_s",
                     title: str = "Collective benchmark: all-reduce against message size") -> go.Figure:
    """nccl-tests' three views of the benchmark (kanlib.collbench.load_bench rows): time, algbw and busbw
    against message size (log-log), one series per placement, backend, NCCL setting and emulated link
    (median over repeats at each size). Marker: placement; solid within one node, dashed across nodes;
    colour: the machine's own links, or an emulated link. With ``fits`` (kanlib.commmodel.fit_collbench)
    each series' fitted time is drawn as a dotted line in the time panel."""
    from kanlib import commmodel

    fig = make_subplots(rows=1, cols=3, subplot_titles=("Time per all-reduce (s)", "algbw (GB/s)",
                                                        "busbw = algbw x 2(N-1)/N (GB/s)"))
    b = bench.copy()
    for c in ("emulate_latency_s", "emulate_bandwidth_bytes_per_s"):
        b[c] = b[c].fillna(0.0) if c in b else 0.0
    b.loc[b["nnodes"] == 1, ["emulate_latency_s", "emulate_bandwidth_bytes_per_s"]] = 0.0
    b["nccl_algo"] = b["nccl_algo"].fillna("") if "nccl_algo" in b else ""
    keys = ["placement", "nnodes", "nproc_per_node", "backend", "nccl_algo", "emulate_latency_s",
            "emulate_bandwidth_bytes_per_s"]
    fams = set()
    for key, g in results._groupby(b, [k for k in keys if k in b]):
        pts = g.groupby("size_bytes", as_index=False).agg(t=(time_col, "median"), algbw=("algbw_bytes_per_s", "median"),
                                                          busbw=("busbw_bytes_per_s", "median"))
        emu = key["emulate_latency_s"] > 0 or key["emulate_bandwidth_bytes_per_s"] > 0
        col = LINK_COLORS["emulated" if emu else "no emulation"]
        fam = results._family(int(key["nnodes"]))
        fams.add(fam)
        label = _bench_label(key)
        style = dict(mode="lines+markers", legendgroup=label, showlegend=False, name=label,
                     line=dict(color=col, dash=FAMILY_DASH[fam]),
                     marker=dict(symbol=placement_symbol(key["placement"]), size=7, color=col))
        hover = [f"{label}<br>{int(s):,} B<br>{t * 1e6:.4g} us<br>algbw {a / 1e9:.3g} GB/s<br>busbw {u / 1e9:.3g} GB/s"
                 for s, t, a, u in zip(pts["size_bytes"], pts["t"], pts["algbw"], pts["busbw"])]
        fig.add_trace(go.Scatter(x=pts["size_bytes"], y=pts["t"], hovertext=hover, hoverinfo="text", **style), 1, 1)
        fig.add_trace(go.Scatter(x=pts["size_bytes"], y=pts["algbw"] / 1e9, hovertext=hover, hoverinfo="text",
                                 **style), 1, 2)
        fig.add_trace(go.Scatter(x=pts["size_bytes"], y=pts["busbw"] / 1e9, hovertext=hover, hoverinfo="text",
                                 **style), 1, 3)
        if fits and int(key["nnodes"]) * int(key["nproc_per_node"]) > 1:
            algo = commmodel.row_algorithm(key["backend"], key.get("nccl_algo", ""),
                                           _constant_str(g, "nccl_algo_used"))
            f = commmodel.find_fit(fits, key["backend"], _constant_str(g, "device") or "cpu", algo,
                                   int(key["nnodes"]), key["emulate_latency_s"], key["emulate_bandwidth_bytes_per_s"])
            if f is not None:
                sizes = pts["size_bytes"].to_numpy(float)
                fig.add_trace(go.Scatter(x=sizes, y=f.model.time_s(sizes, int(key["nnodes"]), int(key["nproc_per_node"])),
                                         mode="lines", name=f"fit {label}", legendgroup=label, showlegend=False,
                                         line=dict(color=col, dash="dot", width=1), hoverinfo="skip"), 1, 1)
    any_emulated = bool(((b["emulate_latency_s"] > 0) | (b["emulate_bandwidth_bytes_per_s"] > 0)).any())
    colours = [k for k in LINK_COLORS if k == "no emulation" or any_emulated]  # no key for what is not drawn
    _legend_key(fig, placements=_drawn_placements(fig, b), families=sorted(fams),
                extra=[(f"colour: {k}", dict(mode="lines", line=dict(color=LINK_COLORS[k], width=3))) for k in colours]
                + ([("dotted: the fitted model", dict(mode="lines", line=dict(color=GREY, dash="dot")))] if fits else []))
    fig.update_xaxes(type="log", title_text="message size (bytes)")
    fig.update_yaxes(type="log")
    fig.update_layout(title=title, template=TEMPLATE, height=460)
    return fig


def _constant_str(g: pd.DataFrame, col: str) -> str:
    if col not in g:
        return ""
    vals = [v for v in g[col].dropna().unique() if isinstance(v, str)]
    return vals[0] if len(vals) == 1 else ""


def parity_figure(parity: pd.DataFrame, title: str = "The calibrated model against every DDP run") -> go.Figure:
    """Predicted against measured step time and exposed communication for every timed DDP run with a
    no-op twin (kanlib.commmodel.validate_ddp), on the diagonal where the model is right. Colour: model;
    marker: placement; the dotted line is y = x. Runs the model could not predict are listed in
    ``layout.meta['not_drawn']``."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Step time (ms)", "Exposed communication (ms)"))
    p = parity.copy()
    if "model" not in p:
        p["model"] = "kan"
    ok = np.isfinite(pd.to_numeric(p["pred_exposed_s"], errors="coerce").to_numpy(float))
    not_drawn = [f"{r['placement']} {r.get('run_key', '')}: {r.get('why')}" for _, r in p[~ok].iterrows()]
    p = p[ok]
    for col, (meas, pred) in enumerate((("step_time_s", "pred_step_time_s"), ("exposed_s", "pred_exposed_s")), start=1):
        hi = 0.0
        for key, g in results._groupby(p, ["model", "placement"]):
            m = key["model"]
            emu = g["emulate_latency_s"].fillna(0).to_numpy(float) if "emulate_latency_s" in g else np.zeros(len(g))
            hover = [f"{m} {key['placement']}, {cap:g} MiB{', emulated %g us' % (e * 1e6) if e else ''}<br>"
                     f"measured {a * 1e3:.3g} ms, predicted {b * 1e3:.3g} ms" for cap, e, a, b in
                     zip(g["bucket_cap_mb"], emu, g[meas], g[pred])]
            fig.add_trace(go.Scatter(x=g[meas] * 1e3, y=g[pred] * 1e3, mode="markers", name=f"{m} {key['placement']}",
                                     legendgroup=str(m), showlegend=False, hovertext=hover, hoverinfo="text",
                                     marker=dict(symbol=placement_symbol(key["placement"]), size=10,
                                                 color=model_color(m))), 1, col)
            hi = max(hi, float(np.nanmax(np.r_[g[meas].to_numpy(float), g[pred].to_numpy(float)])) * 1e3)
        hi = hi * 1.1 or 1.0
        fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", name="y = x", legendgroup="y = x",
                                 showlegend=col == 1, line=dict(dash="dot", color="grey"), hoverinfo="skip"), 1, col)
        fig.update_xaxes(title_text="measured (ms)", range=[0, hi], row=1, col=col)
        fig.update_yaxes(title_text="predicted (ms)", range=[0, hi], row=1, col=col)
    _legend_key(fig, sorted(p["model"].unique()) if len(p) else [], _drawn_placements(fig, parity))
    fig.update_layout(title=title, template=TEMPLATE, height=440)
    return _meta(fig, not_drawn=not_drawn)


def transfer_waiting_figure(by_placement: pd.DataFrame,
                            title: str = "DDP hook time: transfer (benchmark) vs waiting for other ranks") -> go.Figure:
    """Per placement (kanlib.commmodel.transfer_waiting_by_placement): the median hook time per step
    split into the transfer the collective benchmark predicts for the run's buckets and the rest, waiting
    for the slower rank (negative when the benchmark predicts more than the hook saw)."""
    fig = go.Figure()
    x = by_placement["placement"].astype(str)
    for part in ("transfer", "waiting"):
        fig.add_trace(go.Bar(x=x, y=by_placement[f"{part}_s"] * 1e3, name=part, marker=dict(color=TRANSFER_COLORS[part]),
                             hovertext=[f"{p}: {part} {v * 1e3:.3g} ms of {t * 1e3:.3g} ms ({runs} runs)" for p, v, t, runs in
                                        zip(x, by_placement[f"{part}_s"], by_placement["comm_total_s"],
                                            by_placement["n_runs"])], hoverinfo="text"))
    fig.update_layout(barmode="relative", title=title, template=TEMPLATE, height=400,
                      yaxis_title="ms per step", xaxis_title="placement (nodes x processes per node)")
    return fig


# -- time to accuracy --------------------------------------------------------------------------------
def tta_curves_figure(curves: pd.DataFrame, title: str = "Validation loss on the way to the target") -> go.Figure:
    """Validation loss (log) against samples seen and against cumulative step time, one line per run
    (kanlib.results.val_curves), a subplot pair per learning-rate rule; colour: model; marker:
    placement; dashed: across nodes; the dotted line is the target."""
    rules = sorted(curves["lr_rule"].fillna("none").unique()) if len(curves) else ["none"]
    fig, cols = _grid(len(rules), 2, [f"lr_rule={r}" if len(rules) > 1 else "" for r in rules],
                      ["Validation loss against samples", "Validation loss against step time (s)"],
                      height_per_row=340, vertical_spacing=min(0.2, 0.7 / max(1, 2 * math.ceil(len(rules) / FACET_COLS))))
    fams = set()
    for i, rule in enumerate(rules):
        g = curves[curves["lr_rule"].fillna("none") == rule]
        for key, run in results._groupby(g, ["record_path"]):
            run = run.sort_values("steps")
            r0 = run.iloc[0]
            m, p = str(r0["model"]), str(r0["placement"])
            fam = results._family(int(r0["nnodes"]))
            fams.add(fam)
            style = dict(mode="lines+markers" if len(run) > 1 else "markers", legendgroup=m, showlegend=False,
                         name=f"{m} {p} B={int(r0['global_batch'])} r{int(r0['repeat'])}",
                         line=dict(color=model_color(m), dash=FAMILY_DASH[fam], width=1.5),
                         marker=dict(symbol=placement_symbol(p), size=6, color=model_color(m)))
            hover = [f"{m} {p}, global batch {int(r0['global_batch'])}, repeat {int(r0['repeat'])}<br>step {s}, "
                     f"{n:,} samples, {t:.3g} s<br>val loss {v:.4g}" for s, n, t, v in
                     zip(run["steps"], run["samples"], run["train_time_s"], run["val_loss"])]
            r, c = _cell(i, 0, cols, 2)
            fig.add_trace(go.Scatter(x=run["samples"], y=run["val_loss"], hovertext=hover, hoverinfo="text", **style), r, c)
            r, c = _cell(i, 1, cols, 2)
            fig.add_trace(go.Scatter(x=run["train_time_s"], y=run["val_loss"], hovertext=hover, hoverinfo="text",
                                     **style), r, c)
        targets = sorted({float(v) for v in g["target_val_loss"].dropna() if float(v) > 0})
        for k in range(2):
            r, c = _cell(i, k, cols, 2)
            for tv in targets:
                fig.add_hline(y=tv, line=dict(dash="dot", color="grey"), row=r, col=c)
            fig.update_yaxes(type="log", row=r, col=c)
            if k == 1:  # the top panel's title already says "against samples"
                fig.update_xaxes(title_text="cumulative step time (s)", row=r, col=c)
    _legend_key(fig, sorted(curves["model"].dropna().unique()) if len(curves) else [],
                _drawn_placements(fig, curves) if len(curves) else [], sorted(fams),
                extra=[("dotted: target validation loss", dict(mode="lines", line=dict(color="grey", dash="dot")))])
    fig.update_layout(title=title, template=TEMPLATE)
    return fig


def tta_speedup_figure(table: pd.DataFrame, title: str = "Time to target: speedup and statistical efficiency"
                       ) -> go.Figure:
    """Left: strong series (one global batch) - per placement the step speedup (light bar) beside the
    time-to-target speedup (solid bar), each with its interval; they should match. Right: weak series
    (one per-process batch) - the statistical efficiency ``samples(N0) / samples(N)`` per placement, a
    bar per learning-rate rule (shade). Colour: model."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Strong: step speedup (light) vs time-to-target speedup",
                                                        "Weak: statistical efficiency samples(N0)/samples(N)"))
    strong = table[table["series"] == "strong"]
    for key, g in results._groupby(strong, ["model"]):
        m = key["model"]
        label = g["placement"] + np.where(g["series_batch"].nunique() > 1, ", B=" + g["series_batch"].astype(str), "")
        for col, name, op in (("step_speedup", "step", 0.35), ("time_speedup", "time to target", 1.0)):
            fig.add_trace(go.Bar(x=label, y=g[col], name=f"{m} {name} speedup", legendgroup=m, showlegend=False,
                                 marker=dict(color=model_color(m), opacity=op), **_err(g, col)), 1, 1)
    weak = table[table["series"] == "weak"]
    rules = sorted(weak["lr_rule"].fillna("none").unique()) if "lr_rule" in weak and len(weak) else []
    for key, g in results._groupby(weak, ["model"]):
        m = key["model"]
        for j, rule in enumerate(rules):
            gr = g[g["lr_rule"].fillna("none") == rule]
            label = gr["placement"] + ", " + gr["local_batch"].astype(str) + "/process"
            fig.add_trace(go.Bar(x=label, y=gr["statistical_efficiency"], name=f"{m} lr_rule={rule}", legendgroup=m,
                                 showlegend=False, marker=dict(color=model_color(m), opacity=1.0 - 0.25 * j),
                                 text=[f"lr {rule}"] * len(gr), textposition="outside",
                                 **_err(gr, "statistical_efficiency")), 1, 2)
    fig.add_hline(y=1.0, line=dict(dash="dot", color="grey"), row=1, col=2)
    _legend_key(fig, sorted(table["model"].unique()),
                extra=[("light: step speedup; solid: time-to-target speedup",
                        dict(mode="markers", marker=dict(symbol="square", color=GREY, size=12)))])
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(barmode="group", title=title, template=TEMPLATE, height=460)
    return fig


# -- compounding ------------------------------------------------------------------------------------
KERNEL_COLORS = {"reference": "#9ecae1", "fast": "#4292c6", "compiled": "#08306b"}
"""KAN kernel paths as shades of the KAN colour (light: reference, dark: compiled)."""


def kernel_color(kernel: str) -> str:
    return KERNEL_COLORS.get(str(kernel).split("+")[0], GREY)


def _kernel_label(k: str, impl: str) -> str:
    return k if k == impl else f"{impl} (ran {k})"


def compounding_figure(table: pd.DataFrame, title: str = "Kernel speedup x data-parallel speedup") -> go.Figure:
    """Per placement and kernel (kanlib.results.compounding_table): the measured combined speedup over
    the reference kernel on the smallest placement (bar, with its interval) and the product of the kernel
    speedup and the reference kernel's DDP speedup (diamond outline over the same bar: what compounding
    would give); right: each kernel's parallel efficiency. Colour: kernel path (shades of the KAN colour)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Combined speedup: measured (bar) vs product (diamond)",
                                                        "Parallel efficiency of each kernel"))
    places = sorted(set(table["placement"]), key=results.placement_key)
    kernels = list(dict.fromkeys(zip(table["kernel"], table["kan_impl"])))
    width = 0.8 / max(1, len(kernels))
    for j, (k, impl) in enumerate(kernels):
        g = table[(table["kernel"] == k) & (table["kan_impl"] == impl)]
        name = _kernel_label(k, impl)
        col = kernel_color(k)
        # numeric x: the bar and its diamond share a position (a category axis would centre the diamond)
        x = [places.index(p) + (j - (len(kernels) - 1) / 2) * width for p in g["placement"]]
        fig.add_trace(go.Bar(x=x, y=g["measured"], width=width, name=f"{name} measured", legendgroup=name,
                             showlegend=False, marker=dict(color=col), **_err(g, "measured")), 1, 1)
        fig.add_trace(go.Scatter(x=x, y=g["product"], mode="markers", name=f"{name} product", legendgroup=name,
                                 showlegend=False, marker=dict(symbol="diamond-open", size=12, color=col,
                                                               line=dict(width=2)),
                                 hovertext=[f"{name} {p}: product {a:.2f}x, measured {b:.2f}x" for p, a, b in
                                            zip(g["placement"], g["product"], g["measured"])], hoverinfo="text"), 1, 1)
        fig.add_trace(go.Bar(x=x, y=g["efficiency"], width=width, name=f"{name} efficiency", legendgroup=name,
                             showlegend=False, marker=dict(color=col),
                             **_err(g.assign(efficiency_lo=g["ddp_speedup_lo"] / g["world_size"],
                                             efficiency_hi=g["ddp_speedup_hi"] / g["world_size"]), "efficiency")), 1, 2)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"kernel {name}", legendgroup=name,
                                 marker=dict(symbol="square", size=12, color=col)))
    _legend_key(fig, extra=[("diamond outline: kernel speedup x reference DDP speedup",
                             dict(mode="markers", marker=dict(symbol="diamond-open", size=12, color=GREY)))])
    fig.update_yaxes(rangemode="tozero")
    fig.update_xaxes(tickvals=list(range(len(places))), ticktext=places,
                     title_text="placement (nodes x processes per node)")
    fig.update_layout(title=title, template=TEMPLATE, height=460)
    return fig


# -- data-parallel options ---------------------------------------------------------------------------
HARM_COLOR = "#d62728"


def options_figure(table: pd.DataFrame, title: str = "Data-parallel options against plain DDP") -> go.Figure:
    """Per option and placement (kanlib.results.options_table): step time relative to plain DDP, exposed
    communication, and the validation loss after the same samples relative to plain DDP (the shaded band
    is the tolerance). Colour: model; marker: placement; a red outline marks an option whose validation
    loss is worse than plain DDP's by more than the tolerance."""
    tol = float(table.attrs.get("tolerance", 0.0))
    fig = make_subplots(rows=1, cols=3, subplot_titles=("Step time / plain DDP", "Exposed communication (ms)",
                                                        "Validation loss vs plain DDP (%)"))
    t = table.copy()
    if "model" not in t:
        t["model"] = "kan"
    for key, g in results._groupby(t, ["model", "placement"]):
        m, p = key["model"], key["placement"]
        harm = g["harms_convergence"].fillna(False).astype(bool).to_numpy()
        marker = dict(symbol=placement_symbol(p), size=11, color=model_color(m),
                      line=dict(color=[HARM_COLOR if h else model_color(m) for h in harm], width=[3 if h else 0 for h in harm]))
        hover = [f"{o} at {p}<br>step {s * 1e3:.3g} ms ({r:.2f}x plain)<br>exposed {e * 1e3:.3g} ms<br>val loss {v:.5g} "
                 f"({d:+.2%} vs plain)" for o, s, r, e, v, d in
                 zip(g["option"], g["step_time_s"], g["step_time_ratio"], g["exposed_s"], g["val_loss"],
                     g["val_loss_rel_delta"])]
        style = dict(mode="markers", legendgroup=str(m), showlegend=False, name=f"{m} {p}", marker=marker,
                     hovertext=hover, hoverinfo="text")
        fig.add_trace(go.Scatter(x=g["option"], y=g["step_time_ratio"], **style), 1, 1)
        fig.add_trace(go.Scatter(x=g["option"], y=g["exposed_s"] * 1e3, **style), 1, 2)
        fig.add_trace(go.Scatter(x=g["option"], y=g["val_loss_rel_delta"] * 100, **style), 1, 3)
    fig.add_hline(y=1.0, line=dict(dash="dot", color="grey"), row=1, col=1)
    fig.add_hrect(y0=-tol * 100, y1=tol * 100, fillcolor="grey", opacity=0.15, line_width=0, row=1, col=3)
    _legend_key(fig, sorted(t["model"].unique()), _drawn_placements(fig, t),
                extra=[(f"red outline: validation loss > {tol:.1%} above plain DDP",
                        dict(mode="markers", marker=dict(symbol="circle", size=11, color="white",
                                                         line=dict(color=HARM_COLOR, width=3))))])
    fig.update_xaxes(tickangle=-30)
    fig.update_layout(title=title, template=TEMPLATE, height=500)
    return fig


# -- FSDP ----------------------------------------------------------------------------------------------
PARALLELISM_STYLE = {"ddp": dict(dash="solid", open=False), "fsdp": dict(dash="dashdot", open=True)}


def fsdp_figure(table: pd.DataFrame, title: str = "FSDP against DDP per model size") -> go.Figure:
    """Per model size (kanlib.results.fsdp_table): measured peak memory per process and step time
    under DDP (solid line, filled markers) and FSDP (dash-dot line, open markers), and the analytic
    per-process state (thin dotted lines: the whole model's under DDP, a 1/N shard under FSDP).
    Colour: model; marker: placement."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Peak memory per process (MiB)", "Step time (ms)"))
    for key, g in results._groupby(table, ["model", "placement"]):
        m, p = key["model"], key["placement"]
        g = g.sort_values("n_params")
        for par in ("ddp", "fsdp"):
            st = PARALLELISM_STYLE[par]
            sym = placement_symbol(p) + ("-open" if st["open"] else "")
            mode = "lines+markers" if len(g) > 1 else "markers"
            common = dict(mode=mode, legendgroup=str(m), showlegend=False, name=f"{m} {p} {par}",
                          line=dict(color=model_color(m), dash=st["dash"]),
                          marker=dict(symbol=sym, size=10, color=model_color(m)))
            fig.add_trace(go.Scatter(x=g["n_params"], y=g[f"peak_mem_{par}"] / 2**20, **common), 1, 1)
            fig.add_trace(go.Scatter(x=g["n_params"], y=g[f"step_{par}_s"] * 1e3, **common), 1, 2)
            if len(g) > 1:
                fig.add_trace(go.Scatter(x=g["n_params"], y=g[f"state_{par}_bytes"] / 2**20, mode="lines",
                                         name=f"{m} {p} {par} analytic state", legendgroup=str(m), showlegend=False,
                                         line=dict(color=model_color(m), dash="dot", width=1)), 1, 1)
    _legend_key(fig, sorted(table["model"].unique()), sorted(set(table["placement"]), key=results.placement_key),
                extra=[("DDP: solid line, filled marker", dict(mode="lines+markers", line=dict(color=GREY),
                                                              marker=dict(symbol="circle", color=GREY))),
                       ("FSDP: dash-dot line, open marker", dict(mode="lines+markers",
                                                                line=dict(color=GREY, dash="dashdot"),
                                                                marker=dict(symbol="circle-open", color=GREY))),
                       ("dotted: analytic state per process", dict(mode="lines", line=dict(color=GREY, dash="dot")))])
    fig.update_xaxes(type="log", title_text="parameters")
    fig.update_yaxes(type="log")
    fig.update_layout(title=title, template=TEMPLATE, height=440)
    return fig


# -- extrapolation -------------------------------------------------------------------------------------
ALGO_DASH = {"ring": "solid", "tree": "dot", "auto": "dash"}
_SIZE_COLORS = ("#08306b", "#2171b5", "#6baed6", "#9ecae1", "#4a1486", "#807dba")


def size_color(i: int) -> str:
    """The colour of the i-th KAN size of an extrapolation (shades of the KAN colour)."""
    return _SIZE_COLORS[i % len(_SIZE_COLORS)]


def extrapolation_figure(table: pd.DataFrame, measured: pd.DataFrame | None = None, target: float = 0.8,
                         title: str = "Predicted scaling to thousands of GPUs") -> go.Figure:
    """Predicted efficiency and exposed share of the step against world size (log2) for each KAN size
    (colour: a shade of the KAN colour per size), algorithm (line style) and bucket size (a subplot pair
    each), from kanlib.commmodel.extrapolation_table; the dotted line is the target. ``measured``: rows
    with ``world_size``, ``efficiency``, ``pred_efficiency``, ``placement`` and ``label`` - measured
    strong-scaling points (filled markers) beside the model's prediction for the same configuration
    (open markers), drawn in every efficiency panel."""
    caps = sorted(table["bucket_cap_mb"].unique())
    fig, cols = _grid(len(caps), 2, [f"{c:g} MiB buckets" for c in caps],
                      ["Predicted efficiency", "Exposed communication / step"], height_per_row=340,
                      vertical_spacing=min(0.2, 0.7 / max(1, 2 * math.ceil(len(caps) / FACET_COLS))))
    sizes = list(dict.fromkeys(table["kan"]))
    for i, cap in enumerate(caps):
        g = table[table["bucket_cap_mb"] == cap]
        for (kan, algo), s in g.groupby(["kan", "algo"], sort=False):
            s = s.sort_values("world_size")
            col = size_color(sizes.index(kan))
            hover = [f"{kan} ({n:,} parameters), {algo}, {cap:g} MiB<br>N={w} ({a}x{b})<br>E={e:.1%}, exposed "
                     f"{o:.1%}" for n, w, a, b, e, o in zip(s["n_params"], s["world_size"], s["nnodes"],
                                                            s["nproc_per_node"], s["efficiency"],
                                                            s["overhead_fraction"])]
            style = dict(mode="lines", legendgroup=f"size {kan}", showlegend=False, name=f"{kan} {algo}",
                         line=dict(color=col, dash=ALGO_DASH.get(algo, "dash")), hovertext=hover, hoverinfo="text")
            r, c = _cell(i, 0, cols, 2)
            fig.add_trace(go.Scatter(x=s["world_size"], y=s["efficiency"], **style), r, c)
            r, c = _cell(i, 1, cols, 2)
            fig.add_trace(go.Scatter(x=s["world_size"], y=s["overhead_fraction"], **style), r, c)
        r, c = _cell(i, 0, cols, 2)
        fig.add_hline(y=target, line=dict(dash="dot", color="grey"), row=r, col=c)
        if measured is not None and len(measured):
            for _, mrow in measured.iterrows():
                hover = f"measured {mrow['label']} at {mrow['placement']}: E={mrow['efficiency']:.1%}"
                fig.add_trace(go.Scatter(x=[mrow["world_size"]], y=[mrow["efficiency"]], mode="markers",
                                         name=f"measured {mrow['placement']}", legendgroup="measured", showlegend=False,
                                         hovertext=[hover], hoverinfo="text",
                                         marker=dict(symbol=placement_symbol(mrow["placement"]), size=11,
                                                     color=model_color("kan"))), r, c)
                fig.add_trace(go.Scatter(x=[mrow["world_size"]], y=[mrow["pred_efficiency"]], mode="markers",
                                         name=f"predicted {mrow['placement']}", legendgroup="measured",
                                         showlegend=False, hovertext=[f"model for {mrow['label']} at "
                                                                      f"{mrow['placement']}: E="
                                                                      f"{mrow['pred_efficiency']:.1%}"],
                                         hoverinfo="text",
                                         marker=dict(symbol=placement_symbol(mrow["placement"]) + "-open", size=13,
                                                     color=model_color("kan"), line=dict(width=2))), r, c)
        for k in range(2):
            r, c = _cell(i, k, cols, 2)
            fig.update_xaxes(type="log", title_text="world size (GPUs)", row=r, col=c)
            fig.update_yaxes(range=[0, 1.05], tickformat=".0%", row=r, col=c)
    for j, kan in enumerate(sizes):
        n = int(table.loc[table["kan"] == kan, "n_params"].iloc[0])
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"{kan} ({n:,} parameters)",
                                 legendgroup=f"size {kan}", line=dict(color=size_color(j), width=3)))
    extra = [(f"line: {a}", dict(mode="lines", line=dict(color=GREY, dash=ALGO_DASH.get(a, "dash"))))
             for a in dict.fromkeys(table["algo"])]
    if measured is not None and len(measured):
        extra.append(("filled: measured; open: model for that run", dict(mode="markers", marker=dict(
            symbol="circle-open", size=11, color=model_color("kan")))))
    _legend_key(fig, placements=sorted(set(measured["placement"]), key=results.placement_key)
                if measured is not None and len(measured) else (), extra=extra)
    fig.update_layout(title=title, template=TEMPLATE)
    return fig


# -- the published setup ------------------------------------------------------------------------------
_SCENARIO_COLORS = ("#9ecae1", "#4292c6", "#08306b", "#807dba")


def published_figure(comparisons: dict, title: str = "The published setup (8 GPUs = 4 nodes x 2) through the model"
                     ) -> go.Figure:
    """Predicted speedup, efficiency and communication overhead at the published shape per scenario
    (``{name: kanlib.presets.published_comparison(...)}``) as bars, the published 5.97x, 74.7% and
    1.3-6.1% as dotted lines and a band."""
    from kanlib.presets import PUBLISHED

    fig = make_subplots(rows=1, cols=3, subplot_titles=("Speedup at 8 GPUs", "Efficiency", "Exposed communication / step"))
    for i, (name, r) in enumerate(comparisons.items()):
        t = r["table"].set_index("quantity")["predicted"].tolist()
        for col, v in enumerate(t, start=1):
            fig.add_trace(go.Bar(x=[f"S{i + 1}"], y=[v], name=name, legendgroup=name, showlegend=col == 1,
                                 marker=dict(color=_SCENARIO_COLORS[i % len(_SCENARIO_COLORS)]),
                                 hovertext=[f"{name}: {v:.3g}"], hoverinfo="text"), 1, col)
    fig.add_hline(y=PUBLISHED["speedup"], line=dict(dash="dot", color="grey"), row=1, col=1)
    fig.add_hline(y=PUBLISHED["efficiency"], line=dict(dash="dot", color="grey"), row=1, col=2)
    fig.add_hrect(y0=PUBLISHED["overhead_fraction_min"], y1=PUBLISHED["overhead_fraction_max"], fillcolor="grey",
                  opacity=0.2, line_width=0, row=1, col=3)
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(tickformat=".0%", row=1, col=2)
    fig.update_yaxes(tickformat=".1%", row=1, col=3)
    fig.update_layout(title=title, template=TEMPLATE, height=420, legend=dict(orientation="h", y=-0.15))
    return fig
