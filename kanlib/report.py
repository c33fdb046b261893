"""Study analyses for the companion notebooks, and the report of the study.

``analyze(out_dir, study)`` loads the study's records, computes its table (kanlib.results), figures
(kanlib.plots) and a caption per figure saying what to see; with no records it carries the message
"no records ..." instead of failing. ``build_report(out_dir)`` writes ``out_dir/report.html``: the
findings first, one line each with its 95% interval beside the published study's numbers, then the
guidelines, each study's figures with captions and a trimmed table (units, readable numbers), a
methods section (machine, backend, torch, commit, configs, repeats, how each quantity is measured)
and links to the raw records. Every path in it is relative to the report's folder; plotly.js is
embedded once and nothing is loaded from the network (no CDN, no MathJax).
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kanlib import plots, records, results

STUDY_TITLES = {
    "strong_scaling": "Strong scaling (fixed global batch)",
    "weak_scaling": "Weak scaling (fixed per-process batch)",
    "communication": "Communication overhead (no-op-hook method)",
    "model_size": "Model-size scaling (KAN vs matched-parameter MLP)",
}

# The published study's numbers that the findings stand beside (as the study reports them).
PUBLISHED = {
    "strong_scaling": "speedup 5.97x, efficiency 74.7% at 8 GPUs over 4 nodes (4x2)",
    "weak_scaling": "a drop in efficiency from 1 to several GPUs, then stable",
    "communication": "communication overhead 1.3%-6.1% of the step",
    "model_size": "a parameters-per-byte trend across model sizes",
}

MEASUREMENT_DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "measurement.md")


@dataclass
class StudyAnalysis:
    """One study's records, derived table, figures and their captions (empty with a message when no
    records)."""

    study: str
    records: pd.DataFrame | None = None
    table: pd.DataFrame | None = None
    figures: dict[str, go.Figure] = field(default_factory=dict)
    message: str = ""
    extra: dict = field(default_factory=dict)
    captions: dict[str, str] = field(default_factory=dict)
    out_dir: str = ""
    code: str = "newest"

    @property
    def empty(self) -> bool:
        return self.records is None

    def summary(self) -> pd.DataFrame:
        """The table trimmed to the columns that matter, with units and readable numbers."""
        return display_table(self.study, self.table) if self.table is not None else pd.DataFrame()

    def show(self) -> None:
        """Display the message, the trimmed table and every figure with its caption (figures use the
        renderers of :func:`kanlib.plots.use_offline_renderers`, so they survive export)."""
        from IPython.display import HTML, Markdown, display

        plots.use_offline_renderers()
        if self.message:
            display(Markdown(self.message))
        if self.table is not None:
            display(HTML(self.summary().to_html(index=False, escape=True)))
        for name, fig in self.figures.items():
            fig.show()
            if self.captions.get(name):
                display(Markdown(f"*{self.captions[name]}*"))
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


def _comm(df: pd.DataFrame):
    from kanlib import commmodel

    t = results.communication_table(df)
    figs = {"overhead": plots.communication_figure(t)}
    caps = {"overhead": (
        "Per point (placement, bucket size, ...): step time split into compute with hidden communication (light) "
        "and exposed communication (solid), the total all-reduce time (hollow marker), and the exposed share of "
        "the step with its bootstrap 95% interval. See which placement and bucket size expose the least, and how "
        "much of the all-reduce hides behind the backward pass.")}
    extra, notes = {}, []
    recs = results._placement_cols(df)
    keys = [f for f in t.attrs.get("group_fields", []) if f in t]
    timed = t[(t["comm_hook"] == "timed") & (t["emulate_latency_s"] == 0) & (t["emulate_bandwidth_bytes_per_s"] == 0)]
    for key, g in results._groupby(timed, keys + ["placement"]):
        from kanlib.guidelines import _records_of

        sel = _records_of(recs, key)
        sel = sel[sel["comm_hook"].isin(["timed", "noop"]) & (sel["emulate_latency_s"].fillna(0) == 0)]
        label = results.group_label(key)
        try:
            model, pred, basis = commmodel.extrapolate_study(sel, g)
        except (ValueError, KeyError) as e:  # too few timed multi-process runs to fit the model
            notes.append(f"{label}: no communication model ({e})")
            continue
        name = "extrapolation_" + "_".join(str(results._hashable(v)).replace(" ", "") for v in key.values())
        name = "".join(ch if ch.isalnum() or ch in "_-x." else "_" for ch in name)[:80]
        measured = sel[(sel["comm_hook"] == "timed") & (sel["world_size"] > 1)]
        figs[name] = plots.comm_model_figure(pred, measured, model, title=f"Alpha-beta model, {label}",
                                             color=plots.model_color(key.get("model", "kan")))
        caps[name] = (f"The alpha-beta model fitted to this placement's timed runs only ({model.n_points} runs), "
                      f"extrapolating its best point ({basis['bucket_cap_mb']:g} MiB buckets, "
                      f"{basis['overlap_fraction']:.0%} overlap) to {int(pred['world_size'].max())} processes. "
                      f"See where predicted efficiency falls below the target; an optimistic bound (no stragglers, "
                      f"no congestion). A constant the runs cannot resolve is named so, not printed as 0.")
        extra.setdefault("comm_models", []).append({"group": key, "model": model, "prediction": pred, "basis": basis})
    if extra.get("comm_models"):  # the first one under the old names, for older callers
        first = extra["comm_models"][0]
        extra.update(comm_model=first["model"], prediction=first["prediction"], basis=first["basis"])
    return t, figs, caps, extra, "; ".join(notes)


def _size(df: pd.DataFrame):
    t = results.model_size_table(df)
    fig = plots.model_size_figure(t)
    caps = {"memory_time": (
        "Step time, peak memory, parameters per byte of peak memory and time per parameter against the parameter "
        "count, KAN beside an MLP with the same parameter count (one colour per model in every panel). See how "
        "much more time a KAN parameter costs than an MLP parameter, and whether parameters per byte rise with "
        "size. On CPU peak memory is the process's resident set, dominated by the framework at small sizes, so "
        "the two models' parameters-per-byte lines coincide there." + _not_drawn(fig))}
    return t, {"memory_time": fig}, caps, {}


def analyze(out_dir: str, study: str, code: str = "newest") -> StudyAnalysis:
    """Load ``study``'s records under ``out_dir`` (code versions chosen by ``code``, see
    :func:`kanlib.results.load_records`) and derive its table, figures and captions."""
    if study not in STUDY_TITLES:
        raise ValueError(f"study: unknown value {study!r}; choose one of {', '.join(STUDY_TITLES)}")
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
    try:
        out = {"strong_scaling": _strong, "weak_scaling": _weak, "communication": _comm, "model_size": _size}[study](df)
    except KeyError as e:  # e.g. a communication study without its no-op runs
        return StudyAnalysis(study, df, None, {}, " ".join(notes + [str(e.args[0])]), out_dir=out_dir, code=code)
    table, figs, caps, extra = out[:4]
    if table.attrs.get("note"):
        notes.append(table.attrs["note"])
    if len(out) > 4 and out[4]:
        notes.append(out[4] + ".")
    return StudyAnalysis(study, df, table, figs, " ".join(notes), extra, caps, out_dir, code)


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
    return out


# -- methods ---------------------------------------------------------------------------------
_METHOD_FIELDS = ("model", "widths", "grid_size", "spline_order", "kan_impl", "task", "global_batch", "steps",
                  "warmup_steps", "lr", "optimizer", "precision", "parallelism", "threads", "bucket_cap_mb",
                  "comm_hook", "placement")


def _uniq(df: pd.DataFrame, col: str) -> str:
    if col not in df:
        return "not recorded"
    vals = sorted({_value(results._hashable(v)) for v in df[col].dropna()})
    return ", ".join(vals) if vals else "not recorded"


def methods_html(analyses: dict[str, StudyAnalysis], report_dir: str) -> str:
    """The methods section: machine, backend, torch, code, configs and repeats per study, how each
    quantity is measured (linking docs/measurement.md)."""
    frames = [a.records for a in analyses.values() if not a.empty]
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
        if a.empty:
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
        "<li><b>Groups</b>: records that differ in any configuration field, placement or code version are never "
        "pooled; each group is a row set, subplot and guideline of its own.</li></ul>"
        f"<p>Definitions in full: <a href='{html.escape(doc)}'>{html.escape(doc)}</a>.</p>")
    return body


def _records_html(analyses: dict[str, StudyAnalysis], report_dir: str) -> str:
    parts = []
    for study, a in analyses.items():
        if a.empty:
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
    return "".join(parts)


def _section(title: str, body: str, anchor: str = "") -> str:
    a = f" id='{anchor}'" if anchor else ""
    return f"<section{a}><h2>{html.escape(title)}</h2>{body}</section>\n"


CSS = ("body{font-family:system-ui,sans-serif;max-width:1250px;margin:auto;padding:1em;color:#222}"
       "table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 7px;"
       "text-align:left;vertical-align:top}th{background:#f3f3f3}.findings td:first-child{font-weight:600}"
       ".caption{color:#444;font-size:14px;margin:.2em 0 1.5em}.note{color:#666;font-size:13px}"
       "table.kv th{width:22em}")


def build_report(out_dir: str, guidelines=None, path: str | None = None, code: str = "newest") -> str:
    """Write ``out_dir/report.html`` (or ``path``): findings beside the published study's numbers, the
    guidelines (a :class:`kanlib.guidelines.Guidelines`, optional), each study's figures with captions
    and trimmed table, methods and links to the raw records. Returns the path."""
    from plotly.offline import get_plotlyjs

    path = path or os.path.join(out_dir, "report.html")
    report_dir = os.path.dirname(os.path.abspath(path))
    analyses = {s: analyze(out_dir, s, code=code) for s in STUDY_TITLES}
    found = findings(analyses)
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
    for study, title in STUDY_TITLES.items():
        a = analyses[study]
        body = f"<p class='note'>{html.escape(a.message)}</p>"
        if not a.empty:
            for name, fig in a.figures.items():
                body += fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False)
                body += f"<p class='caption'>{html.escape(a.captions.get(name, ''))}</p>"
            if a.table is not None:
                body += a.summary().to_html(index=False, classes="table", border=0)
        parts.append(_section(title, body, study))
    parts.append(_section("Methods", methods_html(analyses, report_dir), "methods"))
    figs = os.path.relpath(os.path.join(os.path.abspath(out_dir), "figures"), report_dir)
    parts.append(_section("Raw records", f"<p>Each run's folder holds config.json, steps.csv, launch.log and "
                                         f"record.json; every figure is also a file under "
                                         f"<a href='{html.escape(figs)}/'>{html.escape(figs)}/</a>.</p>"
                                         + _records_html(analyses, report_dir), "records"))
    where = os.path.relpath(os.path.abspath(out_dir), report_dir)
    doc = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>kanlib scaling study</title>"
           f"<script type='text/javascript'>{get_plotlyjs()}</script><style>{CSS}</style></head><body>"
           "<h1>How KAN training scales with PyTorch DDP</h1>"
           f"<p class='note'>Computed from the records under <code>{html.escape(where)}/</code> (relative to this "
           f"file); generated {records.now_iso()}. Findings first, then the guidelines, each study's figures and "
           f"tables, the methods and the raw records.</p>"
           + "".join(parts) + "</body></html>")
    os.makedirs(report_dir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(doc)
    os.replace(tmp, path)
    return path
