"""The published setup (8 GPUs = 4 nodes x 2) through the calibrated model, beside the published 5.97x speedup,
74.7% efficiency and 1.3-6.1% communication overhead. The KAN shape and batch are this project's choice (the paper's
model is not known, and every prediction says so); a scenario that mixes this machine's CPU compute with preset GPU
links, or uses this machine alone, is named as such; a prediction that reaches the published speedup only through
more communication than the paper measured is warned about; and beside each prediction, what would reproduce the
published efficiency: a per-step time that does not shrink with N, or a per-rank variability (stragglers).

Not a study with records of its own: it combines the studies' records with the model of
kanlib.analysis.commmodel (kanlib.analysis.presets.published_comparison), in up to three scenarios: the preset's
compute and links (marked as a preset); the compute measured here with the preset's links; the compute and links
measured here (the collective-benchmark fit).
"""

from __future__ import annotations

import pandas as pd

from kanlib.analysis import claims, commmodel, fmt, load, presets, stats, style
from kanlib.analysis.context import Context, Goals
from kanlib.analysis.explorer import View
from kanlib.analysis.section import StudyAnalysis
from kanlib.analysis.style import go, make_subplots
from kanlib.analysis.table import Table
from kanlib.studies import calibration

NAME = SECTION = "published"
RECORDS = None
TITLE = "The published setup (8 GPUs = 4 nodes x 2) through the calibrated model"
PUBLISHED = "5.97x / 74.7% / 1.3-6.1% measured on the published cluster"
AXES, SWEPT, EXPLORER = (), (), View()
_SCENARIO_COLORS = ("#9ecae1", "#4292c6", "#08306b", "#807dba")


def measured_profile(ctx: Context, model: str = "kan"):
    """A compute profile from the single-process runs of ``model`` (kanlib.analysis.commmodel.profile_from_records):
    the strong-scaling study's when it has some (several widths and batches resolve a fixed per-step time), else
    any study's. ``(profile or None, sentence)``."""
    try:
        df = ctx.runs().data
    except load.NoRecordsError as e:
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
                  f"({prof.source}; device {fmt.distinct(use, 'device_name')}).")


SHAPE_NOTE = ("The shape {widths} with global batch {batch} is this project's choice (notebooks/params/gpu_cluster), "
              "not the paper's: the published paper's model and batch are not known, so no column here is the paper's "
              "configuration.")
"""Said beside every prediction of the published setup."""


def _compute_device(ctx: Context) -> str:
    """The device of the single-process runs the measured compute comes from (``cpu``, ``cuda``; '' when none)."""
    try:
        df = ctx.runs().data
    except load.NoRecordsError:
        return ""
    ones = df[df["world_size"] == 1]
    vals = sorted(set(ones["device"].dropna().astype(str))) if "device" in ones else []
    return vals[0] if len(vals) == 1 else ("+".join(vals) if vals else "cpu")


def plain_fit(fits: dict | None):
    """The fit of the machine's own links (no emulation) to use for what-ifs: NCCL on CUDA first, else the
    first; None without fits."""
    if not fits:
        return None
    plain = {k: f for k, f in fits.items() if not (k[3] or k[4])}
    if not plain:
        return None
    key = sorted(plain, key=lambda k: (k[0] != "nccl", k[1] != "cuda", k[2] not in ("ring", "auto"), k))[0]
    return plain[key]


IMPLIED_ROWS = ("per-step time not shrinking with N that reproduces 74.7%",
                "per-rank CV (stragglers) that reproduces 74.7% with <= 6.1% communication")
"""The rows under the prediction: what the model would need to reproduce the published efficiency."""


def _implied(r: dict) -> list[str]:
    fixed = r.get("implied_fixed_s")
    cv = r.get("implied_cv") or {}
    cv_txt = "none does" if cv.get("rank_cv") is None else (
        f"{cv['rank_cv']:.0%}" + (f" (compute {cv['compute_scale']:.2g}x slower)" if cv["compute_scale"] > 1 + 1e-9
                                  else ""))
    return ["none does" if fixed is None else fmt.ms(fixed) + " ms", cv_txt]


def table(comparisons: dict) -> Table:
    """The published shape's speedup, efficiency and overhead: published, and predicted in each scenario
    (``{name: kanlib.analysis.presets.published_comparison(...)}``), display-ready; then what each scenario would need
    to reproduce the published 74.7% (:data:`IMPLIED_ROWS`): a per-step time that does not shrink with N, or a per-rank
    variability with communication at most the published 6.1%."""
    first = next(iter(comparisons.values()))["table"].set_index("quantity")
    out = pd.DataFrame({"quantity": list(first.index) + list(IMPLIED_ROWS), "published": [
        f"{v:.2f}x" if "speedup" in q else (f"{v:.1%}" if isinstance(v, float) else v)
        for q, v in first["published"].items()] + ["", ""]})
    for name, r in comparisons.items():
        s = r["table"].set_index("quantity")["predicted"]
        out[name] = [f"{v:.2f}x" if "speedup" in q else f"{v:.1%}" for q, v in s.items()] + _implied(r)
    return Table(out)


