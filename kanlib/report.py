"""Study analyses for the companion notebooks, and the report of the study.

``analyze(out_dir, study)`` loads the study's records, computes its table (kanlib.results), figures
(kanlib.plots), further tables (``tables``) and a caption per figure and table saying what to see; with
no records it carries the message "no records ..." instead of failing. Two more analyses are not
studies of their own: :func:`published_setup` (the calibrated model beside the published 8-GPU result)
and :func:`extrapolation` (predicted scaling to thousands of GPUs, notebook 06). ``build_report(out_dir)``
writes ``out_dir/report.html``: the findings first, one line each with its 95% interval beside the
published study's numbers, then the guidelines, each study's figures with captions and trimmed
tables (units, readable numbers), a methods section (machine, backend, torch, commit, configs,
repeats, how each quantity is measured) and links to the raw records. Every path in it is relative to
the report's folder; plotly.js is embedded once and nothing is loaded from the network (no CDN, no
MathJax).

The communication analysis reads the collective-benchmark records of the same folder
(kanlib.collbench.load_bench): the link constants fitted on them (kanlib.commmodel), each point's
leave-one-out error, the known-signal check (injected against recovered emulated link), transfer
against waiting in the DDP hook's time, and the parity of predicted and measured DDP steps. Without
benchmark records it says so and fits nothing (the DDP hook times mix transfer and waiting).
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kanlib import plots, records, results

STUDY_TITLES = {
    "strong_scaling": "Strong scaling (fixed global batch)",
    "weak_scaling": "Weak scaling (fixed per-process batch)",
    "communication": "Communication: overhead, the calibrated link model, data-parallel options",
    "model_size": "Model-size scaling (KAN vs matched-parameter MLP; DDP vs FSDP)",
    "time_to_accuracy": "Time to accuracy (training to a target validation loss)",
    "compounding": "Compounding: KAN kernel x data parallelism",
}
EXTRA_TITLES = {
    "published": "The published setup (8 GPUs = 4 nodes x 2) through the calibrated model",
    "extrapolation": "Extrapolation to thousands of GPUs",
}
"""Analyses that are not studies of their own: they combine the studies' records with the model."""

# The published study's numbers that the findings stand beside (as the study reports them).
PUBLISHED = {
    "strong_scaling": "speedup 5.97x, efficiency 74.7% at 8 GPUs over 4 nodes (4x2)",
    "weak_scaling": "a drop in efficiency from 1 to several GPUs, then stable",
    "communication": "communication overhead 1.3%-6.1% of the step",
    "model_size": "a parameters-per-byte trend across model sizes",
    "calibration": "not done: the overhead was attributed to algorithm choice and inter-node latency unmeasured",
    "options": "plain DDP only",
    "fsdp": "not studied (DDP only)",
    "time_to_accuracy": "not measured: step throughput only",
    "compounding": "claimed complementary (operator-level x data-parallel), not measured together",
    "published": "5.97x / 74.7% / 1.3-6.1% measured on the published cluster",
    "extrapolation": "not extrapolated",
}

LONG_TABLE_ROWS = 20
"""Tables longer than this are folded (``<details>``) in the report."""

EXTRAPOLATION_PARAMS = "extrapolation.json"
"""Where notebook 06 keeps its parameters under out_dir, for the report to show the same extrapolation."""

MEASUREMENT_DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "measurement.md")


@dataclass
class StudyAnalysis:
    """One study's records, derived table, figures, further tables and their captions (empty with a
    message when no records). ``tables`` hold display-ready frames (units in the column names,
    readable numbers); ``lines`` are sentences the analysis states (checks, fits, what is missing)."""

    study: str
    records: pd.DataFrame | None = None
    table: pd.DataFrame | None = None
    figures: dict[str, go.Figure] = field(default_factory=dict)
    message: str = ""
    extra: dict = field(default_factory=dict)
    captions: dict[str, str] = field(default_factory=dict)
    out_dir: str = ""
    code: str = "newest"
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    table_captions: dict[str, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.records is None

    def summary(self) -> pd.DataFrame:
        """The table trimmed to the columns that matter, with units and readable numbers."""
        return display_table(self.study, self.table) if self.table is not None else pd.DataFrame()

    def show(self) -> None:
        """Display the message, the trimmed table, every figure with its caption, the further tables
        with theirs and the analysis' sentences (figures use the renderers of
        :func:`kanlib.plots.use_offline_renderers`, so they survive export)."""
        from IPython.display import HTML, Markdown, display

        plots.use_offline_renderers()
        if self.message:
            display(Markdown(self.message))
        if self.table is not None and self.study in STUDY_TITLES:
            display(HTML(self.summary().to_html(index=False, escape=True)))
        for name, fig in self.figures.items():
            fig.show()
            if self.captions.get(name):
                display(Markdown(f"*{self.captions[name]}*"))
        for name, t in self.tables.items():
            if self.table_captions.get(name):
                display(Markdown(f"**{self.table_captions[name]}**"))
            display(HTML(t.to_html(index=False, escape=True)))
        if self.lines:
            display(Markdown("\n".join(f"- {html.escape(s)}" for s in self.lines)))
        for line in self.extra.get("fits", []):
            print(line)

    def save(self, fig_dir: str) -> list[str]:
        """Write each figure as an offline HTML file ``<fig_dir>/<study>_<name>.html``."""
        return [plots.save_html(fig, os.path.join(fig_dir, f"{self.study}_{name}.html"))
                for name, fig in self.figures.items()]

    def save_figures(self, fig_dir: str = "") -> list[str]:
        """:meth:`save` into ``fig_dir`` (empty: ``<out_dir>/figures``) and print where each file went."""
        paths = self.save(fig_dir or os.path.join(self.out_dir, "figures"))
        print("\n".join(paths) if paths else f"no figures written ({self.message})")
        return paths

    def explore(self) -> None:
        """Display the explorer over every record under ``out_dir``, opened on this study, with a
        static copy of its first view (or the reason there is nothing to explore)."""
        if self.empty:
            print(f"nothing to explore: {self.message}")
            return
        plots.show_explorer(results.load_records(self.out_dir, code=self.code), self.study)

    def html(self) -> str:
        """This analysis as an HTML fragment of the report (figures drawn by the page's plotly.js)."""
        body = f"<p class='note'>{html.escape(self.message)}</p>"
        if self.empty and not self.figures and not self.tables:
            return body
        for name, fig in self.figures.items():
            body += fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False)
            body += f"<p class='caption'>{html.escape(self.captions.get(name, ''))}</p>"
        if self.table is not None and self.study in STUDY_TITLES:
            body += self.summary().to_html(index=False, classes="table", border=0)
        for name, t in self.tables.items():
            cap = html.escape(self.table_captions.get(name, name))
            if len(t) > LONG_TABLE_ROWS:  # long tables (every benchmark point, every run) fold away
                body += (f"<details><summary><b>{cap}</b> ({len(t)} rows)</summary>"
                         f"{t.to_html(index=False, classes='table', border=0)}</details>")
            else:
                body += f"<h3>{cap}</h3>" + t.to_html(index=False, classes="table", border=0)
        if self.lines:
            body += "<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in self.lines) + "</ul>"
        return body


# -- formatting ------------------------------------------------------------------------------
def _ms(v) -> str:
    return f"{v * 1e3:.3g}" if np.isfinite(v) else "n/a"


def _ci_text(v, lo, hi, fmt) -> str:
    if not np.isfinite(v):
        return "n/a"
    if np.isfinite(lo) and np.isfinite(hi) and (lo != v or hi != v):
        return f"{fmt(v)} [{fmt(lo)}, {fmt(hi)}]"
    return fmt(v)


def _pct(v) -> str:
    return f"{v:.0%}" if np.isfinite(v) else "n/a"


def _pct1(v) -> str:
    return f"{v:.1%}" if np.isfinite(v) else "n/a"


def _x(v) -> str:
    return f"{v:.2f}x" if np.isfinite(v) else "n/a"


def _sec(v) -> str:
    return f"{v:.3g}" if np.isfinite(v) else "n/a"


def _us(v) -> str:
    return f"{v * 1e6:.3g}" if v is not None and np.isfinite(v) else "n/a"


def _mib(v) -> str:
    return f"{v / 2**20:,.1f}" if v is not None and np.isfinite(v) else "n/a"


def _signed_pct(v) -> str:
    return f"{v:+.2%}" if v is not None and np.isfinite(v) else "n/a"


def _value(v) -> str:
    if isinstance(v, tuple):
        return str(list(v))
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _group_cols(table: pd.DataFrame, drop=()) -> dict:
    return {f: table[f].map(_value) for f in table.attrs.get("group_fields", []) if f in table and f not in drop}


