"""An ipywidgets panel over the records: study, x axis, metric, models and parameter range.

What a study offers (its x axes, the fields that make a line of their own) is the study's own
(:class:`View`, declared by each module of kanlib.studies as ``EXPLORER``; ``kanlib.studies.views()`` maps them
by study); this module draws whatever it is given.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kanlib.analysis import groups, style
from kanlib.analysis.style import go

METRICS = ("step_time_s", "samples_per_s", "wall_samples_per_s", "forward_s", "backward_s", "optimizer_s",
           "comm_total_s", "peak_mem_bytes", "final_val_loss", "final_val_accuracy", "time_to_target_s",
           "steps_to_target", "samples_to_target", "time_to_first_step_s", "compile_s")
"""The measurements the explorer offers (those measured in the chosen study)."""


@dataclass(frozen=True)
class View:
    """What the explorer offers for one study: ``x``, the axes (those that vary there), and ``series``, fields that
    make a line of their own where they vary, beside model and placement (nothing of different configurations is
    pooled into one median)."""

    x: tuple[str, ...] = ("world_size", "n_params")
    series: tuple[str, ...] = ()
    axes: tuple[str, ...] = groups.PLACEMENT_AXES
    """The study's table axes (``AXES``): what varies within one of its groups (kanlib.studies.views fills it)."""


def explorer_options(df: pd.DataFrame, study: str, views: dict[str, View] | None = None) -> dict:
    """What the explorer offers for ``study``'s records (``views``: each study's :class:`View`): x axes that vary
    there, metrics measured there (not all NaN), its models, and its parameter counts (for the range slider)."""
    d = df[df["study"] == study].copy()
    if d.empty:
        raise ValueError(f"study: no records of {study!r} (have: {', '.join(sorted(df['study'].unique()))})")
    if "widths" in d:
        d["depth"] = d["widths"].map(lambda w: len(w) - 1)
    if "global_batch" in d and "world_size" in d:
        d["local_batch"] = d["global_batch"] // d["world_size"]
    view = (views or {}).get(study, View())
    xs = [c for c in view.x if c in d and d[c].nunique() > 1]
    metrics = [c for c in METRICS if c in d and pd.to_numeric(d[c], errors="coerce").notna().any()]
    sizes = sorted(int(v) for v in d["n_params"].unique()) if "n_params" in d else []
    return {"records": d, "x": xs or ["world_size"], "metrics": metrics, "models": sorted(d["model"].unique()),
            "sizes": sizes, "series": view.series}


def explorer_figure(df: pd.DataFrame, study: str, x: str | None = None, metric: str = "step_time_s",
                    models=None, size_range=None, views: dict[str, View] | None = None) -> go.Figure:
    """The explorer's figure: median ``metric`` against ``x`` over ``study``'s records (bars: min-max
    over repeats), one line per model and placement (and the study's series fields), in the shared colours
    and markers."""
    opt = explorer_options(df, study, views)
    d = opt["records"]
    x = x or opt["x"][0]
    d = d[d["model"].isin(models or opt["models"])]
    if size_range is not None:
        d = d[(d["n_params"] >= size_range[0]) & (d["n_params"] <= size_range[1])]
    d = groups.with_placement(d)
    derived = [c for c in ("depth", "local_batch") if c not in df]  # added above for the x axis, not record fields
    keys = line_keys(d, study, x, opt["series"], (views or {}).get(study, View()).axes, derived=derived)
    fig = go.Figure()
    for key, g in groups.groupby(d, keys):
        agg = g.groupby(x)[metric].agg(["median", "min", "max"]).reset_index().dropna()
        if agg.empty:
            continue
        m, p = key["model"], key["placement"]
        fig.add_trace(go.Scatter(x=agg[x], y=agg["median"], mode="lines+markers" if len(agg) > 1 else "markers",
                                 name=trace_name(key), legendgroup=str(m),
                                 line=dict(color=style.model_color(m),
                                           dash=style.FAMILY_DASH[groups.family(int(p.split("x")[0]))]),
                                 marker=dict(symbol=style.placement_symbol(p), size=9, color=style.model_color(m)),
                                 error_y=dict(type="data", symmetric=False, array=agg["max"] - agg["median"],
                                              arrayminus=agg["median"] - agg["min"], thickness=1)))
    fig.update_layout(template=style.TEMPLATE, height=420, xaxis_title=x, yaxis_title=metric,
                      title=f"{study}: median {metric} against {x} (bars: min-max over repeats)")
    return fig