def display_table(t: Table) -> pd.DataFrame:
    """The comparison as it is (already display-ready)."""
    return t.data


def tick_label(short: str, width: int = 16) -> str:
    """A scenario's short name as a bar's tick label: whole words on lines of at most ``width`` characters (plotly
    never wraps a tick label; a long one is cut or runs into its neighbour and the legend)."""
    lines, line = [], ""
    for word in short.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "<br>".join(lines + [line])


def figure(comparisons: dict, title: str = "The published setup (8 GPUs = 4 nodes x 2) through the model"
           ) -> go.Figure:
    """Predicted speedup, efficiency and communication overhead at the published shape per scenario
    (``{name: kanlib.analysis.presets.published_comparison(...)}``) as bars, each under its short name wrapped on
    short lines (:func:`tick_label`; the full name is in its hover and the table), the published 5.97x and 74.7%
    as dotted lines and the published 1.3-6.1% as a band (the numbers are presets.PUBLISHED's). The legend is a
    key of the lines and the band, beside the panels, never over the labels."""
    pub = presets.PUBLISHED
    fig = make_subplots(rows=1, cols=3, subplot_titles=("Speedup at 8 GPUs", "Efficiency",
                                                        "Exposed communication / step"), horizontal_spacing=0.1)
    for i, (name, r) in enumerate(comparisons.items()):
        t = r["table"].set_index("quantity")["predicted"].tolist()
        label = tick_label(r.get("short") or name)
        for col, v in enumerate(t, start=1):
            fig.add_trace(go.Bar(x=[label], y=[v], name=name, legendgroup=name, showlegend=False,
                                 marker=dict(color=_SCENARIO_COLORS[i % len(_SCENARIO_COLORS)]),
                                 hovertext=[f"{name}: {v:.3g}"], hoverinfo="text"), 1, col)
    dotted = dict(dash="dot", color="grey")
    fig.add_hline(y=pub["speedup"], line=dotted, row=1, col=1)
    fig.add_hline(y=pub["efficiency"], line=dotted, row=1, col=2)
    band = f"published {pub['overhead_fraction_min']:.1%}-{pub['overhead_fraction_max']:.1%}"
    style.published_band(fig, pub["overhead_fraction_min"], pub["overhead_fraction_max"], band, 1, 3)
    style.legend_key(fig, extra=[(f"dotted: published {pub['speedup']}x and {pub['efficiency']:.1%}",
                                  dict(mode="lines", line=dotted)), style.band_key(band)])
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(tickformat=".0%", row=1, col=2)
    fig.update_yaxes(tickformat=".1%", row=1, col=3)
    for col, y in enumerate(("speedup at 8 GPUs (x)", "efficiency S/N (% of ideal)",
                             "exposed communication / step (%)"), start=1):
        style.axis_titles(fig, "scenario", y, 1, col)
    fig.update_xaxes(tickangle=0, automargin=True)
    fig.update_layout(title=title, template=style.TEMPLATE, height=480, margin=dict(b=110),
                      legend=dict(orientation="v", x=1.02, y=1, xanchor="left", yanchor="top"))
    return fig