def display_table(study: str, t: pd.DataFrame) -> pd.DataFrame:
    """``t`` (a table of kanlib.results) as the columns a reader needs, formatted: times in ms,
    fractions in %, speedups as x, 95% intervals in brackets."""
    if t is None or t.empty:
        return pd.DataFrame()
    cols = _group_cols(t)
    if study == "strong_scaling":
        out = {**cols, "placement": t["placement"], "runs": t["n_runs"],
               "step time (ms)": [_ci_text(v, a, b, _ms) for v, a, b in
                                  zip(t["step_time_s"], t["step_time_s_lo"], t["step_time_s_hi"])],
               "speedup": [_ci_text(v, a, b, _x) for v, a, b in zip(t["speedup"], t["speedup_lo"], t["speedup_hi"])],
               "efficiency": [_ci_text(v, a, b, _pct) for v, a, b in
                              zip(t["efficiency"], t["efficiency_lo"], t["efficiency_hi"])],
               "Karp-Flatt serial fraction": [f"{v:.3f}" if np.isfinite(v) else "" for v in t["karp_flatt"]]}
    elif study == "weak_scaling":
        out = {**cols, "placement": t["placement"], "runs": t["n_runs"],
               "throughput (samples/s)": [_ci_text(v, a, b, lambda x: f"{x:,.0f}") for v, a, b in
                                          zip(t["throughput"], t["throughput_lo"], t["throughput_hi"])],
               "per process (samples/s)": [f"{v:,.0f}" for v in t["per_process_throughput"]],
               "E_w": [_ci_text(v, a, b, _pct) for v, a, b in
                       zip(t["weak_efficiency"], t["weak_efficiency_lo"], t["weak_efficiency_hi"])],
               "E_w vs first multi-process": [_pct(v) if np.isfinite(v) else "" for v in t["weak_efficiency_multi"]]}
    elif study == "communication":
        out = {**cols, "placement": t["placement"], "bucket (MiB)": t["bucket_cap_mb"].map(lambda v: f"{v:g}")}
        if t["nccl_algo"].nunique() > 1 or (t["nccl_algo"] != "").any():
            out["NCCL algorithm"] = t["nccl_algo"].replace("", "NCCL's choice")
        if t["comm_hook"].nunique() > 1:
            out["hook"] = t["comm_hook"]
        emu = (t["emulate_latency_s"] > 0) | (t["emulate_bandwidth_bytes_per_s"] > 0)
        if emu.any():
            out["emulated link"] = [f"{a * 1e6:g} us" + (f", {b / 1e9:g} GB/s" if b else "") if e else "none"
                                    for a, b, e in zip(t["emulate_latency_s"], t["emulate_bandwidth_bytes_per_s"], emu)]
        out.update({"runs": t["n_runs"],
                    "step (ms)": [_ci_text(v, a, b, _ms) for v, a, b in
                                  zip(t["t_allreduce_s"], t["t_allreduce_lo"], t["t_allreduce_hi"])],
                    "no-op step (ms)": [_ci_text(v, a, b, _ms) for v, a, b in
                                        zip(t["t_noop_s"], t["t_noop_lo"], t["t_noop_hi"])],
                    "all-reduce total (ms)": t["comm_total_s"].map(_ms),
                    "exposed (ms)": [_ms(v) + (" (clipped)" if c else "") for v, c in
                                     zip(t["exposed_s"], t["exposed_clipped"])],
                    "overhead": [_ci_text(v, a, b, _pct1) for v, a, b in
                                 zip(t["overhead_fraction"], t["overhead_lo"], t["overhead_hi"])],
                    "overlap": t["overlap_fraction"].map(_pct)})
    elif study == "model_size":
        cols = _group_cols(t, drop=("model", "widths", "grid_size"))
        out = {"model": t["model"], **cols, "widths": t["widths"].map(_value), "grid": t["grid_size"],
               "placement": t["placement"], "runs": t["n_runs"], "parameters": t["n_params"].map(lambda v: f"{v:,}"),
               "step (ms)": [_ci_text(v, a, b, _ms) for v, a, b in
                             zip(t["step_time_s"], t["step_time_lo"], t["step_time_hi"])],
               "peak memory (MiB)": t["peak_mem_bytes"].map(lambda v: f"{v / 2**20:,.1f}"),
               "params per byte (peak)": t["params_per_byte"].map(lambda v: f"{v:.3g}"),
               "params per byte (model state)": t["params_per_state_byte"].map(lambda v: f"{v:.3g}"),
               "time per parameter (ns)": t["time_per_param_s"].map(lambda v: f"{v * 1e9:.3g}")}
    elif study == "time_to_accuracy":
        weak = (t["series"] == "weak").any()
        out = {**cols, "series": [f"{s} ({'B' if s == 'strong' else 'per process'} {b})" for s, b in
                                  zip(t["series"], t["series_batch"])],
               "placement": t["placement"], "global batch": t["global_batch"],
               "reached": [f"{a}/{b}" for a, b in zip(t["n_reached"], t["n_runs"])],
               "steps to target": t["steps_to_target"].map(lambda v: f"{v:.0f}" if np.isfinite(v) else "n/a"),
               "samples to target": t["samples_to_target"].map(lambda v: f"{v:,.0f}" if np.isfinite(v) else "n/a"),
               "time to target (s)": [_ci_text(v, a, b, _sec) for v, a, b in
                                      zip(t["time_to_target_s"], t["time_to_target_lo"], t["time_to_target_hi"])],
               "step (ms)": t["step_time_s"].map(_ms),
               "time-to-target speedup": [_ci_text(v, a, b, _x) for v, a, b in
                                          zip(t["time_speedup"], t["time_speedup_lo"], t["time_speedup_hi"])],
               "step speedup": [_ci_text(v, a, b, _x) for v, a, b in
                                zip(t["step_speedup"], t["step_speedup_lo"], t["step_speedup_hi"])]}
        if weak:
            out["statistical efficiency"] = [_ci_text(v, a, b, _pct) if s == "weak" else "" for s, v, a, b in
                                             zip(t["series"], t["statistical_efficiency"],
                                                 t["statistical_efficiency_lo"], t["statistical_efficiency_hi"])]
        out["final val loss"] = t["final_val_loss"].map(lambda v: f"{v:.4g}" if np.isfinite(v) else "n/a")
        if np.isfinite(t["final_val_accuracy"].to_numpy(float)).any():
            out["final val accuracy (chance)"] = [f"{a:.1%} ({c:.1%})" if np.isfinite(a) else "n/a" for a, c in
                                                  zip(t["final_val_accuracy"], t["chance_accuracy"])]
    elif study == "compounding":
        out = {**cols, "kernel": [k if k == i else f"{i} (ran {k})" for k, i in zip(t["kernel"], t["kan_impl"])],
               "placement": t["placement"], "runs": t["n_runs"],
               "step (ms)": [_ci_text(v, a, b, _ms) for v, a, b in zip(t["step_time_s"], t["step_time_lo"],
                                                                       t["step_time_hi"])],
               "kernel speedup": [_ci_text(v, a, b, _x) for v, a, b in
                                  zip(t["kernel_speedup"], t["kernel_speedup_lo"], t["kernel_speedup_hi"])],
               "DDP speedup": [_ci_text(v, a, b, _x) for v, a, b in
                               zip(t["ddp_speedup"], t["ddp_speedup_lo"], t["ddp_speedup_hi"])],
               "product (if they compound)": t["product"].map(_x),
               "measured combination": [_ci_text(v, a, b, _x) for v, a, b in
                                        zip(t["measured"], t["measured_lo"], t["measured_hi"])],
               "measured / product": t["compounding"].map(lambda v: f"{v:.2f}" if np.isfinite(v) else "n/a"),
               "efficiency (baseline kernel's)": [f"{_pct(a)} ({_pct(b)})" for a, b in
                                                  zip(t["efficiency"], t["efficiency_ref"])]}
    else:
        raise ValueError(f"study: unknown value {study!r}; choose one of {', '.join(STUDY_TITLES)}")
    return pd.DataFrame(out).reset_index(drop=True)


# -- per study -------------------------------------------------------------------------------
def _not_drawn(fig) -> str:
    nd = (fig.layout.meta or {}).get("not_drawn") or []
    return f" Not drawn (a single point is no line): {'; '.join(nd)}." if nd else ""


def _strong(df: pd.DataFrame):
    t = results.scaling_table(df)
    figs = {"speedup_efficiency": plots.strong_scaling_figure(t)}
    caps = {"speedup_efficiency": (
        "Speedup T(1)/T(N) and efficiency S/N per group (subplot), medians over repeats with bootstrap 95% bars; "
        "the dotted line is ideal scaling. Colour: model; marker: placement (nodes x processes per node); solid "
        "lines stay on one node, dashed lines cross nodes. See how far each point falls below ideal, and whether "
        "crossing nodes costs more than adding processes on one node." + _not_drawn(figs["speedup_efficiency"]))}
    w = plots.work_figure(t)
    if w is not None:
        figs["work"] = w
        parts = []
        for p, g in t[t["world_size"] > 1].groupby("placement"):
            g = g.sort_values("work_per_process_s")
            if len(g) < 2:
                continue
            lo, hi = g.iloc[0], g.iloc[-1]
            way = "rises" if hi["efficiency"] > lo["efficiency"] else "does not rise"
            parts.append(f"at {p} it {way}, from {lo['efficiency']:.0%} at {lo['work_per_process_s'] * 1e3:.3g} ms to "
                         f"{hi['efficiency']:.0%} at {hi['work_per_process_s'] * 1e3:.3g} ms")
        caps["work"] = ("Efficiency against the work a process does per step, T(1)/N (log scale), one line per "
                        "placement across the work sizes. Efficiency should rise with work per process (little work "
                        "per process is latency-bound): " + "; ".join(parts) + ".")
    fits = []
    for key, g in results._groupby(t, [f for f in t.attrs.get("group_fields", []) if f in t]):
        s = results.fit_amdahl(g["world_size"], g["speedup"])
        if g["world_size"].nunique() < 2 or not np.isfinite(s):
            continue
        pred = ", ".join(f"{v:.2f}x" for v in results.amdahl_speedup([8, 64, 1024], s))
        fits.append(f"{results.group_label(key)}: Amdahl serial fraction {s:.4f}; predicted speedup at 8, 64, "
                    f"1024 processes: {pred}")
    return t, figs, caps, {"fits": fits}


def _weak(df: pd.DataFrame):
    t = results.weak_scaling_table(df)
    fig = plots.weak_scaling_figure(t)
    extra = ("" if (fig.layout.meta or {}).get("multi_row") else
             " Efficiency against the first multi-process point is not drawn: it needs two multi-process world sizes "
             "of one kind of placement; the table has it where defined.")
    caps = {"throughput_efficiency": (
        "Throughput and weak-scaling efficiency X(N)/(N X(1)) per group (per-process batch, ...), medians with "
        "bootstrap 95% bars. Colour: model; marker: placement; dashed lines cross nodes. See the drop from one "
        "process to the first multi-process point, and whether efficiency then stays flat." + extra
        + _not_drawn(fig))}
    return t, {"throughput_efficiency": fig}, caps, {}



def _emulated(df: pd.DataFrame) -> pd.Series:
    lat = df["emulate_latency_s"].fillna(0) if "emulate_latency_s" in df else pd.Series(0.0, index=df.index)
    bw = df["emulate_bandwidth_bytes_per_s"].fillna(0) if "emulate_bandwidth_bytes_per_s" in df else \
        pd.Series(0.0, index=df.index)
    return (lat > 0) | (bw > 0)


def _link_desc(lat: float, bw: float) -> str:
    if not (lat or bw):
        return "none"
    return f"{lat * 1e6:g} us" + (f", {bw / 1e9:g} GB/s" if bw else "")


def _fit_bench(out_dir: str, time_col: str):
    """``(bench rows, fits or None, sentence)`` for the collective-benchmark records under ``out_dir``."""
    from kanlib import collbench, commmodel

    bench = collbench.load_bench(out_dir)
    if bench.empty:
        return bench, None, ("No collective-benchmark records under this folder: the link model is not fitted "
                             "(the DDP hook times mix transfer and waiting for other ranks, so they are not fitted "
                             "instead); run the collective-benchmark section of 03_communication_overhead.")
    if time_col not in bench:
        raise ValueError(f"bench_time_col: {time_col!r} is not a collbench column (time_s, time_s_p10, time_s_p90)")
    try:
        fits = commmodel.fit_collbench(bench, time_col=time_col)
    except ValueError as e:
        return bench, None, f"The collective benchmark could not be fitted: {e}."
    what = "lower decile" if time_col == "time_s_p10" else "upper decile" if time_col == "time_s_p90" else "median"
    return bench, fits, (f"{bench['record_path'].nunique()} collective-benchmark runs, {len(bench)} sizes in all; "
                         f"the link model is fitted on each size's {what} over iterations ({time_col}).")


def links_table(fits: dict) -> pd.DataFrame:
    """The fitted link constants, one row per fit x link, display-ready: a constant the data do not
    resolve says why instead of a number."""
    from kanlib import commmodel

    t = commmodel.fit_table(fits)
    rows = []
    for _, r in t.iterrows():
        lat = (f"{r['alpha_s'] * 1e6:.3g} (+-{r['alpha_rel_se']:.0%})" if r["alpha_s"] is not None and
               np.isfinite(r["alpha_s"]) else f"not resolved: {r['alpha_why']}")
        bw = (f"{r['bandwidth_bytes_per_s'] / 1e9:.3g} (+-{r['beta_rel_se']:.0%})"
              if r["bandwidth_bytes_per_s"] is not None and np.isfinite(r["bandwidth_bytes_per_s"])
              else f"not resolved: {r['bandwidth_why']}")
        rows.append({"backend / device": f"{r['backend']} / {r['device']}", "algorithm": r["algo"],
                     "emulated link": _link_desc(r["emulate_latency_s"], r["emulate_bandwidth_bytes_per_s"]),
                     "link": r["link"], "latency (us)": lat, "bandwidth (GB/s)": bw, "points": r["n_points"],
                     "fit error (rel. RMS)": _pct1(r["rel_rmse"]), "leave-one-out error (rel. RMS)":
                     _pct1(r["loo_rel_rmse"])})
    return pd.DataFrame(rows)


