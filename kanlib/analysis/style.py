"""One visual language across every figure, the pieces every study's figures are built from, and the renderers
that make figures show everywhere.

A model always has the same colour (:data:`MODEL_COLORS`), a placement (nodes x processes per node) always
the same marker (:func:`placement_symbol`), and a line is solid within one node and dashed across nodes
(:data:`FAMILY_DASH`). Each figure has one legend: a key of models, placements and line styles (legend-only
entries, no data, :func:`legend_key`); data traces belong to their model's legend group, so clicking a model
hides all of its traces. Groups of records that differ in configuration get a subplot each (:func:`facets`).
A series with a single point is not drawn as a line; ``fig.layout.meta["not_drawn"]`` names what was left out,
for the caption. Every subplot has an x- and a y-axis title with its unit (:func:`axis_titles`;
:func:`missing_axis_titles` lists the axes that lack one); the target efficiency is one long-dashed line
(:func:`target_line`), a published range one shaded band (:func:`published_band`), and a point above 100%
efficiency is flagged where it is drawn (:func:`flag_above`).

Figures are plain ``go.Figure`` objects. :func:`use_offline_renderers` makes notebook outputs carry both the
plotly mime bundle (JupyterLab renders it in untrusted notebooks) and HTML with plotly.js embedded once and no
MathJax (nbconvert exports, opened offline). :func:`save_html` writes a self-contained file with plotly.js
embedded.
"""

from __future__ import annotations

import math
import os
import zlib

import importlib
import types

import numpy as np
import pandas as pd

from kanlib.analysis import groups


def import_plotly(name: str = "plotly") -> types.ModuleType:
    """The plotly module ``name``, imported now: figures need plotly, which the ``notebooks`` extra installs; the
    analysis CLIs (``python -m kanlib.guidelines``) run on the core dependencies, so nothing imports it before a
    figure is made. Without it: a ModuleNotFoundError that says how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ModuleNotFoundError(f"making a figure needs plotly, which kanlib's notebooks extra installs (pip install "
                                  f"'kanlib[notebooks]'): {e}", name="plotly") from e


class _LazyModule(types.ModuleType):
    """A plotly module that is imported at its first attribute (``go.Figure``), not when a study module is."""

    def __getattr__(self, attr: str):
        return getattr(import_plotly(self.__name__), attr)


go = _LazyModule("plotly.graph_objects")
"""``plotly.graph_objects``, imported when a figure is first made (:func:`import_plotly`)."""


def make_subplots(*args, **kwargs):
    """``plotly.subplots.make_subplots``, imported when first called (:func:`import_plotly`)."""
    return import_plotly("plotly.subplots").make_subplots(*args, **kwargs)

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
ROW_GAP_PX = 120  # between stacked panels: the upper one's x-axis title, the lower one's two-line title
TARGET_COLOR = "#2b2b2b"
"""The target efficiency's line (dashed), in every figure the same."""
BAND_COLOR = "#f4a582"
"""The published range's band."""
FLAG_COLOR = "#d62728"
"""The ring around a point that needs a second look (above 100% efficiency)."""


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


