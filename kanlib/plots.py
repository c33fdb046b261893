"""DataFrame in, Plotly figure out: one builder per study, plus an ipywidgets explorer.

Figures are plain ``go.Figure`` objects (they render in static exports); ``save_html`` writes a
self-contained file with plotly.js embedded, so it opens offline.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

TEMPLATE = "plotly_white"


def px_colors() -> list[str]:
    """The qualitative colour cycle used for groups (one colour per group across subplots)."""
    import plotly.colors

    return plotly.colors.qualitative.Plotly


def _err(table: pd.DataFrame, col: str) -> dict:
    lo, hi = f"{col}_lo", f"{col}_hi"
    if lo not in table or hi not in table:
        return {}
    return {"error_y": dict(type="data", symmetric=False, array=(table[hi] - table[col]).clip(lower=0),
                            arrayminus=(table[col] - table[lo]).clip(lower=0))}


def _label(key) -> str:
    if isinstance(key, tuple):
        return ", ".join(str(k) for k in key)
    return str(key)


def _groups(table: pd.DataFrame, by: list[str]):
    by = [b for b in by if b in table]
    if not by:
        return [("", table)]
    return [(_label(k), g) for k, g in table.groupby(by, dropna=False)]


def _markers(g: pd.DataFrame) -> dict:
    """Circles for points within one node, diamonds for points across nodes (the first network hop)."""
    if "inter_node" not in g:
        return {}
    return {"marker": dict(symbol=["diamond" if v else "circle" for v in g["inter_node"]], size=9)}


def strong_scaling_figure(table: pd.DataFrame, by=("model",), title: str = "Strong scaling") -> go.Figure:
    """Speedup and parallel efficiency against world size (medians, bootstrap 95% bars), with the ideal."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Speedup T(1)/T(N)", "Parallel efficiency S/N"))
    n = np.array(sorted(table["world_size"].unique()))
    fig.add_trace(go.Scatter(x=n, y=n, mode="lines", name="ideal", line=dict(dash="dash", color="grey")), 1, 1)
    fig.add_trace(go.Scatter(x=n, y=np.ones_like(n), mode="lines", name="ideal", showlegend=False,
                             line=dict(dash="dash", color="grey")), 1, 2)
    for name, g in _groups(table, list(by)):
        custom = g[["n_runs", "step_time_s"]].assign(topology=g.get("topology", ""))
        fig.add_trace(go.Scatter(x=g["world_size"], y=g["speedup"], mode="lines+markers",
                                 name=f"speedup {name}".strip(), **_err(g, "speedup"), **_markers(g),
                                 customdata=custom,
                                 hovertemplate="N=%{x} (%{customdata[2]} nodes x procs)<br>S=%{y:.2f}"
                                               "<br>runs=%{customdata[0]}<br>T=%{customdata[1]:.4g} s"), 1, 1)
        fig.add_trace(go.Scatter(x=g["world_size"], y=g["efficiency"], mode="lines+markers", **_markers(g),
                                 **_err(g, "efficiency"),
                                 name=f"efficiency {name}".strip()), 1, 2)
    fig.update_xaxes(title_text="world size N (processes)", tickvals=n)
    fig.update_yaxes(title_text="speedup", row=1, col=1)
    fig.update_yaxes(title_text="efficiency", rangemode="tozero", row=1, col=2)
    fig.update_layout(title=title + " (diamonds: across nodes)", template=TEMPLATE, height=420)
    return fig