def _points_table(fits: dict) -> pd.DataFrame:
    from kanlib import commmodel

    p = commmodel.fit_points(fits)
    if p.empty:
        return p
    return pd.DataFrame({
        "fit": [f"{a}, emulated {_link_desc(b, c)}" for a, b, c in
                zip(p["algo"], p["emulate_latency_s"], p["emulate_bandwidth_bytes_per_s"])],
        "placement": p["placement"], "link": p["link"], "bytes": p["size_bytes"].map(lambda v: f"{int(v):,}"),
        "measured (us)": p["time_s"].map(_us), "fitted (us)": p["pred_s"].map(_us),
        "left out (us)": p["loo_pred_s"].map(_us), "leave-one-out error": p["loo_rel_err"].map(_signed_pct)})


def calibration_check(fits: dict, tolerance: float = 0.2) -> tuple[pd.DataFrame, list[str]]:
    """The known-signal check: for each emulated link, what was injected beside what the fits recovered
    (the emulated fit minus the machine's own inter-node link), the relative error and whether it is
    within ``tolerance``; and one sentence per check."""
    from kanlib import commmodel

    rec = commmodel.recovered_links(fits)
    rows, lines = [], []
    for _, r in rec.iterrows():
        for what, inj, got, err in (("latency", r["emulate_latency_s"], r["recovered_latency_s"], r["latency_rel_err"]),
                                    ("bandwidth", r["emulate_bandwidth_bytes_per_s"],
                                     r["recovered_bandwidth_bytes_per_s"], r["bandwidth_rel_err"])):
            if not inj:
                if what == "bandwidth":
                    total = r["bandwidth_bytes_per_s"]
                    if got is None or not np.isfinite(got):
                        note = "none injected; none recovered"
                    elif total and np.isfinite(total) and got > 10 * total:  # 1/got is under a tenth of the link's
                        note = (f"none injected; the fits differ by a {got / 1e9:.3g} GB/s link in series, under a "
                                f"tenth of the emulated link's own inverse bandwidth: no measurable limit")
                    else:
                        note = (f"none injected, yet the fits differ by a {got / 1e9:.3g} GB/s link in series (a limit "
                                f"the emulation did not add: noise or load)")
                    lines.append(f"Emulated link {_link_desc(r['emulate_latency_s'], inj)} ({r['backend']}, "
                                 f"{r['algo']}): bandwidth {note}.")
                continue
            unit, scale = ("ms", 1e3) if what == "latency" else ("GB/s", 1e-9)
            ok = got is not None and np.isfinite(got) and abs(err) <= tolerance
            got_txt = f"{got * scale:.3g} {unit}" if got is not None and np.isfinite(got) else "not resolved"
            rows.append({"emulated link": _link_desc(r["emulate_latency_s"], r["emulate_bandwidth_bytes_per_s"]),
                         "backend / algorithm": f"{r['backend']} / {r['algo']}", "constant": what,
                         "injected": f"{inj * scale:.3g} {unit}", "recovered": got_txt,
                         "error": _signed_pct(err) if got is not None else "n/a",
                         f"within {tolerance:.0%}": "yes" if ok else "no", "note": r["why"] or ""})
            lines.append(f"Known-signal check ({r['backend']}, {r['algo']}): injected {what} {inj * scale:.3g} {unit}, "
                         f"recovered {got_txt}" + (f" ({err:+.1%})" if got is not None and np.isfinite(err) else "")
                         + f": {'within' if ok else 'NOT within'} {tolerance:.0%}"
                         + (f" ({r['why']})" if r["why"] else "") + ".")
    return pd.DataFrame(rows), lines


def _emulation_growth(recs: pd.DataFrame) -> pd.DataFrame:
    """Per placement and bucket size: the timed hook's time per step with and without the emulated link,
    its growth, and what the link injected (``emulated_s``): the growth should match on multi-node
    placements, and a single-node placement injects nothing."""
    timed = recs[recs["comm_hook"] == "timed"].copy()
    timed["emulated"] = _emulated(timed)
    if not timed["emulated"].any():
        return pd.DataFrame()
    rows = []
    for key, g in results._groupby(timed, ["placement", "bucket_cap_mb"]):
        plain, emu = g[~g["emulated"]], g[g["emulated"]]
        if plain.empty or emu.empty:
            continue
        for ekey, e in results._groupby(emu, ["emulate_latency_s", "emulate_bandwidth_bytes_per_s"]):
            c0 = float(np.nanmedian(pd.to_numeric(plain["comm_total_s"], errors="coerce")))
            c1 = float(np.nanmedian(pd.to_numeric(e["comm_total_s"], errors="coerce")))
            inj = float(np.nanmedian(pd.to_numeric(e["emulated_s"], errors="coerce"))) if "emulated_s" in e else np.nan
            rows.append({"placement": key["placement"], "bucket (MiB)": f"{key['bucket_cap_mb']:g}",
                         "emulated link": _link_desc(ekey["emulate_latency_s"], ekey["emulate_bandwidth_bytes_per_s"]),
                         "hook time, own link (ms)": _ms(c0), "hook time, emulated (ms)": _ms(c1),
                         "growth (ms)": _ms(c1 - c0), "injected (ms)": _ms(inj),
                         "growth / injected": f"{(c1 - c0) / inj:.2f}" if inj and np.isfinite(inj) else "n/a"})
    return pd.DataFrame(rows)


def _parity_table(parity: pd.DataFrame) -> pd.DataFrame:
    emu = _emulated(parity)
    opts = [results.option_label({f: (r[f] if f in r and pd.notna(r[f]) else v)
                                  for f, v in results.OPTION_FIELDS.items()}, results.PLAIN_BUCKET_MB)
            for _, r in parity.iterrows()]  # the bucket size has its own column
    return pd.DataFrame({
        "placement": parity["placement"], "option": opts, "bucket (MiB)": parity["bucket_cap_mb"].map(lambda v: f"{v:g}"),
        "emulated link": [_link_desc(a, b) if e else "none" for a, b, e in
                          zip(parity.get("emulate_latency_s", 0), parity.get("emulate_bandwidth_bytes_per_s", 0), emu)],
        "step measured (ms)": parity["step_time_s"].map(_ms), "step predicted (ms)": parity["pred_step_time_s"].map(_ms),
        "step error": parity["step_rel_err"].map(_signed_pct),
        "exposed measured (ms)": parity["exposed_s"].map(_ms),
        "exposed predicted (ms)": parity["pred_exposed_s"].map(_ms),
        "exposed error": parity["exposed_rel_err"].map(_signed_pct),
        "why not predicted": parity["why"].fillna("")})


def _transfer_waiting(recs: pd.DataFrame, fits: dict) -> pd.DataFrame:
    """Transfer vs waiting per placement, bucket size and emulated link, over plain timed DDP runs
    (no compression, no other option): nothing of different configurations is pooled."""
    from kanlib import commmodel

    plain = recs[recs["comm_hook"] == "timed"]
    for f, v in results.OPTION_FIELDS.items():
        if f in plain and f != "comm_hook":  # a record without the field predates it: plain DDP
            plain = plain[plain[f].isna() | (plain[f].map(results._hashable) == v)]
    tw = commmodel.transfer_waiting(plain, fits)
    if tw.empty:
        return tw
    tw["placement"] = [f"{p}, {c:g} MiB" + (f", emulated {_link_desc(a, b)}" if a or b else "")
                       for p, c, a, b in zip(tw["placement"], tw["bucket_cap_mb"], tw["emulate_latency_s"].fillna(0),
                                             tw["emulate_bandwidth_bytes_per_s"].fillna(0))]
    tw = tw[tw["transfer_s"].notna()]
    return commmodel.transfer_waiting_by_placement(tw) if not tw.empty else tw


def _options_display(o: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "option": o["option"], "placement": o["placement"], "bucket (MiB)": o["bucket_cap_mb"].map(lambda v: f"{v:g}"),
        "runs": o["n_runs"], "step (ms)": o["step_time_s"].map(_ms),
        "step / plain": o["step_time_ratio"].map(lambda v: f"{v:.2f}x" if np.isfinite(v) else "n/a"),
        "exposed (ms)": o["exposed_s"].map(_ms), "plain exposed (ms)": o["plain_exposed_s"].map(_ms),
        "val loss": o["val_loss"].map(lambda v: f"{v:.5g}" if np.isfinite(v) else "n/a"),
        "vs plain": o["val_loss_rel_delta"].map(_signed_pct),
        "convergence": ["harmed" if h else ("n/a" if not np.isfinite(d) else "kept") for h, d in
                        zip(o["harms_convergence"], o["val_loss_rel_delta"])]})


