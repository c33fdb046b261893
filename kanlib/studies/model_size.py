"""Model-size scaling: KAN beside a matched-parameter MLP across sizes, and DDP against FSDP per size.

Per size: parameters, step time, peak memory, the tensor memory of a step, parameters per byte (of the tensor
memory where recorded, else of the peak memory; and of the analytic model state) and time per parameter; with both
parallelisms measured, FSDP's peak memory and step against DDP's. The published claim is judged in two parts:
parameters per byte of tensor memory, which any machine decides, and the step time, which needs the paper's GPUs.
Guidelines: the size beyond which memory rather than step time limits a process, and the size from which FSDP
lowers the peak memory per process.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kanlib.analysis import claims, fmt, groups, stats, style
from kanlib.analysis.context import Context, Goals, disturbed_why, unanswered
from kanlib.analysis.explorer import View
from kanlib.analysis.section import StudyAnalysis
from kanlib.analysis.style import go, make_subplots
from kanlib.analysis.table import Table

NAME = SECTION = RECORDS = "model_size"
TITLE = "Model-size scaling (KAN vs matched-parameter MLP; DDP vs FSDP)"
PUBLISHED = "a parameters-per-byte trend across model sizes"
PUBLISHED_MEMORY = "parameters per byte of memory rise with model size"
MIN_SIZES = 4
"""Sizes a line needs before the parameters-per-byte claim is judged on it: with two or three, a fixed cost (the
batch, the framework's buffers) amortised over the first sizes reads as a trend that may not go on."""
PUBLISHED_FSDP = "not studied (DDP only)"
PUBLISHED_TIME = "time scales unfavourably with model size"
UNFAVOURABLE_SLOPE = 0.9
"""Step time 'scales unfavourably' when its log-log slope against the parameter count is at least this."""
AXES = ("model", "widths", "grid_size")
SWEPT = ("model", "widths", "grid_size", "parallelism")
EXPLORER = View(x=("n_params", "grid_size", "depth", "global_batch"), series=("parallelism",))
FSDP_MARGIN = 0.05
"""FSDP pays where its peak memory per process is lower than DDP's by more than this fraction."""
MIN_GROWTH = 0.05
"""A budget is extrapolated only along a fit that grows by at least this fraction over the measured sizes."""
PARALLELISM_STYLE = {"ddp": dict(dash="solid", open=False), "fsdp": dict(dash="dashdot", open=True)}


def design(df: pd.DataFrame) -> groups.Design:
    """How this study's records split (:func:`kanlib.analysis.groups.design`)."""
    return groups.design(df, NAME, AXES, SWEPT)


SIZE_AXES = ("widths", "grid_size")
"""What varies along one line of sizes; everything else that differs (model, parallelism, placement, batch, host
allocator, ...) names another line."""


def line_fields(t: Table, drop=()) -> list[str]:
    """The fields of :func:`table` that name one line of sizes (less ``drop``): the model, every other group field
    but the size axes, and the placement (for ``nnodes`` and ``nproc_per_node``). Rows that differ in any of them
    are never fitted, compared or described together: a line mixing DDP at 880 parameters with FSDP at 42,880
    had read as one model's step time growing 3.57 to 23.6 ms."""
    fields = ["model"] + t.group_fields(drop=SIZE_AXES + groups.PLACEMENT_AXES) + ["placement"]
    return [f for f in dict.fromkeys(fields) if f not in drop and f in t.data]


def size_lines(t: Table, col: str, drop=(), extra=()):
    """``(key, rows)`` per line of sizes (:func:`line_fields`, less ``drop``, and ``extra`` columns of ``t.data``
    that split a line further, e.g. ``per_byte_of``) whose ``col`` is finite, sorted by the parameter count;
    ``t.data`` may be a subset of the table's rows (e.g. :func:`fsdp_table`'s)."""
    d = t.data
    if d.empty:
        return
    for key, g in groups.groupby(d, line_fields(t, drop) + [c for c in extra if c in d]):
        g = g[np.isfinite(pd.to_numeric(g[col], errors="coerce").to_numpy(float))]
        yield key, g.sort_values("n_params", kind="stable")


def loglog_slope(g: pd.DataFrame, col: str) -> float:
    """The log-log slope of ``col`` against the parameter count over the rows of one line of sizes (NaN with fewer
    than two sizes): 1 = in proportion to the parameters."""
    if g["n_params"].nunique() < 2:
        return float("nan")
    return float(np.polyfit(np.log(g["n_params"].to_numpy(float)), np.log(g[col].to_numpy(float)), 1)[0])


def line_label(key: dict) -> str:
    """``kan 1x2`` for a line of sizes, with every other field of the line named (``kan 1x2, parallelism=fsdp``)."""
    rest = {k: v for k, v in key.items() if k not in ("model", "placement")}
    head = " ".join(str(key[k]) for k in ("model", "placement") if k in key)
    return ", ".join(p for p in (head, groups.group_label(rest)) if p)


def table(df: pd.DataFrame, n_boot: int = stats.N_BOOT, seed: int = stats.SEED) -> Table:
    """Model-size scaling: per (group, model, widths, grid size) the parameter count, median step time
    with its interval, peak memory, the median tensor memory of a step (``tensor_peak_bytes``, NaN where no run
    recorded it), ``params_per_byte = n_params / tensor_peak_bytes`` where recorded, else ``n_params /
    peak_mem_bytes`` (``per_byte_of`` names which: ``tensor memory``, or the peak memory's kind, e.g. the resident
    set), ``params_per_state_byte = n_params / model_state_bytes`` and ``time_per_param_s = step_time / n_params``.
    Groups: every other config field that differs (parallelism, placement, batch, ...).
    """
    df, dropped = groups.valid(groups.with_placement(df), "step_time_s")
    d = groups.groups_of(df, NAME, AXES, SWEPT)
    keys = list(dict.fromkeys(d.groups + [k for k in ("model", "widths", "grid_size", "spline_order",
                                                      "nnodes", "nproc_per_node") if k in df]))
    rows = []
    for key, g in groups.groupby(df, keys):
        st, lo, hi = stats.median_ci(g["step_time_s"].to_numpy(float), n_boot, seed)
        n = int(g["n_params"].iloc[0])
        mem, mem_lo, mem_hi = stats.median_ci(g["peak_mem_bytes"].to_numpy(float), n_boot, seed)
        state = float(g["model_state_bytes"].iloc[0]) if "model_state_bytes" in g else np.nan
        tensor = pd.to_numeric(g["tensor_peak_bytes"], errors="coerce") if "tensor_peak_bytes" in g else None
        tensor = float(tensor.median()) if tensor is not None and (tensor > 0).any() else np.nan
        per, of = (tensor, "tensor memory") if np.isfinite(tensor) else (mem, _peak_kind(g))
        val = pd.to_numeric(g["final_val_loss"], errors="coerce") if "final_val_loss" in g else pd.Series([np.nan])
        rows.append({**key, "placement": groups.placement_of(key["nnodes"], key["nproc_per_node"]), "n_runs": len(g),
                     "world_size": int(key["nnodes"]) * int(key["nproc_per_node"]),
                     "final_val_loss": float(val.median()) if val.notna().any() else np.nan,
                     "n_params": n, "depth": len(key["widths"]) - 1 if "widths" in key else np.nan,
                     "step_time_s": st, "step_time_lo": lo, "step_time_hi": hi,
                     "peak_mem_bytes": mem, "peak_mem_lo": mem_lo, "peak_mem_hi": mem_hi, "model_state_bytes": state,
                     "tensor_peak_bytes": tensor, "params_per_byte": n / per if per > 0 else np.nan, "per_byte_of": of,
                     "params_per_state_byte": n / state if state > 0 else np.nan,
                     "time_per_param_s": st / n if n > 0 else np.nan})
    out = pd.DataFrame(rows)
    if not out.empty:
        out = out.sort_values(["model", "n_params"], kind="stable").reset_index(drop=True)
    return groups.finish(out, d, dropped, "step_time_s")


def _peak_kind(g: pd.DataFrame) -> str:
    """What a group's peak memory measured, in words: ``resident set`` (CPU) or ``allocator peak`` (CUDA)."""
    kinds = {str(k) for k in g.get("peak_mem_kind", pd.Series(dtype=str)).dropna()}
    return ("resident set" if any("rss" in k for k in kinds) else "allocator peak" if any("cuda" in k for k in kinds)
            else "peak memory")


def table_of(ctx: Context) -> Table:
    """:func:`table` of the study's records, once per build."""
    return ctx.cached((NAME, "table"), lambda: table(ctx.runs(RECORDS).data))


def fsdp_table(size: Table, margin: float = FSDP_MARGIN) -> pd.DataFrame:
    """Per model size measured under both DDP and FSDP (rows of :func:`table` that differ
    only in ``parallelism``): peak memory per process (``peak_mem_ddp``, ``peak_mem_fsdp``, ratio
    ``mem_ratio = fsdp / ddp``), step time (``step_ddp_s``, ``step_fsdp_s``, ``step_ratio``), the analytic
    per-process state (``state_ddp_bytes``: parameters + gradients + optimizer state of the whole model;
    ``state_fsdp_bytes``: that divided by the world size, what sharding keeps per process), the final
    validation losses of both, and ``pays`` = FSDP's measured peak memory below DDP's by more than
    ``margin`` (a relative fraction). Empty when no size has both."""
    s = size.data
    if s.empty or "parallelism" not in s or s["parallelism"].nunique() < 2:
        return pd.DataFrame()
    keys = size.group_fields(drop=("parallelism",))
    keys = list(dict.fromkeys(keys + [c for c in ("model", "widths", "grid_size", "spline_order", "nnodes",
                                                  "nproc_per_node") if c in s]))
    rows = []
    for key, g in groups.groupby(s, keys):
        ddp, fsdp = g[g["parallelism"] == "ddp"], g[g["parallelism"] == "fsdp"]
        if ddp.empty or fsdp.empty:
            continue
        a, b = ddp.iloc[0], fsdp.iloc[0]
        w = int(a["world_size"])
        rows.append({**key, "placement": a["placement"], "world_size": w, "n_params": int(a["n_params"]),
                     "peak_mem_ddp": a["peak_mem_bytes"], "peak_mem_fsdp": b["peak_mem_bytes"],
                     "mem_ratio": b["peak_mem_bytes"] / a["peak_mem_bytes"], "step_ddp_s": a["step_time_s"],
                     "step_fsdp_s": b["step_time_s"], "step_ratio": b["step_time_s"] / a["step_time_s"],
                     "state_ddp_bytes": a["model_state_bytes"], "state_fsdp_bytes": a["model_state_bytes"] / w,
                     "val_loss_ddp": a.get("final_val_loss", np.nan), "val_loss_fsdp": b.get("final_val_loss", np.nan),
                     "pays": bool(b["peak_mem_bytes"] < (1 - margin) * a["peak_mem_bytes"])})
    out = pd.DataFrame(rows)
    if not out.empty:
        out = out.sort_values(["model", "n_params"], kind="stable").reset_index(drop=True)
    return out


def fsdp_pays_from(table: pd.DataFrame, model: str = "kan") -> int | None:
    """The smallest parameter count of ``model`` from which FSDP pays (:func:`fsdp_table`'s ``pays``) at
    that size and at every larger measured size; None when the data show no such size."""
    t = table[table["model"] == model].sort_values("n_params") if not table.empty else table
    best = None
    for n, pays in zip(reversed(t["n_params"].tolist()), reversed(t["pays"].tolist())):
        if not pays:
            break
        best = int(n)
    return best


# -- figures -------------------------------------------------------------------------------------
def figure(table: Table, title: str = "Model-size scaling") -> go.Figure:
    """KAN against matched-parameter MLP: step time, peak memory, parameters per byte and time per
    parameter against the parameter count (log-log), one colour per model in all four panels (the
    first model's line is drawn wider, so a line hidden under another's still shows)."""
    fig = make_subplots(rows=2, cols=2, subplot_titles=("Step time (ms)", "Peak memory (MiB)",
                                                        "Parameters per byte (tensor memory)",
                                                        "Time per parameter (ns)"))
    models = sorted(table.data["model"].unique())
    other = [f for f in table.group_fields(drop=("model",)) if f not in ("grid_size", "widths")]
    panels = [((1, 1), "step_time_s", 1e3), ((1, 2), "peak_mem_bytes", 1 / 2**20),
              ((2, 1), "params_per_byte", 1.0), ((2, 2), "time_per_param_s", 1e9)]
    not_drawn = []
    for key, g in groups.groupby(table.data, ["model"] + other):
        m = key["model"]
        g = g.sort_values("n_params")
        label = groups.group_label(key, other)
        if len(g) < 2:
            not_drawn.append(f"{m} {label}: one size only".strip())
            continue
        hover = [f"{m} widths={list(w)} grid={gs}<br>{n:,} parameters" for w, gs, n in
                 zip(g["widths"], g["grid_size"], g["n_params"])]
        width = 4 if m == models[0] else 2
        for (r, c), col, scale in panels:
            err = style.error_bars(g.assign(**{col: g[col]}), col, "step_time_lo", "step_time_hi") \
                if col == "step_time_s" else {}
            if err:
                err["error_y"]["array"] = [v * scale for v in err["error_y"]["array"]]
                err["error_y"]["arrayminus"] = [v * scale for v in err["error_y"]["arrayminus"]]
            fig.add_trace(go.Scatter(x=g["n_params"], y=g[col] * scale, mode="lines+markers",
                                     name=f"{m} {label}".strip(), legendgroup=str(m), showlegend=False,
                                     line=dict(color=style.model_color(m), width=width),
                                     marker=dict(symbol=style.symbols(g), size=9, color=style.model_color(m)),
                                     hovertext=hover, **err), r, c)
    style.legend_key(fig, models, style.drawn_placements(fig, table.data))
    fig.update_xaxes(type="log", title_text="parameters")
    fig.update_yaxes(type="log")
    for (r, c), y in zip(((1, 1), (1, 2), (2, 1), (2, 2)), ("step time (ms)", "peak memory (MiB)",
                                                           "parameters per byte (1/B)",
                                                           "step time per parameter (ns)")):
        style.axis_titles(fig, None, y, r, c)
    fig.update_layout(title=title, template=style.TEMPLATE, height=720)
    return style.with_meta(fig, not_drawn=not_drawn)


def fsdp_figure(table: pd.DataFrame, title: str = "FSDP against DDP per model size", by=()) -> go.Figure:
    """Per model size (:func:`fsdp_table`): measured peak memory per process and step time
    under DDP (solid line, filled markers) and FSDP (dash-dot line, open markers), and the analytic
    per-process state (thin dotted lines: the whole model's under DDP, a 1/N shard under FSDP).
    Colour: model; marker: placement; one line per model, placement and each field of ``by`` (the other fields
    that name a line of sizes, :func:`fsdp_lines`), named in its hover name."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Peak memory per process (MiB)", "Step time (ms)"))
    for key, g in groups.groupby(table, list(dict.fromkeys(["model", "placement", *by]))):
        m, p = key["model"], key["placement"]
        p = line_label(key).removeprefix(f"{m} ")
        g = g.sort_values("n_params")
        for par in ("ddp", "fsdp"):
            st = PARALLELISM_STYLE[par]
            sym = style.placement_symbol(key["placement"]) + ("-open" if st["open"] else "")
            mode = "lines+markers" if len(g) > 1 else "markers"
            common = dict(mode=mode, legendgroup=str(m), showlegend=False, name=f"{m} {p} {par}",
                          line=dict(color=style.model_color(m), dash=st["dash"]),
                          marker=dict(symbol=sym, size=10, color=style.model_color(m)))
            fig.add_trace(go.Scatter(x=g["n_params"], y=g[f"peak_mem_{par}"] / 2**20, **common), 1, 1)
            fig.add_trace(go.Scatter(x=g["n_params"], y=g[f"step_{par}_s"] * 1e3, **common), 1, 2)
            if len(g) > 1:
                fig.add_trace(go.Scatter(x=g["n_params"], y=g[f"state_{par}_bytes"] / 2**20, mode="lines",
                                         name=f"{m} {p} {par} analytic state", legendgroup=str(m), showlegend=False,
                                         line=dict(color=style.model_color(m), dash="dot", width=1)), 1, 1)
    grey = style.GREY
    style.legend_key(fig, sorted(table["model"].unique()), sorted(set(table["placement"]), key=groups.placement_key),
                     extra=[("DDP: solid line, filled marker", dict(mode="lines+markers", line=dict(color=grey),
                                                                   marker=dict(symbol="circle", color=grey))),
                            ("FSDP: dash-dot line, open marker", dict(mode="lines+markers",
                                                                     line=dict(color=grey, dash="dashdot"),
                                                                     marker=dict(symbol="circle-open", color=grey))),
                            ("dotted: analytic state per process", dict(mode="lines",
                                                                        line=dict(color=grey, dash="dot")))])
    fig.update_xaxes(type="log", title_text="parameters")
    fig.update_yaxes(type="log")
    style.axis_titles(fig, None, "peak memory per process (MiB)", 1, 1)
    style.axis_titles(fig, None, "step time (ms)", 1, 2)
    fig.update_layout(title=title, template=style.TEMPLATE, height=440)
    return fig


def _fsdp_display(fs: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "model": fs["model"], "widths": fs["widths"].map(fmt.value), "placement": fs["placement"],
        "parameters": fs["n_params"].map(lambda v: f"{v:,}"),
        "peak DDP (MiB)": fs["peak_mem_ddp"].map(fmt.mib), "peak FSDP (MiB)": fs["peak_mem_fsdp"].map(fmt.mib),
        "FSDP / DDP memory": fs["mem_ratio"].map(lambda v: f"{v:.2f}"),
        "state per process DDP / FSDP (analytic)": [f"{fmt.nbytes(a)} / {fmt.nbytes(b)}" for a, b in
                                                    zip(fs["state_ddp_bytes"], fs["state_fsdp_bytes"])],
        "step DDP (ms)": fs["step_ddp_s"].map(fmt.ms), "step FSDP (ms)": fs["step_fsdp_s"].map(fmt.ms),
        "FSDP step vs DDP": fs["step_ratio"].map(fmt.slower_faster),
        "val loss DDP / FSDP": [f"{a:.4g} / {b:.4g}" for a, b in zip(fs["val_loss_ddp"], fs["val_loss_fsdp"])],
        "FSDP pays": fs["pays"].map({True: "yes", False: "no"})})


def fsdp_lines(t: Table, fs: pd.DataFrame):
    """``(key, rows)`` of :func:`fsdp_table` ``fs`` (of :func:`table` ``t``) per line of sizes: the model, the
    placement and every other field but the parallelism (:func:`line_fields`); rows differing in any are never one
    answer."""
    yield from size_lines(t.with_data(fs), "mem_ratio", drop=("parallelism",))


def _add_fsdp(a: StudyAnalysis, fs: pd.DataFrame, records: pd.DataFrame) -> None:
    kinds = sorted({str(v) for v in records.get("peak_mem_kind", pd.Series(dtype=str)).dropna()})
    by = line_fields(a.table.with_data(fs), drop=("parallelism",))
    a.add_figure("fsdp", fsdp_figure(fs, by=by), (
        "Peak memory per process and step time of each size under DDP and FSDP (same placement), with the "
        "analytic state per process (whole model under DDP, a 1/N shard under FSDP). See where FSDP's measured "
        f"memory drops below DDP's and what its step costs. Peak memory here: {', '.join(kinds) or 'unknown'}"
        + (" (the process's resident set: the framework's fixed footprint hides the sharded state at small "
           "sizes)." if any("rss" in k for k in kinds) else ".")))
    a.add_table("fsdp", _fsdp_display(fs), f"DDP against FSDP per size (FSDP pays: its peak memory per process is "
                                           f"more than {FSDP_MARGIN:.0%} below DDP's)")
    for key, g in fsdp_lines(a.table, fs):
        m, n = line_label(key), fsdp_pays_from(g, key["model"])
        a.lines.append(f"{m}: FSDP starts to pay from {n:,} parameters." if n else
                       f"{m}: the data show no size where FSDP pays (largest measured: "
                       f"{int(g['n_params'].max()):,} parameters, FSDP/DDP peak memory "
                       f"{g.sort_values('n_params')['mem_ratio'].iloc[-1]:.2f}).")
    a.extra["fsdp"] = fs


def analyze(ctx: Context) -> StudyAnalysis:
    """The table, the memory and time figure (DDP runs only when FSDP was measured too) and, with both
    parallelisms, the FSDP figure, table and a sentence per model."""
    t = table_of(ctx)
    d = t.data
    both = "parallelism" in d and d["parallelism"].nunique() > 1
    size_only = t.with_data(d[d["parallelism"] == "ddp"], [f for f in t.groups if f != "parallelism"]) if both else t
    a = StudyAnalysis(NAME, table=t)
    fig = figure(size_only)
    fallback = sorted(set(d["per_byte_of"]) - {"tensor memory"}) if "per_byte_of" in d else []
    a.add_figure("memory_time", fig, (
        "Step time, peak memory, parameters per byte and time per parameter against the parameter "
        "count, KAN beside an MLP with the same parameter count (one colour per model in every panel"
        + ("; DDP runs only, FSDP below" if both else "") + "). See how "
        "much more time a KAN parameter costs than an MLP parameter, and whether parameters per byte rise with "
        "size. Parameters per byte are of the tensor memory of a step (parameters, gradients, optimizer state, "
        "batch and activations, as the allocator counts them)"
        + (f"; where a size has none recorded, of its {' or '.join(fallback)}, which on CPU the framework dominates "
           "at small sizes" if fallback else "") + ". Peak memory is the process's: on CPU its resident set, "
        "dominated by the framework at small sizes." + style.not_drawn(fig)))
    fs = fsdp_table(t)
    if not fs.empty:
        _add_fsdp(a, fs, ctx.runs(RECORDS).data)
    return a


def display_table(t: Table) -> pd.DataFrame:
    """Per size: parameters, step time, peak memory, tensor memory, parameters per byte (of the tensor memory, or
    of the peak memory named where no tensor memory was recorded), time per parameter."""
    d = t.data
    if d.empty:
        return pd.DataFrame()
    cols = {f: d[f].map(fmt.value) for f in t.group_fields(drop=("model", "widths", "grid_size"))}
    out = {"model": d["model"], **cols, "widths": d["widths"].map(fmt.value), "grid": d["grid_size"],
           "placement": d["placement"], "runs": d["n_runs"], "parameters": d["n_params"].map(lambda v: f"{v:,}"),
           "step (ms)": fmt.ci_column(d, "step_time_s", fmt.ms, "step_time_lo", "step_time_hi"),
           "peak memory (MiB)": d["peak_mem_bytes"].map(lambda v: f"{v / 2**20:,.1f}"),
           "tensor memory (MiB)": d["tensor_peak_bytes"].map(lambda v: f"{v / 2**20:,.2f}" if v > 0 else "-"),
           "params per byte": [f"{v:.3g}" + ("" if of == "tensor memory" else f" (of the {of})")
                               for v, of in zip(d["params_per_byte"], d["per_byte_of"])],
           "params per byte (model state)": d["params_per_state_byte"].map(lambda v: f"{v:.3g}"),
           "time per parameter (ns)": d["time_per_param_s"].map(lambda v: f"{v * 1e9:.3g}")}
    return pd.DataFrame(out).reset_index(drop=True)


def finding(a: StudyAnalysis) -> list[dict]:
    """The parameters-per-byte trend per line of sizes (of the tensor memory, or of the peak memory named where
    none was recorded), the step time's, and where FSDP pays."""
    if a.empty or a.table is None or a.table.empty:
        return []
    parts, fallback = [], False
    for key, g in size_lines(a.table, "params_per_byte", extra=("per_byte_of",)):
        if g["n_params"].nunique() < 2:
            continue
        slope = loglog_slope(g, "params_per_byte")
        trend = "rising" if slope > 0.05 else "falling" if slope < -0.05 else "flat"
        of = key.get("per_byte_of", "tensor memory")
        fallback |= of != "tensor memory"
        label = line_label({k: v for k, v in key.items() if k != "per_byte_of"})
        parts.append(f"{label}: {g['params_per_byte'].iloc[0]:.3g} to {g['params_per_byte'].iloc[-1]:.3g} "
                     f"parameters per byte of {of} from {int(g['n_params'].iloc[0]):,} to "
                     f"{int(g['n_params'].iloc[-1]):,} parameters ({trend}, log-log slope {slope:.2f})")
    t = a.table.data
    rss = t[t["per_byte_of"] == "resident set"] if "per_byte_of" in t else t.iloc[:0]
    if fallback and len(rss):  # a CPU process's peak resident set, not the memory the parameters take
        parts.append(f"per byte of the resident set is an artefact on CPU: "
                     f"{fmt.mib(rss['peak_mem_bytes'].min())}-{fmt.mib(rss['peak_mem_bytes'].max())} MiB whatever "
                     f"the size, so parameters per byte rise with the parameters alone")
    out = [{"study": SECTION, "topic": "Parameters per byte against model size",
            "ours": "; ".join(parts) or "fewer than two sizes per model", "published": PUBLISHED}]
    tparts = []
    for key, g in size_lines(a.table, "step_time_s"):
        if g["n_params"].nunique() < 2:
            continue
        slope = loglog_slope(g, "step_time_s")
        tparts.append(f"{line_label(key)}: "
                      f"{g['step_time_s'].iloc[0] * 1e3:.3g} to {g['step_time_s'].iloc[-1] * 1e3:.3g} ms from "
                      f"{int(g['n_params'].iloc[0]):,} to {int(g['n_params'].iloc[-1]):,} parameters "
                      f"(log-log slope {slope:.2f}: {'at least' if slope >= 0.9 else 'less than'} in proportion)")
    out.append({"study": SECTION, "topic": "Step time against model size", "ours": "; ".join(tparts) or
                "fewer than two sizes per model", "published": PUBLISHED_TIME})
    fs = a.extra.get("fsdp")
    if fs is not None and not fs.empty:
        parts = []
        for key, g in fsdp_lines(a.table, fs):
            m, n = line_label(key), fsdp_pays_from(g, key["model"])
            top = g.sort_values("n_params").iloc[-1]
            parts.append(f"{m}: FSDP pays from {n:,} parameters" if n else
                         f"{m}: no measured size where FSDP pays (at {int(top['n_params']):,} parameters its peak "
                         f"memory per process is {top['mem_ratio']:.2f}x DDP's, its step "
                         f"{fmt.slower_faster(top['step_ratio'])})")
        out.append({"study": SECTION, "topic": "FSDP against DDP: where sharding pays", "ours": "; ".join(parts),
                    "published": PUBLISHED_FSDP})
    return out


# -- guideline -------------------------------------------------------------------------------------
def memory_or_time_limit(size: pd.DataFrame, memory_budget_bytes: float, step_time_budget_s: float,
                         model: str = "kan") -> dict:
    """Affine fits ``mem = m0 + m1 P`` and ``time = t0 + t1 P`` over the model-size points of
    ``model``; ``P_mem`` and ``P_time`` are the parameter counts at which each budget is reached.
    Memory is the limit beyond ``P_mem`` when ``P_mem < P_time``, else time is. Points with a
    non-finite or non-positive time or memory are not used. A budget is extrapolated only along a fit that grows
    by ``MIN_GROWTH`` over the measured sizes and, where the smallest and largest sizes have ``MIN_RUNS`` runs or
    more (``n_runs``, ``*_lo``/``*_hi`` of :func:`table`), whose largest size's interval lies above the smallest's;
    else ValueError says which quantity stayed flat."""
    t = size[size["model"] == model]
    ok = [stats.meets(m, 0) and stats.meets(s, 0) for m, s in zip(t["peak_mem_bytes"], t["step_time_s"])]
    t = t[ok]
    if t["n_params"].nunique() < 2:
        raise ValueError(f"model-size guideline needs at least 2 {model} sizes with valid time and memory, "
                         f"got {t['n_params'].nunique()}")
    p = t["n_params"].to_numpy(float)
    m1, m0 = np.polyfit(p, t["peak_mem_bytes"].to_numpy(float), 1)
    t1, t0 = np.polyfit(p, t["step_time_s"].to_numpy(float), 1)
    # A budget is extrapolated only along a fit that grows measurably over the measured sizes (by at least
    # MIN_GROWTH of its value at the smallest): a CPU process's resident set, which the framework dominates at
    # small sizes, moves by noise, and a near-flat fit would put the limit anywhere.
    # Where the smallest and the largest size each have an interval (MIN_RUNS runs or more), the growth must also
    # clear the noise: the largest size's interval lies wholly above the smallest's (a one-run point is decided on
    # its value: over three default studies the KAN's resident set, flat within 1 MB in theory, "grew" 5% in one).
    span = p.max() - p.min()
    ends = t.loc[[t["n_params"].idxmin(), t["n_params"].idxmax()]]
    runs = pd.to_numeric(ends["n_runs"], errors="coerce") if "n_runs" in ends else pd.Series([1, 1])
    with_intervals = bool((runs >= stats.MIN_RUNS).all())

    def clears_noise(col: str) -> bool:
        lo, hi = f"{col}_lo", f"{col}_hi"
        if not with_intervals or lo not in ends or hi not in ends:
            return True
        return bool(ends[lo].iloc[1] > ends[hi].iloc[0])

    flat = [name for name, slope, icpt, col in (("peak memory", m1, m0, "peak_mem"), ("step time", t1, t0, "step_time"))
            if not (slope * span > MIN_GROWTH * abs(icpt + slope * p.min()) and clears_noise(col))]
    if flat:
        raise ValueError(f"{' and '.join(flat)} of {model} did not grow measurably (by {MIN_GROWTH:.0%}) with the "
                         f"parameter count over the measured sizes ({int(p.min()):,} to {int(p.max()):,} parameters"
                         f"{', beyond the 95% intervals of their runs' if with_intervals else ''}), so no limit is "
                         f"extrapolated; measure larger sizes")
    p_mem = (memory_budget_bytes - m0) / m1 if m1 > 0 else float("inf")
    p_time = (step_time_budget_s - t0) / t1 if t1 > 0 else float("inf")
    limit = "memory" if p_mem < p_time else "time"
    return {"model": model, "p_mem": float(p_mem), "p_time": float(p_time), "limit": limit,
            "limit_params": float(min(p_mem, p_time)), "bytes_per_param": float(m1),
            "seconds_per_param": float(t1)}


def _limits(t: Table, goals: Goals, rows: list, text: list, left_out: pd.DataFrame | None = None) -> None:
    """Per group and model: the size beyond which memory rather than step time limits a process; unanswered where
    fewer than two sizes are left because the runs of the others were disturbed (``left_out``,
    :meth:`kanlib.analysis.context.Context.left_out`)."""
    question = "model size beyond which memory, not time, limits"
    for key, g in groups.groupby(t.data, t.group_fields(drop=("model", "widths", "grid_size"))):
        for model in sorted(set(g["model"])):
            label = groups.model_label({"model": model, **key})
            try:
                lim = memory_or_time_limit(g, goals.memory_budget_bytes, goals.step_time_budget_s, model)
            except ValueError as e:
                left = groups.select_records(left_out, {**key, "model": model}) \
                    if left_out is not None and len(left_out) else pd.DataFrame()
                left = left[~left["n_params"].isin(set(g.loc[g["model"] == model, "n_params"]))] if len(left) else left
                if len(left) and g.loc[g["model"] == model, "n_params"].nunique() < 2:
                    answer = unanswered(f"every run of {left['n_params'].nunique()} size(s) was disturbed", left)
                    text.append(f"{label}: no limit can be given: {answer.split(': ', 2)[2]} ({disturbed_why(left)}).")
                else:
                    answer = f"not resolved: {e}"
                    text.append(f"{label}: {e}.")
                rows.append({"question": question, "group": label, "answer": answer, "value": np.nan,
                             "basis": NAME})
                continue
            other = "time" if lim["limit"] == "memory" else "memory"
            other_p = lim["p_time"] if lim["limit"] == "memory" else lim["p_mem"]
            text.append(f"{label}: with {fmt.nbytes(goals.memory_budget_bytes)} and {goals.step_time_budget_s:g} s "
                        f"per step, {lim['limit']} limits a process first, at about {lim['limit_params']:.3g} "
                        f"parameters ({other} would allow {other_p:.3g}; {lim['bytes_per_param']:.3g} B and "
                        f"{lim['seconds_per_param']:.3g} s per parameter).")
            rows.append({"question": question, "group": label,
                         "answer": (f"memory limits first: at {lim['p_mem']:.3g} params" if lim["limit"] == "memory"
                                    else f"time limits first: at {lim['p_time']:.3g} params"),
                         "value": lim["limit_params"], "basis": NAME})


def _fsdp_answers(t: Table, records: pd.DataFrame, rows: list, text: list) -> None:
    """Per line of sizes (model, placement and every other field but the parallelism, :func:`fsdp_lines`): the size
    from which FSDP lowers the peak memory per process (and at every larger size)."""
    table = fsdp_table(t)
    if table.empty:
        return
    kind = groups.unique_text(records, "peak_mem_kind")
    for key, g in fsdp_lines(t, table):
        model, p = key["model"], key["placement"]
        n = fsdp_pays_from(g, model)
        top = g.sort_values("n_params").iloc[-1]
        if n is None:
            answer = (f"no measured size: at the largest ({int(top['n_params']):,} parameters) FSDP's peak memory "
                      f"per process is {top['mem_ratio']:.2f}x DDP's and its step "
                      f"{fmt.slower_faster(top['step_ratio'])}")
            why = (" On CPU the peak is the process's resident set, which the framework dominates at these sizes "
                   f"(analytic state: {fmt.nbytes(top['state_ddp_bytes'])} under DDP, "
                   f"{fmt.nbytes(top['state_fsdp_bytes'])} per process under FSDP)."
                   if "rss" in kind else "")
            text.append(f"{line_label(key)}: the data show no size where FSDP pays: {answer}.{why}")
        else:
            r = g[g["n_params"] == n].iloc[0]
            answer = (f"from {n:,} parameters: peak memory per process {r['mem_ratio']:.2f}x DDP's, step "
                      f"{fmt.slower_faster(r['step_ratio'])}")
            text.append(f"{line_label(key)}: FSDP starts to pay {answer} (and at every larger size measured).")
        rows.append({"question": f"{p}: model size from which FSDP lowers peak memory per process",
                     "group": groups.model_label({k: v for k, v in key.items() if k != "placement"}),
                     "answer": answer, "value": float(n) if n else np.nan, "basis": NAME})


def guideline(ctx: Context, goals: Goals) -> tuple[list[dict], list[str]]:
    """The size beyond which memory rather than step time limits a process (per group and model), and the size
    from which FSDP lowers the peak memory per process (per model)."""
    t = table_of(ctx)
    rows, text = [], []
    _limits(t, goals, rows, text, ctx.left_out(RECORDS))
    _fsdp_answers(t, ctx.runs(RECORDS).data, rows, text)
    return rows, text


def time_slope(t) -> float:
    """Log-log slope of the median step time against the parameter count over a model-size table's sizes (one line
    of sizes at a time, :func:`size_lines`: nothing but the size differs along it; the median of the slopes):
    1 = time in proportion to the parameters; NaN with fewer than two sizes."""
    slopes = [loglog_slope(g, "step_time_s") for _, g in size_lines(t, "step_time_s")]
    slopes = [v for v in slopes if np.isfinite(v)]
    return float(np.median(slopes)) if slopes else float("nan")


def judge(a: StudyAnalysis, machine: dict, other: str, guidelines=None, ctx=None) -> dict:
    """The verdict on the hardware-dependent part of the published model-size scaling, the step time: its log-log
    slope against the parameters (:func:`time_slope`); not comparable on a machine unlike the paper's (``other``).
    Parameters per byte are judged apart (:func:`judge_memory`)."""
    decides = "decides: how the step time grows with the parameters (hardware-dependent)"
    slope = time_slope(a.table)
    num = f"step time log-log slope {slope:.2f} against parameters" if np.isfinite(slope) else "one size only"
    if other:
        return {"verdict": claims.NOT_COMPARABLE, "number": num, "why": f"{decides}; {other}"}
    if not np.isfinite(slope):
        return {"verdict": "untested", "number": num, "why": f"{decides}; needs two model sizes"}
    return claims.verdict(slope >= UNFAVOURABLE_SLOPE, num, f"{decides}; step time grows at least in proportion to "
                          "the parameters", f"{decides}; step time grows slower than the parameters")


def memory_lines(t: Table) -> list[dict]:
    """Per line of sizes (:func:`size_lines`: DDP and FSDP, placements, batches never mixed) with a tensor memory
    recorded: ``{"label", "sizes", "first", "last", "rises", "slope"}``: the number of sizes, parameters per byte of
    tensor memory at the smallest and the largest, whether they rise from every size to the next, and the log-log
    slope of the tensor bytes against the parameters (below 1: bytes grow slower than the parameters)."""
    out = []
    for key, g in size_lines(t, "tensor_peak_bytes"):
        g = g[g["tensor_peak_bytes"] > 0]
        if g.empty:
            continue
        per = (g["n_params"] / g["tensor_peak_bytes"]).to_numpy(float)
        out.append({"label": line_label(key), "sizes": int(g["n_params"].nunique()), "first": float(per[0]),
                    "last": float(per[-1]), "rises": bool(len(per) > 1 and (np.diff(per) > 0).all()),
                    "slope": loglog_slope(g, "tensor_peak_bytes")})
    return out


def judge_memory(a: StudyAnalysis, machine: dict, other: str, guidelines=None, ctx=None) -> dict:
    """The hardware-independent part of the published model-size scaling: parameters per byte of tensor memory
    (``tensor_peak_bytes``: what a step's tensors take, as the allocator counts them, on CPU as on GPU) rise with
    the model's size. On every line of sizes with at least :data:`MIN_SIZES` sizes (:func:`memory_lines`):
    confirmed when parameters per byte rise from each size to the next on every such line, contradicted when they
    fall somewhere. The rule is a rise at every step, not a fitted slope below 1: the claim is that they rise, and
    a step's tensor bytes are the same from run to run (the allocations of a fixed program), so a fall between two
    sizes is a fact, not noise. Untested without tensor memory (records written before it was measured) or with
    fewer than :data:`MIN_SIZES` sizes on every line. Any machine decides it (``other`` does not apply)."""
    decides = ("decides: whether parameters per byte of tensor memory rise with model size (any machine: the bytes "
               "the tensors take); not the step time")
    lines = memory_lines(a.table) if a.table is not None else []
    judged = [x for x in lines if x["sizes"] >= MIN_SIZES]
    if not judged:
        most = max((x["sizes"] for x in lines), default=0)
        return {"verdict": "untested", "number": f"tensor memory at {most} size(s) per line" if lines else
                "no tensor memory recorded", "why": f"{decides}; needs tensor memory (tensor_peak_bytes) at "
                f"{MIN_SIZES} or more sizes along a line of sizes"}
    num = "; ".join(f"{x['label']}: {x['first']:.3g} to {x['last']:.3g} parameters per byte over {x['sizes']} sizes "
                    f"(tensor bytes' log-log slope {x['slope']:.2f})" for x in judged)
    short = [x["label"] for x in lines if x["sizes"] < MIN_SIZES]
    rest = f" ({len(short)} line(s) with fewer than {MIN_SIZES} sizes not judged: {', '.join(short)})" if short else ""
    falls = [x["label"] for x in judged if not x["rises"]]
    return claims.verdict(not falls, num, f"{decides}; they rise from every size to the next on every line{rest}",
                          f"{decides}; they fall between two sizes on {', '.join(falls)}{rest}")


CLAIMS = (claims.Claim("Model-size scaling: parameters per byte of tensor memory", PUBLISHED_MEMORY, judge_memory,
                       NAME, test_with=""),
          claims.Claim("Model-size scaling: step time", PUBLISHED_TIME, judge, NAME))
"""The published claims this study answers, the model-size scaling in two parts: parameters per byte of tensor
memory, which any machine decides, and the step time, which needs the paper's hardware."""