def weak_scaling_figure(table: pd.DataFrame, title: str = "Weak scaling") -> go.Figure:
    """Throughput and weak-scaling efficiency against world size, one line per per-process batch."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Throughput (samples/s)", "Weak-scaling efficiency"))
    palette = px_colors()
    for i, (name, g) in enumerate(_groups(table, ["local_batch"])):
        color = palette[i % len(palette)]
        fig.add_trace(go.Scatter(x=g["world_size"], y=g["throughput"], mode="lines+markers", legendgroup=name,
                                 name=f"b/proc={name}", line=dict(color=color), **_err(g, "throughput"),
                                 **_markers(g)), 1, 1)
        fig.add_trace(go.Scatter(x=g["world_size"], y=g["weak_efficiency"], mode="lines+markers", legendgroup=name,
                                 line=dict(color=color), name=f"E_w vs N0, b/proc={name}"), 1, 2)
        fig.add_trace(go.Scatter(x=g["world_size"], y=g["weak_efficiency_multi"], mode="lines+markers",
                                 legendgroup=name, line=dict(dash="dot", color=color),
                                 name=f"E_w vs first multi-process, b/proc={name}"), 1, 2)
    fig.update_xaxes(title_text="world size N", tickvals=sorted(table["world_size"].unique()))
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(title=title, template=TEMPLATE, height=420)
    return fig


def communication_figure(table: pd.DataFrame, title: str = "Communication overhead") -> go.Figure:
    """Stacked compute / exposed-communication bars per world size and bucket size, and the overlap."""
    t = table.sort_values(["world_size", "bucket_cap_mb"]).copy()
    algo = t["nccl_algo"].replace("", "default") if "nccl_algo" in t else "default"
    t["point"] = ("N=" + t["world_size"].astype(str) + ", bucket=" + t["bucket_cap_mb"].astype(str) + " MiB, "
                  + algo.astype(str))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Step time: compute + exposed communication",
                                                        "Exposed share of step and overlap"))
    fig.add_trace(go.Bar(x=t["point"], y=t["compute_s"], name="compute (incl. hidden comm)"), 1, 1)
    fig.add_trace(go.Bar(x=t["point"], y=t["exposed_s"], name="exposed communication"), 1, 1)
    fig.add_trace(go.Scatter(x=t["point"], y=t["comm_total_s"], mode="markers", name="total all-reduce time",
                             marker=dict(symbol="diamond", size=10)), 1, 1)
    fig.add_trace(go.Scatter(x=t["point"], y=t["overhead_fraction"], mode="lines+markers",
                             name="overhead = exposed / step"), 1, 2)
    fig.add_trace(go.Scatter(x=t["point"], y=t["overlap_fraction"], mode="lines+markers",
                             name="overlap = hidden / total comm"), 1, 2)
    fig.update_layout(barmode="stack", title=title, template=TEMPLATE, height=460)
    fig.update_yaxes(title_text="seconds per step", row=1, col=1)
    fig.update_yaxes(title_text="fraction", range=[0, 1.05], row=1, col=2)
    return fig


def comm_model_figure(pred: pd.DataFrame, measured: pd.DataFrame | None = None, model=None,
                      title: str = "Alpha-beta model: extrapolated strong scaling") -> go.Figure:
    """Predicted communication time and efficiency against world size (log scale), with measured
    all-reduce times when given."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("All-reduce time per step (s)", "Predicted efficiency"))
    fig.add_trace(go.Scatter(x=pred["world_size"], y=pred["comm_s"], mode="lines", name="model"), 1, 1)
    if measured is not None and not measured.empty:
        fig.add_trace(go.Scatter(x=measured["world_size"], y=measured["comm_total_s"], mode="markers",
                                 name="measured", marker=dict(size=9)), 1, 1)
    fig.add_trace(go.Scatter(x=pred["world_size"], y=pred["efficiency"], mode="lines+markers",
                             name="predicted efficiency"), 1, 2)
    if model is None:
        sub = ""
    else:
        bw = f"bandwidth={model.bandwidth_bytes_per_s:.3g} B/s" if model.beta > 0 else "bandwidth not resolved"
        sub = f" (alpha={model.alpha:.3g} s, {bw}, {model.algo}, {model.n_points} runs)"
    fig.update_xaxes(type="log", title_text="world size N")
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_yaxes(range=[0, 1.05], row=1, col=2)
    fig.update_layout(title=title + sub, template=TEMPLATE, height=420)
    return fig