def _comm(df: pd.DataFrame, ctx: dict) -> dict:
    from kanlib import commmodel

    t = results.communication_table(df)
    plain = results.plain_ddp(t)
    figs = {"overhead": plots.communication_figure(plain if len(plain) else t)}
    caps = {"overhead": (
        "Per point (placement, bucket size, ...): step time split into compute with hidden communication (light) "
        "and exposed communication (solid), the total all-reduce time (hollow marker), and the exposed share of "
        "the step with its bootstrap 95% interval. See which placement and bucket size expose the least, and how "
        "much of the all-reduce hides behind the backward pass."
        + (" Plain DDP points only (the timed full-precision hook, no other option); the options follow below."
           if 0 < len(plain) < len(t) else ""))}
    tables, tcaps, lines, extra = {}, {}, [], {}
    recs = results._placement_cols(df)
    for c in ("emulate_latency_s", "emulate_bandwidth_bytes_per_s"):
        recs[c] = recs[c].fillna(0.0) if c in recs else 0.0
    time_col = ctx.get("bench_time_col", "time_s_p10")
    bench, fits, sentence = _fit_bench(ctx["out_dir"], time_col)
    lines.append(sentence)
    if not bench.empty:
        figs["collbench"] = plots.collbench_figure(bench, fits, time_col=time_col)
        caps["collbench"] = (
            "Collective benchmark (barrier before every all-reduce, so no waiting for a late rank): time, algbw = "
            "bytes/time and busbw = algbw x 2(N-1)/N against message size, per placement; dashed lines cross nodes, "
            "red ones go through the emulated link; dotted lines are the fitted model. See the latency floor at "
            "small sizes, the bandwidth plateau at large ones, and the emulated link's added latency.")
    if fits:
        extra["fits"] = fits
        tables["links"] = links_table(fits)
        tcaps["links"] = ("Fitted link constants per backend, algorithm and emulated link (non-negative relative "
                          "least squares; +- the relative standard error). A constant the data cannot resolve is "
                          "named so with the reason, never printed as 0.")
        tables["points"] = _points_table(fits)
        tcaps["points"] = "Every benchmark point: measured, fitted, and predicted with the point left out of the fit"
        cal, cal_lines = calibration_check(fits, ctx.get("calibration_tolerance", 0.2))
        lines += cal_lines
        if not cal.empty:
            tables["calibration"] = cal
            tcaps["calibration"] = "Known-signal check: the emulated link's injected constants against the recovered"
        grow = _emulation_growth(recs)
        if not grow.empty:
            tables["emulation"] = grow
            tcaps["emulation"] = ("DDP through the emulated link: the hook's time per step with and without it, beside "
                                  "what the link injected (growth below the injection: the emulated delay absorbed "
                                  "time the plain run spent waiting for the other rank)")
        parity = commmodel.validate_ddp(recs, fits)
        if not parity.empty:
            figs["parity"] = plots.parity_figure(parity)
            nd = (figs["parity"].layout.meta or {}).get("not_drawn") or []
            ok = parity[parity["pred_exposed_s"].notna()]
            caps["parity"] = (
                f"Every timed DDP run with a no-op twin ({len(parity)}): step time and exposed communication as the "
                f"model calibrated on the benchmark predicts them (its buckets, the twin's backward time) against "
                f"the measurement; on the dotted line the model is right. Median absolute error: step "
                f"{ok['step_rel_err'].abs().median():.0%}, exposed {ok['exposed_rel_err'].abs().median():.0%}."
                if len(ok) else "No timed DDP run could be predicted.")
            if nd:
                caps["parity"] += f" Not drawn (no prediction): {'; '.join(nd)}."
            tables["parity"] = _parity_table(parity)
            tcaps["parity"] = "Predicted against measured, per DDP run"
            extra["parity"] = parity
        tw = _transfer_waiting(recs, fits)
        if not tw.empty:
            figs["transfer_waiting"] = plots.transfer_waiting_figure(tw)
            caps["transfer_waiting"] = (
                "The timed hook's communication time per step (medians over plain timed runs) split into the "
                "transfer the benchmark predicts for the run's buckets and the rest, waiting for the other ranks "
                "(skew). A large waiting share means the hook time measures load imbalance, not the network.")
            extra["transfer_waiting"] = tw
            lines.append("Transfer vs waiting: " + "; ".join(
                f"{r['placement']}: {r['transfer_s'] * 1e3:.3g} ms transfer, {r['waiting_s'] * 1e3:.3g} ms waiting "
                f"({r['waiting_fraction']:.0%} of {r['comm_total_s'] * 1e3:.3g} ms)" for _, r in tw.iterrows()) + ".")
    opts = results.options_table(df, tolerance=ctx.get("val_loss_tolerance", 0.01))
    if not opts.empty and (~opts["is_plain"]).any():
        figs["options"] = plots.options_figure(opts)
        caps["options"] = (
            f"Step time, exposed communication and validation loss after the same samples of each data-parallel "
            f"option, relative to plain DDP (timed hook, no option, same placement) at the same point. A red outline "
            f"marks an option whose validation loss is more than {opts.attrs['tolerance']:.1%} above plain DDP's.")
        tables["options"] = _options_display(opts)
        tcaps["options"] = "Data-parallel options against plain DDP"
        extra["options"] = opts
        for _, r in opts[~opts["is_plain"] & ~opts["plain_missing"] & ~_emulated(opts)].iterrows():
            lines.append(f"{r['option']} at {r['placement']}: step {r['step_time_ratio']:.2f}x plain DDP, exposed "
                         f"{r['exposed_s'] * 1e3:.3g} ms vs {r['plain_exposed_s'] * 1e3:.3g} ms, validation loss "
                         f"{_signed_pct(r['val_loss_rel_delta'])}"
                         + (" (harms convergence)" if r["harms_convergence"] else "") + ".")
    return {"table": t, "figures": figs, "captions": caps, "extra": extra, "tables": tables, "table_captions": tcaps,
            "lines": lines}


def _size(df: pd.DataFrame, ctx: dict) -> dict:
    t = results.model_size_table(df)
    size_only = t[t["parallelism"] == "ddp"] if "parallelism" in t and t["parallelism"].nunique() > 1 else t
    if size_only is not t:
        size_only.attrs.update(t.attrs)
        size_only.attrs["group_fields"] = [f for f in t.attrs.get("group_fields", []) if f != "parallelism"]
    fig = plots.model_size_figure(size_only)
    caps = {"memory_time": (
        "Step time, peak memory, parameters per byte of peak memory and time per parameter against the parameter "
        "count, KAN beside an MLP with the same parameter count (one colour per model in every panel"
        + ("; DDP runs only, FSDP below" if size_only is not t else "") + "). See how "
        "much more time a KAN parameter costs than an MLP parameter, and whether parameters per byte rise with "
        "size. On CPU peak memory is the process's resident set, dominated by the framework at small sizes, so "
        "the two models' parameters-per-byte lines coincide there." + _not_drawn(fig))}
    out = {"table": t, "figures": {"memory_time": fig}, "captions": caps, "tables": {}, "table_captions": {},
           "lines": [], "extra": {}}
    fs = results.fsdp_table(t)
    if not fs.empty:
        out["figures"]["fsdp"] = plots.fsdp_figure(fs)
        kinds = sorted({str(v) for v in df.get("peak_mem_kind", pd.Series(dtype=str)).dropna()})
        out["captions"]["fsdp"] = (
            "Peak memory per process and step time of each size under DDP and FSDP (same placement), with the "
            "analytic state per process (whole model under DDP, a 1/N shard under FSDP). See where FSDP's measured "
            f"memory drops below DDP's and what its step costs. Peak memory here: {', '.join(kinds) or 'unknown'}"
            + (" (the process's resident set: the framework's fixed footprint hides the sharded state at small "
               "sizes)." if any("rss" in k for k in kinds) else "."))
        out["tables"]["fsdp"] = pd.DataFrame({
            "model": fs["model"], "widths": fs["widths"].map(_value), "placement": fs["placement"],
            "parameters": fs["n_params"].map(lambda v: f"{v:,}"),
            "peak DDP (MiB)": fs["peak_mem_ddp"].map(_mib), "peak FSDP (MiB)": fs["peak_mem_fsdp"].map(_mib),
            "FSDP / DDP memory": fs["mem_ratio"].map(lambda v: f"{v:.2f}"),
            "state per process DDP / FSDP (analytic)": [f"{_fmt_bytes(a)} / {_fmt_bytes(b)}" for a, b in
                                                        zip(fs["state_ddp_bytes"], fs["state_fsdp_bytes"])],
            "step DDP (ms)": fs["step_ddp_s"].map(_ms), "step FSDP (ms)": fs["step_fsdp_s"].map(_ms),
            "FSDP / DDP step": fs["step_ratio"].map(lambda v: f"{v:.2f}"),
            "val loss DDP / FSDP": [f"{a:.4g} / {b:.4g}" for a, b in zip(fs["val_loss_ddp"], fs["val_loss_fsdp"])],
            "FSDP pays": fs["pays"].map({True: "yes", False: "no"})})
        out["table_captions"]["fsdp"] = (f"DDP against FSDP per size (FSDP pays: its peak memory per process is more "
                                         f"than {fs.attrs['margin']:.0%} below DDP's)")
        for m, g in fs.groupby("model"):
            n = results.fsdp_pays_from(g, m)
            out["lines"].append(f"{m}: FSDP starts to pay from {n:,} parameters." if n else
                                f"{m}: the data show no size where FSDP pays (largest measured: "
                                f"{int(g['n_params'].max()):,} parameters, FSDP/DDP peak memory "
                                f"{g.sort_values('n_params')['mem_ratio'].iloc[-1]:.2f}).")
        out["extra"]["fsdp"] = fs
    return out


def _tta(df: pd.DataFrame, ctx: dict) -> dict:
    t = results.time_to_accuracy_table(df)
    curves = results.val_curves(df)
    figs, caps = {}, {}
    if len(curves):
        figs["curves"] = plots.tta_curves_figure(curves)
        caps["curves"] = ("Validation loss (evaluated every eval_every steps, outside the timed region) against "
                          "samples seen and against cumulative step time, one line per run; the dotted line is the "
                          "target. In strong mode (one global batch) the curves against samples coincide, so the "
                          "faster step reaches the target sooner; in weak mode a larger global batch may need more "
                          "samples.")
    if not t.empty:
        figs["speedup"] = plots.tta_speedup_figure(t)
        caps["speedup"] = ("Strong series: the time-to-target speedup beside the step speedup, per placement (they "
                           "should match: the same samples per step need the same steps). Weak series: statistical "
                           "efficiency samples(N0)/samples(N) per learning-rate rule; 1 means the larger batch needs "
                           "no more samples.")
    lines = []
    beyond_n0 = t[t["world_size"] > t.groupby(["series", "series_batch"])["world_size"].transform("min")] \
        if not t.empty else t
    for _, r in beyond_n0.iterrows():
        if r["series"] == "strong":
            lines.append(f"strong, global batch {r['series_batch']}, {r['placement']}: time-to-target speedup "
                         f"{_ci_text(r['time_speedup'], r['time_speedup_lo'], r['time_speedup_hi'], _x)} beside step "
                         f"speedup {_ci_text(r['step_speedup'], r['step_speedup_lo'], r['step_speedup_hi'], _x)}"
                         f" ({r['n_reached']}/{r['n_runs']} runs reached the target).")
        else:
            lines.append(f"weak, {r['series_batch']} per process, lr_rule {r.get('lr_rule', 'none')}, {r['placement']} "
                         f"(global batch {r['global_batch']}): statistical efficiency "
                         f"{_ci_text(r['statistical_efficiency'], r['statistical_efficiency_lo'], r['statistical_efficiency_hi'], _pct)}"
                         f", time-to-target speedup {_x(r['time_speedup'])}.")
    if curves.attrs.get("missing"):
        lines.append(f"{len(curves.attrs['missing'])} run(s) have no steps.csv: no curve.")
    return {"table": t if not t.empty else None, "figures": figs, "captions": caps, "lines": lines,
            "extra": {"curves": curves}, "note": "" if not t.empty else
            "No series: a strong or weak series needs one batch at two or more placements."}