def line_keys(d: pd.DataFrame, study: str, x: str, series=(), axes=groups.PLACEMENT_AXES,
              derived=()) -> list[str]:
    """The fields that make a line of its own: model, placement, every field that separates the study's table
    groups (:func:`kanlib.analysis.groups.design` with the study's ``axes``), the view's ``series`` where they
    vary, and any table axis that still varies at one ``x`` within a line; so a median never pools two points a
    table keeps apart (the strong-scaling work sizes, runs with and without the emulated link). ``derived``:
    columns of ``d`` made for the x axis (``local_batch``, ``depth``), not record fields: the design never sees
    them, while ``x`` may be one of them."""
    keys = ["model", "placement"]
    placed = set(groups.PLACEMENT_AXES) | {"world_size", x}  # the placement names them already
    fields = d.drop(columns=[c for c in derived if c in d])
    keys += [f for f in groups.design(fields, study, axes).groups if f not in placed and f not in keys]
    keys += [f for f in series if f in d and f != x and f not in keys and groups.varies(d[f])]
    for a in axes:
        if a in keys or a == x or a in groups.PLACEMENT_AXES or a not in d:
            continue
        if any(groups.varies(g[a]) for _, g in groups.groupby(d, keys + [x])):
            keys.append(a)
    return keys


def trace_name(key: dict) -> str:
    """``kan 1x2 kan_impl=fast, emulate_latency_s=0.005``: model, placement and the other line fields that are set."""
    rest = {k: v for k, v in key.items() if k not in ("model", "placement") and not (isinstance(v, float) and v != v)}
    return f"{key['model']} {key['placement']}" + (f" {groups.group_label(rest)}" if rest else "")


def explorer(df: pd.DataFrame, study: str | None = None, views: dict[str, View] | None = None):
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
        opt = explorer_options(df, study_w.value, views)
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
        fig = explorer_figure(df, study_w.value, x_w.value, metric_w.value, list(model_w.value), size_w.value, views)
        out.clear_output(wait=True)
        with out:
            display(fig)

    study_w.observe(refill, names="value")
    for w in (x_w, metric_w, model_w, size_w):
        w.observe(redraw, names="value")
    refill()
    return widgets.VBox([widgets.HBox([study_w, x_w, metric_w]), widgets.HBox([model_w, size_w]), out])


def show_explorer(df: pd.DataFrame, study: str, views: dict[str, View] | None = None) -> None:
    """Display the explorer opened on ``study`` and, below it, a static copy of its first view, so an
    executed notebook or an HTML export (no kernel) still shows the figure."""
    from IPython.display import Markdown, display

    panel = explorer(df, study, views)
    # a saved notebook has no widget state: JupyterLab then shows the text/plain part, which by default is the raw
    # repr "VBox(children=...)"; say what it is instead
    bundle = panel._repr_mimebundle_() if hasattr(panel, "_repr_mimebundle_") else None
    if isinstance(bundle, dict):
        bundle["text/plain"] = ("Explorer (study, x, metric, model and size controls): needs a live kernel; "
                                "run the cell.")
        display(bundle, raw=True)
    else:
        display(panel)
    display(Markdown("*Static copy of the explorer's first view (the controls above need a live kernel):*"))
    explorer_figure(df, study, views=views).show()