def save_html(fig: go.Figure, path: str) -> str:
    """Write ``fig`` as a self-contained HTML file (plotly.js embedded, no MathJax: opens with no network)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, include_mathjax=False, full_html=True)
    return path


# -- pieces ------------------------------------------------------------------------------------
def error_bars(table: pd.DataFrame, col: str, lo: str | None = None, hi: str | None = None) -> dict:
    """Plotly ``error_y`` of column ``col`` from its interval columns (``<col>_lo``/``_hi`` by default); {} without."""
    lo, hi = lo or f"{col}_lo", hi or f"{col}_hi"
    if lo not in table or hi not in table:
        return {}
    return {"error_y": dict(type="data", symmetric=False, array=(table[hi] - table[col]).clip(lower=0).tolist(),
                            arrayminus=(table[col] - table[lo]).clip(lower=0).tolist(), thickness=1)}


def facets(data: pd.DataFrame, fields: list[str]) -> list[tuple[str, pd.DataFrame]]:
    """``(label, rows)`` per group of ``fields`` (one unlabelled facet without fields): a subplot each."""
    return [(groups.group_label(k, fields) if fields else "", g) for k, g in groups.groupby(data, fields)]


def grid(n_facets: int, rows_per_facet: int, titles: list[str], row_titles: list[str], height_per_row=300,
         vertical_spacing: float | None = None):
    """Subplots for ``n_facets`` facets of ``rows_per_facet`` panels each, at most :data:`FACET_COLS` facets a row;
    ``(figure, columns)``."""
    cols = min(n_facets, FACET_COLS)
    facet_rows = math.ceil(n_facets / cols)
    subplot_titles = []
    for fr in range(facet_rows):
        for r in range(rows_per_facet):
            for c in range(cols):
                i = fr * cols + c
                subplot_titles.append(
                    (f"{row_titles[r]}" + (f"<br><sup>{titles[i]}</sup>" if titles[i] else "")) if i < n_facets else "")
    n_rows = facet_rows * rows_per_facet
    # every panel titles its x axis, and the panel below has a two-line title: ROW_GAP_PX between panels
    height = max(380, height_per_row * n_rows + 80 + ROW_GAP_PX * (n_rows - 1))
    if vertical_spacing is None:
        vertical_spacing = min(ROW_GAP_PX / max(1, height - 180), 0.9 / max(1, n_rows - 1))
    fig = make_subplots(rows=n_rows, cols=cols, subplot_titles=subplot_titles, vertical_spacing=vertical_spacing,
                        horizontal_spacing=0.08)
    fig.update_layout(height=height)
    for i in range(n_facets, facet_rows * cols):  # cells of the last row with no facet: no empty axes
        for r in range(rows_per_facet):
            row, col = cell(i, r, cols, rows_per_facet)
            fig.update_xaxes(visible=False, row=row, col=col)
            fig.update_yaxes(visible=False, row=row, col=col)
    return fig, cols


def cell(i: int, r: int, cols: int, rows_per_facet: int) -> tuple[int, int]:
    """(row, col) of facet ``i``'s ``r``-th panel (1-based)."""
    return (i // cols) * rows_per_facet + r + 1, i % cols + 1


def legend_key(fig: go.Figure, models=(), placements=(), families=(), extra=()) -> None:
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


def series(g: pd.DataFrame, ycol: str) -> list[tuple[str, pd.DataFrame]]:
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


def symbols(g: pd.DataFrame) -> list[str]:
    """The marker of each row's placement."""
    return [placement_symbol(p) for p in g["placement"]]


def with_meta(fig: go.Figure, **kw) -> go.Figure:
    """``fig`` with ``kw`` merged into ``layout.meta`` (what a caption needs: e.g. ``not_drawn``)."""
    meta = dict(fig.layout.meta or {})
    meta.update(kw)
    fig.update_layout(meta=meta)
    return fig


def not_drawn(fig) -> str:
    """A caption's sentence naming the series a figure left out (``layout.meta['not_drawn']``), or ''."""
    nd = (fig.layout.meta or {}).get("not_drawn") or []
    return f" Not drawn (a single point is no line): {'; '.join(nd)}." if nd else ""


def data_traces(fig: go.Figure) -> list:
    """The traces that draw data (not legend-key entries)."""
    return [t for t in fig.data if t.x is not None and any(v is not None for v in t.x)]


def drawn_placements(fig: go.Figure, table: pd.DataFrame) -> list[str]:
    """Placements whose marker some data trace draws (the legend promises no other)."""
    drawn = set()
    for t in data_traces(fig):
        try:
            s = t.marker.symbol
        except AttributeError:  # bars have no marker symbol
            s = None
        if isinstance(s, (list, tuple)):
            drawn.update(s)
        elif s:
            drawn.add(s)
    ps = sorted(set(table["placement"]), key=groups.placement_key)
    return [p for p in ps if placement_symbol(p) in drawn]


# -- axes, targets, published ranges, flags ------------------------------------------------------------
def axis_titles(fig: go.Figure, x: str | None, y: str | None, row: int | None = None, col: int | None = None) -> None:
    """Title the x and y axes (with their units) of subplot (row, col), or of every subplot when both are None."""
    if x is not None:
        fig.update_xaxes(title_text=x, row=row, col=col)
    if y is not None:
        fig.update_yaxes(title_text=y, row=row, col=col)


def _used_axes(fig: go.Figure) -> set[str]:
    used = set()
    for t in fig.data:
        xa, ya = getattr(t, "xaxis", None) or "x", getattr(t, "yaxis", None) or "y"
        used.add("xaxis" + xa[1:])
        used.add("yaxis" + ya[1:])
    return used


def missing_axis_titles(fig: go.Figure) -> list[str]:
    """The visible axes (``xaxis``, ``yaxis3``, ...) of ``fig`` that some trace draws on and that have no title."""
    lay = fig.layout
    out = []
    for name in sorted(_used_axes(fig)):
        ax = lay[name] if name in lay else None
        if ax is not None and ax.visible is False:
            continue
        if ax is None or not (ax.title and ax.title.text):
            out.append(name)
    return out


def target_line(fig: go.Figure, target: float, row: int | None = None, col: int | None = None) -> None:
    """The target efficiency (a fraction, e.g. 0.8 from the guidelines' Goals) as a long-dashed black line, labelled
    (long dashes: a short-dashed line is a series across nodes)."""
    fig.add_hline(y=target, line=dict(dash="longdash", color=TARGET_COLOR, width=1.5), row=row, col=col,
                  annotation_text=f"target {target:.0%}", annotation_position="bottom right",
                  annotation_font=dict(size=10, color=TARGET_COLOR), name=f"target {target:.0%}")


def target_key(target: float) -> tuple[str, dict]:
    """The legend-key entry of :func:`target_line` (for :func:`legend_key`'s ``extra``)."""
    return (f"long dashes: target efficiency {target:.0%} (guidelines)",
            dict(mode="lines", line=dict(dash="longdash", color=TARGET_COLOR, width=1.5)))


def published_band(fig: go.Figure, lo: float, hi: float, label: str, row: int | None = None,
                   col: int | None = None) -> None:
    """A published range ``[lo, hi]`` (in the axis' units) as a shaded band behind the data, labelled."""
    fig.add_hrect(y0=lo, y1=hi, fillcolor=BAND_COLOR, opacity=0.45, line_width=0, layer="below", row=row, col=col,
                  annotation_text=label, annotation_position="top left",
                  annotation_font=dict(size=10, color="#b2182b"), name=label)


def band_key(label: str) -> tuple[str, dict]:
    """The legend-key entry of :func:`published_band`."""
    return (f"band: {label}", dict(mode="markers", marker=dict(symbol="square", size=12, color=BAND_COLOR)))


def flag_above(fig: go.Figure, limit: float = 1.0,
               label: str = "above 100%: beyond ideal scaling (triangle: off the scale, its value beside)",
               cap: float = 1.5) -> list[str]:
    """Ring every drawn point whose y exceeds ``limit`` (an efficiency above 100%) in its own subplot and name the
    ring in the legend once. The y axis shows up to ``cap``: a point above it is drawn at the top edge as a ringed
    up-triangle labelled with its value, so that one wild point does not flatten the rest. Returns what was
    flagged (trace name, value and x) for the caption; [] when nothing is above."""
    flagged, rings = [], []
    for t in data_traces(fig):
        if getattr(t, "fill", None) in ("toself", "tonexty", "tozeroy") or t.name == label:
            continue  # a band's outline is not a point
        pts = [(x, float(y)) for x, y in zip(list(t.x), list(t.y) if t.y is not None else [])
               if y is not None and np.isfinite(float(y)) and float(y) > limit]
        if pts:
            rings.append((t.xaxis or "x", t.yaxis or "y", pts))
            flagged += [f"{t.name} {y:.0%} at {x}" for x, y in pts]
    highest = {}  # (y axis, x) -> the highest value off the scale there: the one whose value is written
    for _, ya, pts in rings:
        for x, y in pts:
            if y > cap:
                highest[(ya, x)] = max(y, highest.get((ya, x), y))
    for i, (xa, ya, pts) in enumerate(rings):
        text = []
        for x, y in pts:
            text.append(f"{y:.0%}" if y > cap and highest.pop((ya, x), None) == y else "")
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[min(p[1], cap) for p in pts], mode="markers+text",
                                 name=label, legendgroup=label, showlegend=i == 0, xaxis=xa, yaxis=ya,
                                 text=text, textposition="middle right",
                                 textfont=dict(color=FLAG_COLOR, size=10), hoverinfo="text",
                                 hovertext=[f"{y:.0%}: above 100% efficiency" for _, y in pts],
                                 marker=dict(symbol=["triangle-up-open" if y > cap else "circle-open" for _, y in pts],
                                             size=20, color=FLAG_COLOR, line=dict(width=2.5))))
        name = "yaxis" + ya[1:]
        rng = fig.layout[name].range
        top = min(cap, max(p[1] for p in pts)) * 1.05
        if rng is not None and rng[1] < top:
            fig.layout[name].range = (rng[0], top)
    return flagged


def listed(items: list[str], most: int = 4) -> str:
    """``items`` joined by '; ', the first ``most`` of them and how many more."""
    more = len(items) - most
    return "; ".join(items[:most]) + (f"; and {more} more" if more > 0 else "")