def _compounding(df: pd.DataFrame, ctx: dict) -> dict:
    t = results.compounding_table(df)
    figs, caps, lines = {}, {}, []
    if not t.empty:
        figs["compounding"] = plots.compounding_figure(t)
        caps["compounding"] = (
            "Per placement and kernel path (what ran: kan_path): the measured speedup over the reference kernel on the "
            "smallest placement (bar, bootstrap 95% interval) beside the product of the kernel speedup and the "
            "reference kernel's DDP speedup (outline); right, each kernel's parallel efficiency. A bar below its "
            "outline, and a lower efficiency for a faster kernel, mean the faster kernel exposes communication.")
        for _, r in t[(t["world_size"] > 1) & (t["kernel"] != t["baseline_kernel"])].iterrows():
            lines.append(f"{r['kernel'] if not r['fell_back'] else r['kan_impl'] + ' (ran ' + r['kernel'] + ')'} at "
                         f"{r['placement']}: kernel {_x(r['kernel_speedup'])} x DDP {_x(r['ddp_speedup'])}; product "
                         f"{_x(r['product'])}, measured "
                         f"{_ci_text(r['measured'], r['measured_lo'], r['measured_hi'], _x)} (ratio "
                         f"{r['compounding']:.2f}); efficiency {_pct(r['efficiency'])} vs {_pct(r['efficiency_ref'])} "
                         f"with the {r['baseline_kernel']} kernel.")
        fb = t[t["fell_back"]]
        if not fb.empty:
            lines.append("Requested kernels that ran another path (grouped by what ran): " + ", ".join(
                sorted({f"{i} ran {k} at {p}" for i, k, p in zip(fb["kan_impl"], fb["kernel"], fb["placement"])})) + ".")
    return {"table": t if not t.empty else None, "figures": figs, "captions": caps, "lines": lines}


ANALYSIS_PARAMS = ("bench_time_col", "val_loss_tolerance", "calibration_tolerance")
"""The keyword parameters :func:`analyze` passes to the study analyses (the communication study reads them)."""

_STUDY_FUNCS = {"strong_scaling": "_strong", "weak_scaling": "_weak", "communication": "_comm", "model_size": "_size",
                "time_to_accuracy": "_tta", "compounding": "_compounding"}


def analyze(out_dir: str, study: str, code: str = "newest", **params) -> StudyAnalysis:
    """Load ``study``'s records under ``out_dir`` (code versions chosen by ``code``, see
    :func:`kanlib.results.load_records`) and derive its table, figures, further tables and captions.

    params (communication): ``bench_time_col`` (the collbench time the links are fitted on, default
    ``time_s_p10``: the lower decile, for a machine shared with other work; ``time_s`` is the median),
    ``val_loss_tolerance`` (relative; default 0.01) and ``calibration_tolerance`` (default 0.2)."""
    if study not in STUDY_TITLES:
        raise ValueError(f"study: unknown value {study!r}; choose one of {', '.join(STUDY_TITLES)}")
    unknown = sorted(set(params) - set(ANALYSIS_PARAMS))
    if unknown:
        raise ValueError(f"{unknown[0]}: not a parameter of the analyses; known: {', '.join(ANALYSIS_PARAMS)}")
    try:
        df = results.load_records(out_dir, study=study, code=code)
    except results.NoRecordsError as e:
        return StudyAnalysis(study, message=str(e), out_dir=out_dir, code=code)
    bad = df.attrs.get("bad", [])
    notes = [f"{len(df)} records of {study}."]
    if bad:
        notes.append(f"Skipped {len(bad)} unreadable: " + "; ".join(f"{os.path.basename(os.path.dirname(p))}/"
                                                                    f"{os.path.basename(p)}: {r}" for p, _, r in bad) + ".")
    if df.attrs.get("code_note"):
        notes.append(df.attrs["code_note"])
    ctx = {"out_dir": out_dir, "code": code, **params}
    fn = globals()[_STUDY_FUNCS[study]]
    try:
        out = fn(df, ctx) if study not in ("strong_scaling", "weak_scaling") else fn(df)
    except KeyError as e:  # e.g. a communication study without its no-op runs
        return StudyAnalysis(study, df, None, {}, " ".join(notes + [str(e.args[0])]), out_dir=out_dir, code=code)
    if isinstance(out, tuple):
        out = dict(zip(("table", "figures", "captions", "extra"), out))
    table = out.get("table")
    if table is not None and table.attrs.get("note"):
        notes.append(table.attrs["note"])
    if out.get("note"):
        notes.append(out["note"])
    return StudyAnalysis(study, df, table, out.get("figures", {}), " ".join(notes), out.get("extra", {}),
                         out.get("captions", {}), out_dir, code, out.get("tables", {}), out.get("table_captions", {}),
                         out.get("lines", []))


# -- the published setup and extrapolation (the model with these records) --------------------------
def measured_profile(out_dir: str, code: str = "newest", model: str = "kan"):
    """A compute profile from the single-process runs of ``model`` under ``out_dir``
    (kanlib.commmodel.profile_from_records): the strong-scaling study's when it has some (several
    widths and batches resolve a fixed per-step time), else any study's. ``(profile or None, sentence)``."""
    from kanlib import commmodel

    try:
        df = results.load_records(out_dir, code=code)
    except results.NoRecordsError as e:
        return None, f"no measured compute profile: {e}"
    ones = df[(df["world_size"] == 1) & (df.get("model", "kan") == model)]
    strong = ones[ones["study"] == "strong_scaling"]
    use = strong if len(strong) else ones
    if use.empty:
        return None, f"no measured compute profile: no single-process {model} run under this folder"
    prof = commmodel.profile_from_records(use, model)
    prof.source = f"measured here: {len(use)} single-process {model} runs of {', '.join(sorted(set(use['study'])))}"
    return prof, (f"Measured compute profile: {prof.seconds_per_sample_param:.3g} s per sample-parameter, fixed "
                  f"{prof.fixed_s * 1e3:.3g} ms per step, backward {prof.backward_fraction:.0%} of the step "
                  f"({prof.source}; device {_uniq(use, 'device_name')}).")


def _plain_fit(fits: dict | None):
    """The fit of the machine's own links (no emulation) to use for what-ifs: NCCL on CUDA first, else the
    first; None without fits."""
    if not fits:
        return None
    plain = {k: f for k, f in fits.items() if not (k[3] or k[4])}
    if not plain:
        return None
    key = sorted(plain, key=lambda k: (k[0] != "nccl", k[1] != "cuda", k[2] not in ("ring", "auto"), k))[0]
    return plain[key]


def published_setup(out_dir: str, code: str = "newest", preset_name: str = "a100-hdr", widths=(64, 256, 256, 1),
                    grid_size: int = 5, spline_order: int = 3, global_batch: int = 65536, bucket_cap_mb: float = 25.0,
                    bench_time_col: str = "time_s_p10") -> StudyAnalysis:
    """The model's prediction for the published shape (8 GPUs = 4 nodes x 2) beside the published
    5.97x / 74.7% / 1.3-6.1% (kanlib.presets.published_comparison), in up to three scenarios: the preset's
    compute and links (marked as a preset); the compute measured here with the preset's links; the
    compute and links measured here (the collective-benchmark fit). Tables: the comparison and the
    assumptions that move each prediction most."""
    from kanlib import presets

    a = StudyAnalysis("published", out_dir=out_dir, code=code)
    presets.preset(preset_name)  # an unknown name is refused before any work
    prof, prof_line = measured_profile(out_dir, code)
    _, fits, bench_line = _fit_bench(out_dir, bench_time_col)
    fit = _plain_fit(fits)
    kw = dict(widths=tuple(widths), grid_size=grid_size, spline_order=spline_order, global_batch=global_batch,
              bucket_cap_mb=bucket_cap_mb, preset_name=preset_name)
    scenarios = {f"preset {preset_name} (compute and links; a preset, not a measurement)": (None, None)}
    if prof is not None:
        scenarios[f"compute measured here, links of preset {preset_name}"] = (prof, None)
    if prof is not None and fit is not None:
        scenarios["compute and links measured here (collective-benchmark fit)"] = (prof, fit.model)
    rows, drivers = {}, []
    for name, (pr, model) in scenarios.items():
        try:
            r = presets.published_comparison(profile=pr, model=model, **kw)
        except ValueError as e:  # e.g. the measured fit has no inter-node link
            a.lines.append(f"{name}: no prediction: {e}.")
            continue
        rows[name] = r["table"].set_index("quantity")["predicted"]
        d = r["drivers"].head(4).copy()
        d.insert(0, "scenario", name)
        drivers.append(d)
        a.lines.append(f"{name}: {r['text']}")
        a.extra.setdefault("comparisons", {})[name] = r
    if rows:
        a.figures["comparison"] = plots.published_figure(a.extra["comparisons"])
        a.captions["comparison"] = (
            "The published shape (4 nodes x 2 GPUs) predicted in each scenario (bars) beside the published numbers "
            "(dotted lines; the shaded band is the published 1.3-6.1% overhead range). Preset scenarios come from "
            "specifications, not measurements; a gap means the assumptions differ from the published cluster's "
            "(the table below ranks which ones move the prediction most).")
        first = next(iter(a.extra["comparisons"].values()))["table"].set_index("quantity")
        table = pd.DataFrame({"quantity": first.index, "published": [
            f"{v:.2f}x" if "speedup" in q else (f"{v:.1%}" if isinstance(v, float) else v)
            for q, v in first["published"].items()]})
        for name, s in rows.items():
            table[name] = [f"{v:.2f}x" if "speedup" in q else f"{v:.1%}" for q, v in s.items()]
        a.tables["comparison"] = table
        a.table_captions["comparison"] = (
            f"The published shape through the model: {list(widths)} (G={grid_size}, k={spline_order}), global batch "
            f"{global_batch}, {bucket_cap_mb:g} MiB buckets, ring all-reduce, overlap with backward")
        dr = pd.concat(drivers, ignore_index=True)
        a.tables["drivers"] = pd.DataFrame({"scenario": dr["scenario"], "assumption changed": dr["assumption"],
                                            "efficiency": dr["efficiency"].map(_pct1),
                                            "change": dr["delta_efficiency"].map(_signed_pct),
                                            "overhead": dr["overhead_fraction"].map(_pct1)})
        a.table_captions["drivers"] = "The assumptions that move each prediction most (one changed at a time)"
    a.lines.insert(0, prof_line)
    a.lines.insert(1, bench_line if fit is not None else "Links: " + bench_line)
    a.message = ("Presets come from specifications and NCCL's tuning tables, not from measurements; the "
                 "measured scenarios use this folder's records.")
    a.records = pd.DataFrame() if rows else None
    return a