def analyze(ctx: Context, preset_name: str = "a100-hdr", widths=(64, 256, 256, 1), grid_size: int = 5,
            spline_order: int = 3, global_batch: int = 65536, bucket_cap_mb: float = 25.0,
            bench_time_col: str = "time_s_p10") -> StudyAnalysis:
    """The model's prediction for the published shape in each scenario this folder supports, the comparison
    table and the assumptions that move each prediction most."""
    a = StudyAnalysis(NAME)
    presets.preset(preset_name)  # an unknown name is refused before any work
    prof, prof_line = measured_profile(ctx)
    fit = calibration.link_fit(ctx, bench_time_col)
    machine = plain_fit(fit.fits)
    kw = dict(widths=tuple(widths), grid_size=grid_size, spline_order=spline_order, global_batch=global_batch,
              bucket_cap_mb=bucket_cap_mb, preset_name=preset_name)
    device = _compute_device(ctx)
    cpu = device == "cpu"
    scenarios = {f"preset {preset_name} (compute and links; a preset, not a measurement)":
                 (None, None, f"preset {preset_name}")}
    if prof is not None:
        name = (f"CPU compute measured here with links of preset {preset_name} (a mix: says nothing about the "
                f"published cluster)" if cpu else f"compute measured here, links of preset {preset_name}")
        scenarios[name] = (prof, None, f"{'CPU' if cpu else 'measured'} compute + {preset_name} links")
    if prof is not None and machine is not None:
        name = ("this machine: CPU compute and its own links (collective-benchmark fit; says nothing about the "
                "published cluster)" if cpu else "compute and links measured here (collective-benchmark fit)")
        scenarios[name] = (prof, machine.model, "this machine")
    comparisons, drivers = {}, []
    for name, (pr, model, short) in scenarios.items():
        try:
            r = presets.published_comparison(profile=pr, model=model, **kw)
        except ValueError as e:  # e.g. the measured fit has no inter-node link
            a.lines.append(f"{name}: no prediction: {e}.")
            continue
        r["short"] = short
        if r["overhead_above_published"]:
            over = r["table"].set_index("quantity")["predicted"].iloc[2]
            a.lines.append(f"WARNING ({name}): the predicted {r['table']['predicted'].iloc[0]:.2f}x comes with "
                           f"{over:.1%} exposed communication where the paper measured at most "
                           f"{presets.PUBLISHED['overhead_fraction_max']:.1%}: a close speedup here is not a "
                           f"confirmation.")
        d = r["drivers"].head(4).copy()
        d.insert(0, "scenario", name)
        drivers.append(d)
        a.lines.append(f"{name}: {r['text']}")
        comparisons[name] = r
    if comparisons:
        a.extra["comparisons"] = comparisons
        a.add_figure("comparison", figure(comparisons), (
            "The published shape (4 nodes x 2 GPUs) predicted in each scenario (bars) beside the published numbers "
            f"(dotted lines; the shaded band is the published {presets.PUBLISHED['overhead_fraction_min']:.1%}-"
            f"{presets.PUBLISHED['overhead_fraction_max']:.1%} overhead range). Each bar is named under it in short "
            "(the full name is in its hover and the table below). Preset scenarios come from "
            "specifications, not measurements; a gap means the assumptions differ from the published cluster's "
            "(the table below ranks which ones move the prediction most)."))
        a.add_table("comparison", display_table(table(comparisons)), (
            f"The published shape through the model: {list(widths)} (G={grid_size}, k={spline_order}), global batch "
            f"{global_batch}, {bucket_cap_mb:g} MiB buckets, ring all-reduce, overlap with backward"))
        dr = pd.concat(drivers, ignore_index=True)
        a.add_table("drivers", pd.DataFrame({"scenario": dr["scenario"], "assumption changed": dr["assumption"],
                                             "efficiency": dr["efficiency"].map(fmt.pct1),
                                             "change": dr["delta_efficiency"].map(fmt.signed_pct),
                                             "overhead": dr["overhead_fraction"].map(fmt.pct1)}),
                    "The assumptions that move each prediction most (one changed at a time)")
    a.lines.insert(0, prof_line)
    a.lines.insert(1, fit.sentence if machine is not None else "Links: " + fit.sentence)
    a.lines.insert(2, SHAPE_NOTE.format(widths=list(widths), batch=global_batch))
    if cpu and prof is not None:
        a.lines.insert(3, "The measured scenarios use CPU compute from this machine; a CPU beside A100 links, or a CPU "
                          "with loopback links, is not the published cluster: those columns say what this model does "
                          "with those inputs, nothing about the paper's GPUs.")
    a.message = ("Presets come from specifications and NCCL's tuning tables, not from measurements; the "
                 "measured scenarios use this folder's records.")
    a.records = pd.DataFrame() if comparisons else None
    return a


def finding(a: StudyAnalysis) -> list[dict]:
    """The published setup's predicted speedup, efficiency and overhead in each scenario."""
    if "comparison" not in a.tables:
        return []
    c = a.tables["comparison"]
    parts = [f"{col}: " + ", ".join(c[col].iloc[:3]) for col in c.columns[2:]]
    warn = [s for s in a.lines if s.startswith("WARNING")]
    shape = [s for s in a.lines if s.startswith("The shape ")]
    return [{"study": SECTION, "topic": "The published setup predicted (speedup, efficiency, overhead)",
             "ours": "; ".join(parts + shape + warn), "published": PUBLISHED}]


def guideline(ctx: Context, goals: Goals) -> tuple[list[dict], list[str]]:
    """None: a what-if of the model, not a decision from these records."""
    return [], []


def judge_guidelines(a, machine: dict, other: str, guidelines=None, ctx=None) -> dict:
    """The verdict on the published deployment guidelines: whether this folder's guidelines decide anything
    (how many decisions rest on unstable points, how many on too few runs) and whether the link model passed its
    own check."""
    if guidelines is None or guidelines.table.empty:
        return {"verdict": "untested", "number": "no guidelines computed", "why": ""}
    t = guidelines.table
    n_unstable = int((t["rests_on"].fillna("") != "").sum())
    n_unranked = int((~t["ranked"].astype(bool)).sum())
    num = (f"{len(t)} decisions: {n_unstable} flagged (could change within their intervals, or rest on disturbed points), {n_unranked} on fewer than "
           f"{stats.MIN_RUNS} runs")
    mc = ctx.model_check() if ctx is not None else None
    why = [other] if other else []
    if mc is not None and not mc.usable:
        why.append(f"the link model {mc.status} its own check, so it predicts nothing here")
    return {"verdict": claims.NOT_COMPARABLE if other or n_unranked == len(t) else "confirmed", "number": num,
            "why": "; ".join(why)}


CLAIMS = (claims.Claim("Deployment guidelines", "guidelines for deploying KAN training with DDP", judge_guidelines,
                       test_with=claims.CLUSTER_RUN + "; then python -m kanlib.advise OUT"),)
"""The published claim judged on the folder's guidelines rather than one study's records."""