def model_size_figure(table: pd.DataFrame, title: str = "Model-size scaling") -> go.Figure:
    """KAN against matched-parameter MLP: step time, peak memory, parameters per byte and time per parameter."""
    fig = make_subplots(rows=2, cols=2, subplot_titles=("Step time (s)", "Peak memory (bytes)",
                                                        "Parameters per byte of peak memory",
                                                        "Time per parameter (s)"))
    for name, g in _groups(table, ["model"]):
        g = g.sort_values("n_params")
        hover = g["widths"].astype(str) + " grid=" + g["grid_size"].astype(str)
        for (r, c), col in zip([(1, 1), (1, 2), (2, 1), (2, 2)],
                               ["step_time_s", "peak_mem_bytes", "params_per_byte", "time_per_param_s"]):
            fig.add_trace(go.Scatter(x=g["n_params"], y=g[col], mode="lines+markers", name=name,
                                     legendgroup=name, showlegend=(r, c) == (1, 1), text=hover,
                                     **(_err(g.rename(columns={"step_time_lo": "step_time_s_lo",
                                                               "step_time_hi": "step_time_s_hi"}), col)
                                        if col == "step_time_s" else {})), r, c)
    fig.update_xaxes(type="log", title_text="parameters")
    fig.update_yaxes(type="log")
    fig.update_layout(title=title, template=TEMPLATE, height=700)
    return fig


def save_html(fig: go.Figure, path: str) -> str:
    """Write ``fig`` as a self-contained HTML file (plotly.js embedded: opens with no network)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path


def explorer(df: pd.DataFrame, x_options=("world_size", "n_params", "bucket_cap_mb", "global_batch"),
             metrics=None):
    """An ipywidgets panel over the records: choose the study, x axis, metric and model; the plot
    redraws (needs a live kernel; static exports show the figures saved beside it)."""
    import ipywidgets as widgets
    from IPython.display import display

    metrics = list(metrics or [c for c in ("step_time_s", "samples_per_s", "forward_s", "backward_s",
                                           "optimizer_s", "comm_total_s", "peak_mem_bytes",
                                           "final_val_loss") if c in df])
    study = widgets.Dropdown(options=sorted(df["study"].unique()), description="study")
    x = widgets.Dropdown(options=[c for c in x_options if c in df], description="x")
    metric = widgets.Dropdown(options=metrics, description="metric")
    sizes = sorted(df["n_params"].unique()) if "n_params" in df else []
    model = widgets.SelectMultiple(options=sorted(df["model"].unique()), value=tuple(sorted(df["model"].unique())),
                                   description="model")
    size = widgets.SelectionRangeSlider(options=sizes, index=(0, len(sizes) - 1), description="params") \
        if len(sizes) > 1 else None
    out = widgets.Output()

    def redraw(*_):
        d = df[(df["study"] == study.value) & (df["model"].isin(model.value))]
        if size is not None:
            d = d[(d["n_params"] >= size.value[0]) & (d["n_params"] <= size.value[1])]
        fig = go.Figure()
        for name, g in d.groupby(["model", "comm_hook"] if study.value == "communication" else ["model"]):
            agg = g.groupby(x.value)[metric.value].agg(["median", "min", "max"]).reset_index()
            fig.add_trace(go.Scatter(x=agg[x.value], y=agg["median"], mode="lines+markers", name=_label(name),
                                     error_y=dict(type="data", symmetric=False, array=agg["max"] - agg["median"],
                                                  arrayminus=agg["median"] - agg["min"])))
        fig.update_layout(template=TEMPLATE, height=400, xaxis_title=x.value, yaxis_title=metric.value,
                          title=f"{study.value}: median {metric.value} (bars: min-max over repeats)")
        out.clear_output(wait=True)
        with out:
            display(fig)

    controls = [study, x, metric, model] + ([size] if size is not None else [])
    for w in controls:
        w.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox(controls[:3]), widgets.HBox(controls[3:]), out])