def extrapolation(out_dir: str, code: str = "newest", preset_name: str = "h100-ndr", kan_sizes=None,
                  bucket_caps_mb=(1.0, 25.0), algos=("ring", "tree"), target_efficiency: float = 0.8,
                  at_world_size: int = 1024, max_world_size: int = 4096, global_batch: int = 65536,
                  gpus_per_node: int = 0, source: str = "auto", bench_time_col: str = "time_s_p10",
                  remember: bool = False) -> StudyAnalysis:
    """Predicted efficiency and exposed communication from 1 to ``max_world_size`` GPUs for each KAN size
    (``kan_sizes``: lists of widths), bucket size and algorithm; where ring and tree cross; which sizes stay
    at or above ``target_efficiency`` at ``at_world_size``.

    source: ``measured`` (the collective-benchmark fit and compute profile of this folder), ``preset``
    (``preset_name``'s links and compute) or ``auto`` (measured links when the folder has collective-benchmark
    records, else the preset; measured compute when it has single-process runs, else the preset's).
    An algorithm the benchmark did not measure (tree on gloo) uses its formula on the measured links, said so.
    gpus_per_node: processes per node of the extrapolated cluster (0: the preset's, or the most the benchmark
    measured on one node). With measured links the measured strong-scaling points are overlaid beside the
    model's prediction for the same configuration (strong scaling at ``global_batch``). ``remember``:
    write these arguments to ``out_dir/extrapolation.json``, which :func:`build_report` reads, so the
    report shows what notebook 06 computed."""
    from dataclasses import replace

    from kanlib import commmodel, presets

    if source not in ("auto", "measured", "preset"):
        raise ValueError(f"source: unknown value {source!r}; choose auto, measured or preset")
    if not 0 < target_efficiency <= 1:
        raise ValueError(f"target_efficiency: must be in (0, 1], got {target_efficiency!r}")
    if at_world_size > max_world_size:
        raise ValueError(f"at_world_size: {at_world_size} is beyond max_world_size={max_world_size}")
    bad = [x for x in algos if x not in commmodel.ALGOS]
    if bad or not algos:
        raise ValueError(f"algos: unknown value(s) {bad or list(algos)}; choose from {', '.join(commmodel.ALGOS)}")
    kan_sizes = [list(w) for w in (kan_sizes or [[64, 256, 256, 1], [64, 1024, 1024, 1], [256, 4096, 4096, 1]])]
    args = dict(preset_name=preset_name, kan_sizes=kan_sizes, bucket_caps_mb=[float(c) for c in bucket_caps_mb],
                algos=list(algos), target_efficiency=target_efficiency, at_world_size=at_world_size,
                max_world_size=max_world_size, global_batch=global_batch, gpus_per_node=gpus_per_node, source=source,
                bench_time_col=bench_time_col)
    if remember:
        os.makedirs(out_dir, exist_ok=True)
        records.atomic_write_json(os.path.join(out_dir, EXTRAPOLATION_PARAMS), args)
    a = StudyAnalysis("extrapolation", out_dir=out_dir, code=code, extra={"params": args})
    p = presets.preset(preset_name)
    bench, fits, bench_line = _fit_bench(out_dir, bench_time_col)
    fit = _plain_fit(fits) if source != "preset" else None
    if source == "measured" and fit is None:
        raise ValueError(f"source: 'measured' needs collective-benchmark records under {out_dir} ({bench_line})")
    models, notes = {}, []
    if fit is not None:
        gpn = gpus_per_node or int(bench.loc[bench["nnodes"] == 1, "nproc_per_node"].max() or 1)
        measured_algos = {k[2]: f.model for k, f in fits.items() if not (k[3] or k[4]) and k[:2] == fit.key[:2]}
        for algo in algos:
            m = measured_algos.get(algo) or (measured_algos.get("auto") if algo == "ring" else None)
            if m is None:
                m = replace(fit.model, algo=algo, label=f"{algo} formula on the measured {fit.model.label} links")
                notes.append(f"{algo}: not measured by the benchmark; its formula on the measured links")
            models[algo] = m
        links = f"links measured here ({fit.model.label}: {_links_short(fit.model)})"
    else:
        gpn = gpus_per_node or p.gpus_per_node
        models = {algo: p.link_model(algo) for algo in algos}
        links = f"links of preset {preset_name} (a preset, not a measurement)"
    prof, prof_line = (None, "") if source == "preset" else measured_profile(out_dir, code)
    if prof is None:
        prof = p.compute_profile()
        prof_line = (prof_line + "; " if prof_line else "") + f"compute of preset {preset_name}: {prof.source}"
    sizes = {str(w): {"widths": w} for w in kan_sizes}
    try:
        table = commmodel.extrapolation_table(models, sizes, prof, bucket_caps_mb=tuple(float(c) for c in bucket_caps_mb),
                                              max_world_size=max_world_size, gpus_per_node=gpn,
                                              global_batch=global_batch)
    except ValueError as e:  # a link the extrapolated placements need is missing from the fit
        a.message = f"No extrapolation: {e}."
        return a
    a.extra.update(table=table, models=models, profile=prof, gpus_per_node=gpn)
    measured = _measured_points(out_dir, code, models.get("ring") or next(iter(models.values())), prof) \
        if fit is not None else pd.DataFrame()
    a.figures["efficiency"] = plots.extrapolation_figure(table, measured, target_efficiency)
    a.captions["efficiency"] = (
        f"Predicted strong-scaling efficiency and exposed communication share, 1 to {max_world_size} GPUs "
        f"({gpn} per node), global batch {global_batch}, for each KAN size (shade), algorithm (line style) and "
        f"bucket size (subplot pair); {links}; compute: {prof.source}. The dotted line is the target "
        f"{target_efficiency:.0%}. An optimistic bound: no stragglers, congestion or NIC sharing."
        + (" Filled markers: measured strong-scaling points; open: the model for the same configuration."
           if len(measured) else ""))
    above = commmodel.sizes_above(table, target_efficiency, at_world_size)
    a.tables["above"] = pd.DataFrame({
        "KAN": above["kan"], "parameters": above["n_params"].map(lambda v: f"{v:,}"), "algorithm": above["algo"],
        "bucket (MiB)": above["bucket_cap_mb"].map(lambda v: f"{v:g}"),
        f"efficiency at {at_world_size}": above["efficiency"].map(_pct1),
        "exposed (ms)": above["exposed_s"].map(_ms), f">= {target_efficiency:.0%}": above["above"].map(
            {True: "yes", False: "no"})})
    a.table_captions["above"] = f"Which sizes stay at or above {target_efficiency:.0%} at {at_world_size} GPUs"
    a.extra["above"] = above
    parts = []
    for kan, g in above.groupby("kan", sort=False):
        best = g.loc[g["efficiency"].idxmax()]
        how = f"{best['algo']}, {best['bucket_cap_mb']:g} MiB buckets: {best['efficiency']:.0%}"
        parts.append(f"{kan} {'stays above' if best['above'] else 'falls below'} ({'best ' if not best['above'] else ''}"
                     f"{how})")
    a.lines.append(f"At {at_world_size} GPUs and {target_efficiency:.0%} target efficiency: " + "; ".join(parts)
                   + f" ({links}; compute {prof.source}).")
    if "ring" in models and "tree" in models:
        cross = commmodel.ring_tree_crossover(models["ring"], models["tree"], [2 ** k for k in (10, 16, 20, 22, 25)],
                                              max_world_size, gpn)
        a.tables["crossover"] = pd.DataFrame({
            "message": cross["size_bytes"].map(_fmt_bytes),
            "tree faster from N": cross["crossover_world_size"].map(lambda v: "never" if v is None or v != v else
                                                                    f"{int(v)}"),
            "ring / tree there (us)": [f"{_us(r)} / {_us(t)}" for r, t in zip(cross["ring_s_at_crossover"],
                                                                             cross["tree_s_at_crossover"])],
            f"ring / tree at {max_world_size} (us)": [f"{_us(r)} / {_us(t)}" for r, t in
                                                       zip(cross["ring_s_at_max"], cross["tree_s_at_max"])]})
        a.table_captions["crossover"] = "Where tree all-reduce overtakes ring, per message size"
        a.extra["crossover"] = cross
    if len(measured):
        a.tables["measured"] = pd.DataFrame({"configuration": measured["label"], "placement": measured["placement"],
                                             "measured efficiency": measured["efficiency"].map(_pct1),
                                             "predicted": measured["pred_efficiency"].map(_pct1)})
        a.table_captions["measured"] = "Measured strong-scaling points beside the model's prediction for each"
    a.lines += [prof_line, bench_line] + notes
    a.message = (f"Extrapolation from {'measured links' if fit is not None else 'preset ' + preset_name}; presets are "
                 f"specifications, not measurements.")
    a.records = table
    return a


def _links_short(model) -> str:
    parts = []
    for name, link in model.links.items():
        lat = f"{link.raw_alpha_s * 1e6:.3g} us" + ("" if link.alpha_s is not None else " (unresolved)")
        bw = (f"{1 / link.raw_beta_s_per_byte / 1e9:.3g} GB/s" if link.raw_beta_s_per_byte > 0 else "no bandwidth term") \
            + ("" if link.bandwidth_bytes_per_s is not None else " (unresolved)")
        parts.append(f"{name} {lat}, {bw}")
    return "; ".join(parts)


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(b) < 1024 or unit == "GiB":
            return f"{b:.3g} {unit}"
        b /= 1024
    return f"{b:.3g} GiB"


def _measured_points(out_dir: str, code: str, model, prof) -> pd.DataFrame:
    """Measured strong-scaling efficiencies (N > 1) beside the model's prediction for the same widths,
    global batch, bucket size and placement (KAN and MLP models only)."""
    from kanlib import commmodel

    try:
        t = results.scaling_table(results.load_records(out_dir, study="strong_scaling", code=code))
    except results.NoRecordsError:
        return pd.DataFrame()
    recs = results._placement_cols(results.load_records(out_dir, study="strong_scaling", code=code))
    rows = []
    for _, r in t[t["world_size"] > 1].iterrows():
        sel = results.select_records(recs, {f: r[f] for f in t.attrs.get("group_fields", []) if f in r})
        sel = sel[sel["placement"] == r["placement"]]
        if sel.empty or sel["model"].iloc[0] not in ("kan", "mlp"):
            continue
        s = sel.iloc[0]
        try:
            pb = commmodel.kan_param_bytes(s["widths"], int(s["grid_size"]), int(s["spline_order"]), s["model"])
            pred = commmodel.predict_scaling(model, prof, pb, [1, int(r["world_size"])], int(r["nproc_per_node"]),
                                             global_batch=int(s["global_batch"]), bucket_cap_mb=float(s["bucket_cap_mb"]))
        except ValueError:
            continue
        rows.append({"label": f"{s['model']} {list(s['widths'])}, B={int(s['global_batch'])}", "placement": r["placement"],
                     "world_size": int(r["world_size"]), "efficiency": float(r["efficiency"]),
                     "pred_efficiency": float(pred["efficiency"].iloc[-1])})
    return pd.DataFrame(rows)


# -- findings --------------------------------------------------------------------------------
def findings(analyses: dict[str, StudyAnalysis]) -> list[dict]:
    """One finding per study: what these records show (with 95% intervals) beside the published
    study's number. Each is ``{"topic", "ours", "published", "study"}``."""
    out = []
    a = analyses.get("strong_scaling")
    if a is not None and not a.empty and a.table is not None and not a.table.empty:
        t = a.table
        n = int(t["world_size"].max())
        parts = []
        for p, g in t[t["world_size"] == n].groupby("placement"):
            r = g.sort_values("work_per_process_s").iloc[-1]  # the most work per process at that placement
            grp = results.group_label({f: r[f] for f in t.attrs.get("group_fields", []) if f in r})
            parts.append(f"{p}: speedup {_ci_text(r['speedup'], r['speedup_lo'], r['speedup_hi'], _x)}, efficiency "
                         f"{_ci_text(r['efficiency'], r['efficiency_lo'], r['efficiency_hi'], _pct)} ({grp})")
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
        out.append({"study": "strong_scaling", "topic": f"Strong scaling at the largest N ({n})",
                    "ours": "; ".join(parts) if n > 1 else "only N = 1 measured", "published": PUBLISHED["strong_scaling"]})
    a = analyses.get("weak_scaling")
    if a is not None and not a.empty and a.table is not None and not a.table.empty:
        t = a.table
        parts = []
        for p, g in t[t["world_size"] > 1].groupby("placement"):
            first = g[g["world_size"] == g["world_size"].min()]
            r = first.sort_values("local_batch").iloc[-1]
            parts.append(f"{p} (N={int(r['world_size'])}, {int(r['local_batch'])} samples/process): E_w "
                         f"{_ci_text(r['weak_efficiency'], r['weak_efficiency_lo'], r['weak_efficiency_hi'], _pct)}, "
                         f"a drop of {1 - r['weak_efficiency']:.0%}")
        stable = t.dropna(subset=["weak_efficiency_multi"])
        stable = stable[stable["world_size"] > stable.groupby("placement")["world_size"].transform("min")]
        if stable.empty:
            parts.append("stability after the drop not measurable here: one multi-process world size per placement")
        else:
            r = stable.sort_values("world_size").iloc[-1]
            parts.append(f"then {r['weak_efficiency_multi']:.0%} of the first multi-process point's efficiency at "
                         f"N={int(r['world_size'])} ({r['placement']})")
        out.append({"study": "weak_scaling", "topic": "Weak scaling: the drop, then stability",
                    "ours": "; ".join(parts) or "no multi-process point", "published": PUBLISHED["weak_scaling"]})
    a = analyses.get("communication")
    if a is not None and not a.empty and a.table is not None and not a.table.empty:
        t = a.table
        t = t[(t["comm_hook"] == "timed") & (t["emulate_latency_s"] == 0) & (t["emulate_bandwidth_bytes_per_s"] == 0)]
        t = t[np.isfinite(t["overhead_fraction"].to_numpy(float))]
        if not t.empty:
            lo, hi = t.loc[t["overhead_fraction"].idxmin()], t.loc[t["overhead_fraction"].idxmax()]

            def _pt(r):
                return (f"{_ci_text(r['overhead_fraction'], r['overhead_lo'], r['overhead_hi'], _pct1)} "
                        f"({r['placement']}, {r['bucket_cap_mb']:g} MiB)")

            ours = f"{_pt(lo)} to {_pt(hi)} over {len(t)} points"
            out.append({"study": "communication", "topic": "Communication overhead (exposed / step)", "ours": ours,
                        "published": PUBLISHED["communication"]})
    a = analyses.get("model_size")
    if a is not None and not a.empty and a.table is not None and not a.table.empty:
        parts = []
        for m, g in a.table.groupby("model"):
            g = g.sort_values("n_params")
            g = g[np.isfinite(g["params_per_byte"].to_numpy(float))]
            if g["n_params"].nunique() < 2:
                continue
            slope = np.polyfit(np.log(g["n_params"].to_numpy(float)), np.log(g["params_per_byte"].to_numpy(float)), 1)[0]
            trend = "rising" if slope > 0.05 else "falling" if slope < -0.05 else "flat"
            parts.append(f"{m}: {g['params_per_byte'].iloc[0]:.3g} to {g['params_per_byte'].iloc[-1]:.3g} parameters "
                         f"per byte from {int(g['n_params'].iloc[0]):,} to {int(g['n_params'].iloc[-1]):,} parameters "
                         f"({trend}, log-log slope {slope:.2f})")
        out.append({"study": "model_size", "topic": "Parameters per byte of peak memory against model size",
                    "ours": "; ".join(parts) or "fewer than two sizes per model", "published": PUBLISHED["model_size"]})
        fs = a.extra.get("fsdp")
        if fs is not None and not fs.empty:
            parts = []
            for m, g in fs.groupby("model"):
                n = results.fsdp_pays_from(g, m)
                top = g.sort_values("n_params").iloc[-1]
                parts.append(f"{m}: FSDP pays from {n:,} parameters" if n else
                             f"{m}: no measured size where FSDP pays (at {int(top['n_params']):,} parameters its peak "
                             f"memory per process is {top['mem_ratio']:.2f}x DDP's, its step {top['step_ratio']:.2f}x)")
            out.append({"study": "model_size", "topic": "FSDP against DDP: where sharding pays", "ours": "; ".join(parts),
                        "published": PUBLISHED["fsdp"]})
    out += _calibration_findings(analyses.get("communication"))
    a = analyses.get("time_to_accuracy")
    if a is not None and a.table is not None and not a.table.empty:
        t = a.table
        parts = []
        for (kind, batch), g in t.groupby(["series", "series_batch"], sort=True):
            r = g.sort_values("world_size").iloc[-1]
            if kind == "strong":
                parts.append(f"strong (B={batch}) at {r['placement']}: time-to-target speedup "
                             f"{_ci_text(r['time_speedup'], r['time_speedup_lo'], r['time_speedup_hi'], _x)} vs step "
                             f"speedup {_x(r['step_speedup'])}")
            else:
                for _, rr in g[g["world_size"] == g["world_size"].max()].iterrows():
                    parts.append(f"weak ({batch}/process, lr_rule {rr.get('lr_rule', 'none')}) at {rr['placement']}: "
                                 f"statistical efficiency {_ci_text(rr['statistical_efficiency'], rr['statistical_efficiency_lo'], rr['statistical_efficiency_hi'], _pct)}")
        out.append({"study": "time_to_accuracy", "topic": "Time to the target validation loss",
                    "ours": "; ".join(parts) or "no series", "published": PUBLISHED["time_to_accuracy"]})
    a = analyses.get("compounding")
    if a is not None and a.table is not None and not a.table.empty:
        t = a.table
        m = t[(t["world_size"] == t["world_size"].max()) & (t["kernel"] != t["baseline_kernel"])]
        parts = [f"{r['kernel']} at {r['placement']}: measured {_x(r['measured'])} vs product {_x(r['product'])} "
                 f"(efficiency {_pct(r['efficiency'])} vs {_pct(r['efficiency_ref'])})" for _, r in m.iterrows()]
        out.append({"study": "compounding", "topic": "Kernel speedup x DDP speedup",
                    "ours": "; ".join(parts) or "one kernel only", "published": PUBLISHED["compounding"]})
    a = analyses.get("communication")
    opts = a.extra.get("options") if a is not None and not a.empty else None
    if opts is not None and not opts.empty:
        o = opts[~opts["is_plain"] & ~opts["plain_missing"] & ~_emulated(opts)]
        parts = [f"{r['option']} ({r['placement']}): step {r['step_time_ratio']:.2f}x, val loss "
                 f"{_signed_pct(r['val_loss_rel_delta'])}" + (" - harms convergence" if r["harms_convergence"] else "")
                 for _, r in o.iterrows()]
        if parts:
            out.append({"study": "communication", "topic": "Data-parallel options against plain DDP",
                        "ours": "; ".join(parts), "published": PUBLISHED["options"]})
    a = analyses.get("published")
    if a is not None and "comparison" in a.tables:
        c = a.tables["comparison"]
        parts = [f"{col}: " + ", ".join(c[col]) for col in c.columns[2:]]
        out.append({"study": "published", "topic": "The published setup predicted (speedup, efficiency, overhead)",
                    "ours": "; ".join(parts), "published": PUBLISHED["published"]})
    a = analyses.get("extrapolation")
    if a is not None and "above" in a.extra:
        out.append({"study": "extrapolation", "topic": "Model sizes above the target efficiency at scale",
                    "ours": a.lines[0] if a.lines else "", "published": PUBLISHED["extrapolation"]})
    return out


def _calibration_findings(a) -> list[dict]:
    if a is None or a.empty:
        return []
    fits = a.extra.get("fits")
    if not fits:
        return [{"study": "communication", "topic": "The link model (collective benchmark)",
                 "ours": "not fitted: no collective-benchmark records", "published": PUBLISHED["calibration"]}]
    cal = a.tables.get("calibration")
    parts = []
    if cal is not None and not cal.empty:
        ok = cal.columns[-2]
        parts += [f"injected {r['constant']} {r['injected']}, recovered {r['recovered']} ({r['error']}, within 20%: "
                  f"{r[ok]})" for _, r in cal.iterrows()]
    from kanlib import commmodel

    pts = commmodel.fit_points(fits)
    if len(pts):
        parts.append(f"leave-one-out error of {len(pts)} benchmark points: median "
                     f"{pts['loo_rel_err'].abs().median():.0%}, max {pts['loo_rel_err'].abs().max():.0%}")
    par = a.extra.get("parity")
    if par is not None:
        ok_rows = par[par["pred_exposed_s"].notna()]
        if len(ok_rows):
            parts.append(f"DDP parity over {len(ok_rows)} runs: median |error| step "
                         f"{ok_rows['step_rel_err'].abs().median():.0%}, exposed "
                         f"{ok_rows['exposed_rel_err'].abs().median():.0%}")
    tw = a.extra.get("transfer_waiting")
    if tw is not None and len(tw):
        parts.append("waiting share of the hook time " + ", ".join(
            f"{r['placement']} {r['waiting_fraction']:.0%}" for _, r in tw.iterrows()))
    return [{"study": "communication", "topic": "Calibration: the link model on a known signal",
             "ours": "; ".join(parts) or "fitted", "published": PUBLISHED["calibration"]}]




# -- methods ---------------------------------------------------------------------------------
_METHOD_FIELDS = ("model", "widths", "grid_size", "spline_order", "kan_impl", "task", "global_batch", "steps",
                  "warmup_steps", "lr", "optimizer", "precision", "threads", "bucket_cap_mb",
                  "comm_hook", "grad_accum_steps", "parallelism", "lr_rule", "target_val_loss", "eval_every",
                  "placement")


def _uniq(df: pd.DataFrame, col: str) -> str:
    if col not in df:
        return "not recorded"
    vals = sorted({_value(results._hashable(v)) for v in df[col].dropna()})
    return ", ".join(vals) if vals else "not recorded"


def methods_html(analyses: dict[str, StudyAnalysis], report_dir: str) -> str:
    """The methods section: machine, backend, torch, code, configs and repeats per study, how each
    quantity is measured (linking docs/measurement.md)."""
    frames = [a.records for s, a in analyses.items() if not a.empty and s in STUDY_TITLES]
    if not frames:
        return "<p>No records.</p>"
    allr = pd.concat(frames, ignore_index=True)
    rows = [("hosts", _uniq(allr, "hostname")), ("devices", _uniq(allr, "device_name")),
            ("backend", _uniq(allr, "backend")), ("torch", _uniq(allr, "torch_version")),
            ("CUDA / NCCL", f"{_uniq(allr, 'cuda_version')} / {_uniq(allr, 'nccl_version')}"),
            ("launcher", _uniq(allr, "launcher")), ("commit (git)", _uniq(allr, "git_sha")),
            ("code version (hash of the runtime source)", _uniq(allr, "code_version")),
            ("runs", f"{len(allr)} records, from {allr['started_at'].min() if 'started_at' in allr else '?'} "
                     f"to {allr['finished_at'].max() if 'finished_at' in allr else '?'}")]
    body = "<table class='kv'>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                                          for k, v in rows) + "</table>"
    body += "<h3>Configurations and repeats</h3><table><tr><th>study</th><th>records</th><th>runs per point</th>" \
            "<th>fixed</th><th>varied</th></tr>"
    for study, a in analyses.items():
        if a.empty or study not in STUDY_TITLES:
            continue
        r = results._placement_cols(a.records)
        fixed, varied = [], []
        for f in _METHOD_FIELDS:
            if f not in r:
                continue
            vals = {_value(results._hashable(v)) for v in r[f].dropna()}
            (varied if len(vals) > 1 else fixed).append(f"{f}={', '.join(sorted(vals))}")
        per = a.table["n_runs"] if a.table is not None and "n_runs" in a.table else pd.Series(dtype=int)
        per_txt = f"{int(per.min())}-{int(per.max())}" if len(per) and per.min() != per.max() else \
            (str(int(per.iloc[0])) if len(per) else "?")
        body += (f"<tr><td>{study}</td><td>{len(r)}</td><td>{per_txt}</td><td>{html.escape('; '.join(fixed))}</td>"
                 f"<td>{html.escape('; '.join(varied))}</td></tr>")
    body += "</table>"
    doc = (os.path.relpath(MEASUREMENT_DOC, report_dir) if os.path.exists(MEASUREMENT_DOC) else "docs/measurement.md")
    body += (
        "<h3>How each quantity is measured</h3><ul>"
        "<li><b>Step time</b> T(N): per step the slowest rank's forward + backward + optimizer time (host clock after "
        "synchronising the device), median over the steps after warm-up; each point is repeated in separate process "
        "groups and tables show the median over repeats with a percentile bootstrap 95% interval (2000 resamples).</li>"
        "<li><b>Speedup</b> S = T(1)/T(N) at a fixed global batch (interval resampling both); <b>efficiency</b> "
        "E = S/N; <b>Karp-Flatt</b> e = (1/S - 1/N)/(1 - 1/N).</li>"
        "<li><b>Weak scaling</b>: throughput X(N) = global batch / T(N) at a fixed per-process batch; "
        "E_w = X(N)/(N X(1)), and against the first multi-process point.</li>"
        "<li><b>Exposed communication</b>: the same configuration run with a timed all-reduce hook and with a no-op "
        "hook (same bucketing, no network); exposed = T_allreduce - T_noop, clipped to [0, total all-reduce time]; "
        "overhead = exposed / T_allreduce; overlap = total - exposed.</li>"
        "<li><b>Parameters per byte</b>: parameters / peak memory (CUDA: allocator peak; CPU: process peak resident "
        "set).</li>"
        "<li><b>Collective benchmark</b>: per message size, all-reduces after a barrier (the transfer, not a late "
        "rank); time = median (and deciles) over iterations of the slowest rank; algbw = bytes / time, busbw = "
        "algbw x 2(N-1)/N. <b>Link model</b>: latency and bandwidth per link (intra-node, inter-node, emulated) fitted "
        "by non-negative relative least squares, with the leave-one-out error of every point; a constant the data "
        "cannot resolve is reported as such. <b>Known signal</b>: an emulated inter-node link adds 2(N-1) L + "
        "2(N-1)/N bytes/B to each all-reduce; the fit must recover L and B.</li>"
        "<li><b>Parity</b>: for each timed DDP run, the model's exposed communication from the run's buckets, the "
        "no-op twin's backward time and the fitted links, against T_timed - T_noop; <b>transfer vs waiting</b>: the "
        "benchmark-predicted transfer of the run's buckets against the hook's measured time.</li>"
        "<li><b>Data-parallel options</b>: each option run as its own point with its no-op twin; step time, exposed "
        "communication and the final validation loss (same samples) against plain DDP at the same point.</li>"
        "<li><b>Time to accuracy</b>: validation loss every eval_every steps outside the timed region; steps, "
        "samples and training wall time until it first reaches the target; strong series (one global batch): "
        "time-to-target speedup against step speedup; weak series (one per-process batch): statistical efficiency "
        "samples(N0)/samples(N).</li>"
        "<li><b>Compounding</b>: grouped by the kernel path that ran (kan_path); measured T(ref,N0) N0 / T(k,N) "
        "against the product of the kernel speedup and the reference kernel's DDP speedup.</li>"
        "<li><b>FSDP</b>: the same model sizes under DDP and fully_shard at the same placement; peak memory per "
        "process and step time; FSDP pays where its peak memory is lower by more than 5%.</li>"
        "<li><b>Groups</b>: records that differ in any configuration field, placement or code version are never "
        "pooled; each group is a row set, subplot and guideline of its own.</li></ul>"
        f"<p>Definitions in full: <a href='{html.escape(doc)}'>{html.escape(doc)}</a>.</p>")
    return body


def _records_html(analyses: dict[str, StudyAnalysis], report_dir: str) -> str:
    parts = []
    for study, a in analyses.items():
        if a.empty or study not in STUDY_TITLES:
            continue
        r = results._placement_cols(a.records)
        items = []
        for _, row in r.iterrows():
            rel = os.path.relpath(row["record_path"], report_dir)
            desc = (f"{row.get('model', '')} {_value(results._hashable(row.get('widths', '')))} B={row.get('global_batch', '')} "
                    f"{row['placement']} repeat {row.get('repeat', '')}")
            if study == "communication":
                desc += f" {row.get('comm_hook', '')} {row.get('bucket_cap_mb', '')} MiB"
            items.append(f"<li><a href='{html.escape(rel)}'>{html.escape(rel)}</a>: {html.escape(desc)}, "
                         f"{row['step_time_s'] * 1e3:.3g} ms</li>")
        parts.append(f"<details><summary>{study}: {len(r)} records</summary><ul>{''.join(items)}</ul></details>")
    a = analyses.get("communication")
    bench_files = []
    if a is not None and a.out_dir:
        from kanlib import collbench

        bench = collbench.load_bench(a.out_dir)
        if not bench.empty:
            bench_files = bench.drop_duplicates("record_path")
    if len(bench_files):
        items = [f"<li><a href='{html.escape(os.path.relpath(p, report_dir))}'>"
                 f"{html.escape(os.path.relpath(p, report_dir))}</a>: {html.escape(str(pl))} {html.escape(str(be))}"
                 f"{', emulated ' + _link_desc(la, bw) if n > 1 and (la or bw) else ''}</li>"
                 for p, pl, be, n, la, bw in zip(bench_files["record_path"], bench_files["placement"],
                                                 bench_files["backend"], bench_files["nnodes"],
                                                 bench_files["emulate_latency_s"].fillna(0),
                                                 bench_files["emulate_bandwidth_bytes_per_s"].fillna(0))]
        parts.append(f"<details><summary>collbench: {len(items)} records</summary><ul>{''.join(items)}</ul></details>")
    return "".join(parts)


def _section(title: str, body: str, anchor: str = "") -> str:
    a = f" id='{anchor}'" if anchor else ""
    return f"<section{a}><h2>{html.escape(title)}</h2>{body}</section>\n"


CSS = ("body{font-family:system-ui,sans-serif;max-width:1250px;margin:auto;padding:1em;color:#222}"
       "table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 7px;"
       "text-align:left;vertical-align:top}th{background:#f3f3f3}.findings td:first-child{font-weight:600}"
       ".caption{color:#444;font-size:14px;margin:.2em 0 1.5em}.note{color:#666;font-size:13px}"
       "table.kv th{width:22em}")


def analyses(out_dir: str, code: str = "newest", published: dict | None = None, extrapolate: dict | None = None,
             **params) -> dict[str, StudyAnalysis]:
    """Every analysis of the report, by name: each study of :data:`STUDY_TITLES` (``params`` go to
    :func:`analyze`), then :func:`published_setup` (``published``: its keyword arguments) and
    :func:`extrapolation` (``extrapolate``: its keyword arguments; None: those notebook 06 kept in
    ``out_dir/extrapolation.json``, else the defaults)."""
    out = {s: analyze(out_dir, s, code=code, **params) for s in STUDY_TITLES}
    out["published"] = published_setup(out_dir, code=code, **(published or {}))
    if extrapolate is None:  # what notebook 06 last computed for this folder, else the defaults
        saved = os.path.join(out_dir, EXTRAPOLATION_PARAMS)
        extrapolate = {}
        if os.path.exists(saved):
            with open(saved) as f:
                extrapolate = json.load(f)
    out["extrapolation"] = extrapolation(out_dir, code=code, **extrapolate)
    return out


def build_report(out_dir: str, guidelines=None, path: str | None = None, code: str = "newest",
                 published: dict | None = None, extrapolate: dict | None = None, **params) -> str:
    """Write ``out_dir/report.html`` (or ``path``): findings beside the published study's numbers, the
    guidelines (a :class:`kanlib.guidelines.Guidelines`, optional), each study's figures with captions
    and trimmed tables, the published setup and the extrapolation through the calibrated model, methods
    and links to the raw records. ``published`` / ``extrapolate`` / ``params``: see :func:`analyses`.
    Returns the path."""
    from plotly.offline import get_plotlyjs

    path = path or os.path.join(out_dir, "report.html")
    report_dir = os.path.dirname(os.path.abspath(path))
    all_a = analyses(out_dir, code, published, extrapolate, **params)
    found = findings(all_a)
    head = ("<table class='findings'><tr><th>finding</th><th>this study (median, 95% interval)</th>"
            "<th>published study</th></tr>"
            + "".join(f"<tr><td><a href='#{f['study']}'>{html.escape(f['topic'])}</a></td><td>{html.escape(f['ours'])}</td>"
                      f"<td>{html.escape(f['published'])}</td></tr>" for f in found) + "</table>")
    if not found:
        head = "<p>No records to report on yet.</p>"
    parts = [_section("Findings", head, "findings")]
    if guidelines is not None:
        items = "".join(f"<li>{html.escape(s)}</li>" for s in guidelines.sentences)
        parts.append(_section("Deployment guidelines (computed from these records)", f"<ul>{items}</ul>", "guidelines"))
    where = os.path.relpath(os.path.abspath(out_dir), report_dir)
    for name, title in {**STUDY_TITLES, **EXTRA_TITLES}.items():
        # messages name the folder absolutely ("no records ... under /abs/path"); the report says it relatively
        body = all_a[name].html().replace(html.escape(os.path.abspath(out_dir)), html.escape(where))
        parts.append(_section(title, body, name))
    parts.append(_section("Methods", methods_html(all_a, report_dir), "methods"))
    figs = os.path.relpath(os.path.join(os.path.abspath(out_dir), "figures"), report_dir)
    parts.append(_section("Raw records", f"<p>Each run's folder holds config.json, steps.csv, launch.log and "
                                         f"record.json; every figure is also a file under "
                                         f"<a href='{html.escape(figs)}/'>{html.escape(figs)}/</a>.</p>"
                                         + _records_html(all_a, report_dir), "records"))
    doc = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>kanlib scaling study</title>"
           f"<script type='text/javascript'>{get_plotlyjs()}</script><style>{CSS}</style></head><body>"
           "<h1>How KAN training scales with PyTorch DDP</h1>"
           f"<p class='note'>Computed from the records under <code>{html.escape(where)}/</code> (relative to this "
           f"file); generated {records.now_iso()}. Findings first, then the guidelines, each study's figures and "
           f"tables, the published setup and the extrapolation through the calibrated model, the methods and the raw "
           f"records.</p>"
           + "".join(parts) + "</body></html>")
    os.makedirs(report_dir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(doc)
    os.replace(tmp, path)
    return path
