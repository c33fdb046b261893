"""Extrapolation to thousands of GPUs: the performance model of kanlib.analysis.commmodel predicts strong-scaling
efficiency and the exposed share of the step from 1 to ``max_world_size`` GPUs for each KAN size, bucket size and
all-reduce algorithm; where tree overtakes ring; which sizes stay at or above a target efficiency at scale.

The links come from the folder's collective-benchmark fit and the compute from its single-process runs when
there are some, otherwise from a hardware preset (marked as such). With measured links the measured strong-scaling
points are set beside the model's prediction for the same configuration. Notebook 06 keeps its parameters in
``out_dir/extrapolation.json`` (:data:`PARAMS_FILE`) so that the report shows the same extrapolation.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace

import numpy as np
import pandas as pd

from kanlib import records
from kanlib.analysis import commmodel, fmt, groups, load, presets, straggler, style
from kanlib.analysis.context import Context, Goals
from kanlib.analysis.explorer import View
from kanlib.analysis.section import StudyAnalysis
from kanlib.analysis.style import go
from kanlib.analysis.table import Table
from kanlib.studies import calibration, published, strong_scaling

NAME = SECTION = "extrapolation"
RECORDS = None
TITLE = "Extrapolation to thousands of GPUs"
PUBLISHED = "not extrapolated"
AXES, SWEPT, EXPLORER = (), (), View()
PARAMS_FILE = "extrapolation.json"
"""Where notebook 06 keeps its parameters under out_dir, for the report to show the same extrapolation."""
ALGO_DASH = {"ring": "solid", "tree": "dot", "auto": "dash"}
_SIZE_COLORS = ("#08306b", "#2171b5", "#6baed6", "#9ecae1", "#4a1486", "#807dba")
DEFAULT_SIZES = [[64, 256, 256, 1], [64, 1024, 1024, 1], [256, 4096, 4096, 1]]


def saved_params(out_dir: str) -> dict:
    """The parameters notebook 06 last used for ``out_dir`` ({} when it has not run)."""
    path = os.path.join(out_dir, PARAMS_FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def size_color(i: int) -> str:
    """The colour of the i-th KAN size of an extrapolation (shades of the KAN colour)."""
    return _SIZE_COLORS[i % len(_SIZE_COLORS)]


def _add_measured(fig: go.Figure, measured: pd.DataFrame, r: int, c: int) -> None:
    """Measured strong-scaling points (filled) beside the model's prediction for each (open) in one panel."""
    kan = style.model_color("kan")
    for _, m in measured.iterrows():
        fig.add_trace(go.Scatter(x=[m["world_size"]], y=[m["efficiency"]], mode="markers",
                                 name=f"measured {m['placement']}", legendgroup="measured", showlegend=False,
                                 hovertext=[f"measured {m['label']} at {m['placement']}: E={m['efficiency']:.1%}"],
                                 hoverinfo="text",
                                 marker=dict(symbol=style.placement_symbol(m["placement"]), size=11, color=kan)), r, c)
        fig.add_trace(go.Scatter(x=[m["world_size"]], y=[m["pred_efficiency"]], mode="markers",
                                 name=f"predicted {m['placement']}", legendgroup="measured", showlegend=False,
                                 hovertext=[f"model for {m['label']} at {m['placement']}: E="
                                            f"{m['pred_efficiency']:.1%}"], hoverinfo="text",
                                 marker=dict(symbol=style.placement_symbol(m["placement"]) + "-open", size=13,
                                             color=kan, line=dict(width=2))), r, c)


def figure(table: pd.DataFrame, measured: pd.DataFrame | None = None, target: float = 0.8,
           title: str | None = None, link: str = "GPUs on preset links") -> go.Figure:
    """Predicted efficiency and exposed share of the step against world size (log2) for each KAN size
    (colour: a shade of the KAN colour per size), algorithm (line style) and bucket size (a subplot pair
    each), from kanlib.analysis.commmodel.extrapolation_table; the long-dashed line is the target. ``measured``:
    rows with ``world_size``, ``efficiency``, ``pred_efficiency``, ``placement`` and ``label`` - measured
    strong-scaling points (filled markers) beside the model's prediction for the same configuration
    (open markers), drawn in every efficiency panel. ``link``: what a rank is and the links it used (the x axis
    and the title say it: CPU processes on links measured here are not GPUs). A point above 100% efficiency is
    ringed (:func:`kanlib.analysis.style.flag_above`); ``layout.meta['above_100']`` names each, for the
    caption."""
    caps = sorted(table["bucket_cap_mb"].unique())
    fig, cols = style.grid(len(caps), 2, [f"{c:g} MiB buckets" for c in caps],
                           ["Predicted efficiency", "Exposed communication / step"], height_per_row=340,
                           vertical_spacing=min(0.2, 0.7 / max(1, 2 * math.ceil(len(caps) / style.FACET_COLS))))
    sizes = list(dict.fromkeys(table["kan"]))
    has_measured = measured is not None and len(measured)
    for i, cap in enumerate(caps):
        g = table[table["bucket_cap_mb"] == cap]
        for (kan, algo), s in g.groupby(["kan", "algo"], sort=False):
            s = s.sort_values("world_size")
            hover = [f"{kan} ({n:,} parameters), {algo}, {cap:g} MiB<br>N={w} ({a}x{b})<br>E={e:.1%}, exposed "
                     f"{o:.1%}" for n, w, a, b, e, o in zip(s["n_params"], s["world_size"], s["nnodes"],
                                                            s["nproc_per_node"], s["efficiency"],
                                                            s["overhead_fraction"])]
            look = dict(mode="lines", legendgroup=f"size {kan}", showlegend=False, name=f"{kan} {algo}",
                        line=dict(color=size_color(sizes.index(kan)), dash=ALGO_DASH.get(algo, "dash")),
                        hovertext=hover, hoverinfo="text")
            r, c = style.cell(i, 0, cols, 2)
            col = size_color(sizes.index(kan))
            banded = "efficiency_lo" in s and (s["efficiency_hi"] - s["efficiency_lo"]).abs().max() > 1e-12
            if banded:
                fig.add_trace(go.Scatter(x=list(s["world_size"]) + list(s["world_size"])[::-1],
                                         y=list(s["efficiency_hi"]) + list(s["efficiency_lo"])[::-1], fill="toself",
                                         mode="lines", line=dict(width=0), fillcolor=col, opacity=0.15,
                                         legendgroup=f"size {kan}", showlegend=False, name=f"{kan} {algo} band",
                                         hoverinfo="skip"), r, c)
            if "efficiency_bound" in s and (s["efficiency_bound"] - s["efficiency"]).abs().max() > 1e-12:
                fig.add_trace(go.Scatter(x=s["world_size"], y=s["efficiency_bound"], mode="lines",
                                         legendgroup=f"size {kan}", showlegend=False,
                                         name=f"{kan} {algo} optimistic bound",
                                         line=dict(color=col, width=1, dash=ALGO_DASH.get(algo, "dash")),
                                         opacity=0.5, hoverinfo="skip"), r, c)
            fig.add_trace(go.Scatter(x=s["world_size"], y=s["efficiency"], **look), r, c)
            r, c = style.cell(i, 1, cols, 2)
            fig.add_trace(go.Scatter(x=s["world_size"], y=s["overhead_fraction"], **look), r, c)
        r, c = style.cell(i, 0, cols, 2)
        style.target_line(fig, target, r, c)
        if has_measured:
            _add_measured(fig, measured, r, c)
        for k in range(2):
            r, c = style.cell(i, k, cols, 2)
            fig.update_xaxes(type="log", row=r, col=c)
            fig.update_yaxes(range=[0, 1.05], tickformat=".0%", row=r, col=c)
            style.axis_titles(fig, f"world size N ({link})", ("predicted efficiency (% of ideal)",
                                                              "exposed communication / step (%)")[k], r, c)
    for j, kan in enumerate(sizes):
        n = int(table.loc[table["kan"] == kan, "n_params"].iloc[0])
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"{kan} ({n:,} parameters)",
                                 legendgroup=f"size {kan}", line=dict(color=size_color(j), width=3)))
    extra = [(f"line: {a}", dict(mode="lines", line=dict(color=style.GREY, dash=ALGO_DASH.get(a, "dash"))))
             for a in dict.fromkeys(table["algo"])]
    if has_measured:
        extra.append(("filled: measured; open: model for that run", dict(mode="markers", marker=dict(
            symbol="circle-open", size=11, color=style.model_color("kan")))))
    extra.append(style.target_key(target))
    style.legend_key(fig, placements=sorted(set(measured["placement"]), key=groups.placement_key)
                     if has_measured else (), extra=extra)
    above = style.flag_above(fig)
    fig.update_layout(title=title or f"Predicted scaling to thousands of ranks: {link}", template=style.TEMPLATE)
    return style.with_meta(fig, above_100=above)


def measured_points(ctx: Context, model, prof, **straggler_kw) -> pd.DataFrame:
    """Measured strong-scaling efficiencies (N > 1) beside the model's prediction for the same widths,
    global batch, bucket size and placement (KAN and MLP models only; ``straggler_kw``: predict_scaling's
    ``rank_sigma``, ``contention``, ``sync_s``, ``per_bucket_s``)."""
    try:
        t = ctx.cached((strong_scaling.NAME, "table"),
                       lambda: strong_scaling.table(ctx.runs(strong_scaling.RECORDS).data))
        recs = groups.with_placement(ctx.runs(strong_scaling.RECORDS).data)
    except load.NoRecordsError:  # no strong-scaling records: nothing to overlay
        return pd.DataFrame()
    rows = []
    for _, r in t.data[t.data["world_size"] > 1].iterrows():
        sel = groups.select_records(recs, {f: r[f] for f in t.group_fields()})
        sel = sel[sel["placement"] == r["placement"]]
        if sel.empty or sel["model"].iloc[0] not in ("kan", "mlp"):
            continue
        s = sel.iloc[0]
        try:
            pb = commmodel.kan_param_bytes(s["widths"], int(s["grid_size"]), int(s["spline_order"]), s["model"])
            pred = commmodel.predict_scaling(model, prof, pb, [1, int(r["world_size"])], int(r["nproc_per_node"]),
                                             global_batch=int(s["global_batch"]),
                                             bucket_cap_mb=float(s["bucket_cap_mb"]), **straggler_kw)
        except ValueError:
            continue
        rows.append({"label": f"{s['model']} {list(s['widths'])}, B={int(s['global_batch'])}",
                     "placement": r["placement"], "world_size": int(r["world_size"]), "efficiency": float(r["efficiency"]),
                     "pred_efficiency": float(pred["efficiency"].iloc[-1])})
    return pd.DataFrame(rows)


def measured_spread(ctx: Context) -> tuple[float, tuple[float, float], str]:
    """The per-rank spread of compute (lognormal ``sigma`` of one rank's step around its median, with a 90%
    bootstrap interval) from this folder's records, and where it came from: the no-op-hook runs of the communication
    study at its largest world size (processes sharing a host measured together: contention is in it), else the
    one-process runs (N=1 alone: contention between processes sharing a host is not in it), else none (sigma 0, the
    optimistic bound). Each run's steps are divided by their median before pooling, so runs of different sizes mix
    only their spread."""
    try:
        df = ctx.runs().data
    except load.NoRecordsError:
        return 0.0, (0.0, 0.0), "no per-rank times here: no stragglers in the extrapolation (the optimistic bound)"
    noop = df[(df.get("comm_hook", pd.Series("", index=df.index)) == "noop") & (df["world_size"] > 1)]
    if len(noop):
        noop = noop[noop["world_size"] == noop["world_size"].max()]
        what = (f"{len(noop)} no-op-hook runs at {int(noop['world_size'].iloc[0])} processes "
                f"({', '.join(sorted(set(groups.with_placement(noop)['placement'])))}: contention between processes "
                f"sharing a host is in it)")
        runs = noop
    else:
        runs = df[df["world_size"] == 1]
        what = (f"{len(runs)} one-process runs (extrapolated from N=1 alone: contention between processes sharing a "
                f"host is not in it)")
    if runs.empty:
        return 0.0, (0.0, 0.0), "no per-rank times here: no stragglers in the extrapolation (the optimistic bound)"
    parts = []
    for i in range(len(runs)):
        x = straggler.rank_times(runs.iloc[i:i + 1]).samples
        parts.append(x / np.median(x))
    rt = straggler.RankTimes(np.concatenate(parts), len(runs), what)
    sigma = rt.lognormal.sigma
    lo, hi = straggler.bootstrap_sigma(rt.samples)
    return sigma, (lo, hi), (f"per-rank spread from {what}: CV {rt.lognormal.cv:.0%} (lognormal sigma {sigma:.3f}, "
                             f"90% bootstrap {lo:.3f}-{hi:.3f})")


def host_factor(ctx: Context, prof) -> tuple[float, str]:
    """A process's compute when several share a host, against the one-process profile: the median over the no-op
    runs with more than one process of (rank 0's median step) / (``prof``'s step for the same parameters and local
    batch). ``(1.0, sentence)`` when there are none: the compute is then extrapolated from N=1 alone."""
    alone = (1.0, "Per-process compute: extrapolated from one-process runs alone (N=1): no multi-process no-op run "
                  "measured what sharing a host does to it.")
    try:
        df = ctx.runs().data
    except load.NoRecordsError:
        return alone
    noop = df[(df.get("comm_hook", pd.Series("", index=df.index)) == "noop") & (df["world_size"] > 1)]
    if "model" in noop:
        noop = noop[noop["model"] == "kan"]
    ratios = []
    for i in range(len(noop)):
        r = noop.iloc[i]
        pred = float(prof.step_s(float(r["n_params"]), float(r["global_batch"]) / float(r["world_size"])))
        if pred > 0:
            ratios.append(float(np.median(straggler.rank_times(noop.iloc[i:i + 1]).samples)) / pred)
    if not ratios:
        return alone
    f = float(np.median(ratios))
    where = ", ".join(sorted(set(groups.with_placement(noop)["placement"])))
    return f, (f"Per-process compute at {where} (no-op runs, {len(ratios)}): {f:.3g}x what the one-process profile "
               f"predicts for the same work (processes sharing a host, and work too small to scale linearly); "
               f"applied at every N > 1.")


def _check(source: str, target_efficiency: float, at_world_size: int, max_world_size: int, algos) -> None:
    if source not in ("auto", "measured", "preset"):
        raise ValueError(f"source: unknown value {source!r}; choose auto, measured or preset")
    if not 0 < target_efficiency <= 1:
        raise ValueError(f"target_efficiency: must be in (0, 1], got {target_efficiency!r}")
    if at_world_size > max_world_size:
        raise ValueError(f"at_world_size: {at_world_size} is beyond max_world_size={max_world_size}")
    bad = [x for x in algos if x not in commmodel.ALGOS]
    if bad or not algos:
        raise ValueError(f"algos: unknown value(s) {bad or list(algos)}; choose from {', '.join(commmodel.ALGOS)}")


def _links(ctx: Context, args: dict) -> tuple[dict, int, str, object, list[str], str]:
    """The link models per algorithm (measured, or the preset's), the GPUs per node, their description, the fit
    used (None for the preset), notes, and the sentence saying what the benchmark fit is."""
    p = presets.preset(args["preset_name"])
    lf = calibration.link_fit(ctx, args["bench_time_col"])
    fit = published.plain_fit(lf.fits) if args["source"] != "preset" else None
    if args["source"] == "measured" and fit is None:
        raise ValueError(f"source: 'measured' needs collective-benchmark records under {ctx.out_dir} ({lf.sentence})")
    if fit is None:
        return ({algo: p.link_model(algo) for algo in args["algos"]}, args["gpus_per_node"] or p.gpus_per_node,
                f"links of preset {args['preset_name']} (a preset, not a measurement)", None, [], lf.sentence)
    bench = lf.bench
    gpn = args["gpus_per_node"] or int(bench.loc[bench["nnodes"] == 1, "nproc_per_node"].max() or 1)
    measured_algos = {k[2]: f.model for k, f in lf.fits.items() if not (k[3] or k[4]) and k[:2] == fit.key[:2]}
    models, notes = {}, []
    for algo in args["algos"]:
        m = measured_algos.get(algo) or (measured_algos.get("auto") if algo == "ring" else None)
        if m is None:
            m = replace(fit.model, algo=algo, label=f"{algo} formula on the measured {fit.model.label} links")
            notes.append(f"{algo}: not measured by the benchmark; its formula on the measured links")
        models[algo] = m
    return (models, gpn, f"links measured here ({fit.model.label}: {fit.model.describe(used=True)})", fit, notes,
            lf.sentence)


def _above_table(above: pd.DataFrame, at_world_size: int, target: float) -> pd.DataFrame:
    band = ([f"{fmt.pct1(a)}-{fmt.pct1(b)}" for a, b in zip(above["efficiency_lo"], above["efficiency_hi"])]
            if "efficiency_lo" in above else ["" for _ in range(len(above))])
    return pd.DataFrame({
        "KAN": above["kan"], "parameters": above["n_params"].map(lambda v: f"{v:,}"), "algorithm": above["algo"],
        "bucket (MiB)": above["bucket_cap_mb"].map(lambda v: f"{v:g}"),
        f"efficiency at {at_world_size}": above["efficiency"].map(fmt.pct1), "band": band,
        "optimistic bound": above["efficiency_bound"].map(fmt.pct1) if "efficiency_bound" in above else "",
        "exposed (ms)": above["exposed_s"].map(fmt.ms), f">= {target:.0%}": above["above"].map(
            {True: "yes", False: "no"})})


def _crossover_table(models: dict, max_world_size: int, gpn: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Where tree overtakes ring per message size: the model's table and its display."""
    cross = commmodel.ring_tree_crossover(models["ring"], models["tree"], [2 ** k for k in (10, 16, 20, 22, 25)],
                                          max_world_size, gpn)
    return cross, pd.DataFrame({
        "message": cross["size_bytes"].map(fmt.nbytes),
        "tree faster from N": cross["crossover_world_size"].map(lambda v: "never" if v is None or v != v else
                                                                f"{int(v)}"),
        "ring / tree there (us)": [f"{fmt.us(r)} / {fmt.us(t)}" for r, t in zip(cross["ring_s_at_crossover"],
                                                                               cross["tree_s_at_crossover"])],
        f"ring / tree at {max_world_size} (us)": [f"{fmt.us(r)} / {fmt.us(t)}" for r, t in
                                                   zip(cross["ring_s_at_max"], cross["tree_s_at_max"])]})


def _summary(above: pd.DataFrame, at_world_size: int, target: float) -> str:
    parts = []
    for kan, g in above.groupby("kan", sort=False):
        best = g.loc[g["efficiency"].idxmax()]
        how = f"{best['algo']}, {best['bucket_cap_mb']:g} MiB buckets: {best['efficiency']:.0%}"
        parts.append(f"{kan} {'stays above' if best['above'] else 'falls below'} "
                     f"({'best ' if not best['above'] else ''}{how})")
    return f"At {at_world_size} GPUs and {target:.0%} target efficiency: " + "; ".join(parts)


def table(models: dict, kan_sizes, prof, bucket_caps_mb, max_world_size: int, gpus_per_node: int,
          global_batch: int, **straggler_kw) -> Table:
    """The prediction for every KAN size x bucket size x algorithm, 1 to ``max_world_size`` GPUs
    (:func:`kanlib.analysis.commmodel.extrapolation_table`; ``straggler_kw``: its ``rank_sigma``,
    ``rank_sigma_interval``, ``contention`` and ``loo_rel_err``)."""
    sizes = {str(w): {"widths": w} for w in kan_sizes}
    return Table(commmodel.extrapolation_table(models, sizes, prof, bucket_caps_mb=tuple(bucket_caps_mb),
                                               max_world_size=max_world_size, gpus_per_node=gpus_per_node,
                                               global_batch=global_batch, **straggler_kw))


def display_table(t: Table) -> pd.DataFrame:
    """The prediction as it is (one row per size, algorithm, bucket size and world size)."""
    return t.data


def analyze(ctx: Context, preset_name: str = "h100-ndr", kan_sizes=None, bucket_caps_mb=(1.0, 25.0),
            algos=("ring", "tree"), target_efficiency: float = 0.8, at_world_size: int = 1024,
            max_world_size: int = 4096, global_batch: int = 65536, gpus_per_node: int = 0, source: str = "auto",
            bench_time_col: str = "time_s_p10", remember: bool = False) -> StudyAnalysis:
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
    write these arguments to ``out_dir/extrapolation.json``, which the report reads, so the
    report shows what notebook 06 computed."""
    _check(source, target_efficiency, at_world_size, max_world_size, algos)
    kan_sizes = [list(w) for w in (kan_sizes or DEFAULT_SIZES)]
    args = dict(preset_name=preset_name, kan_sizes=kan_sizes, bucket_caps_mb=[float(c) for c in bucket_caps_mb],
                algos=list(algos), target_efficiency=target_efficiency, at_world_size=at_world_size,
                max_world_size=max_world_size, global_batch=global_batch, gpus_per_node=gpus_per_node, source=source,
                bench_time_col=bench_time_col)
    if remember:
        os.makedirs(ctx.out_dir, exist_ok=True)
        records.atomic_write_json(os.path.join(ctx.out_dir, PARAMS_FILE), args)
    a = StudyAnalysis(NAME, extra={"params": args})
    models, gpn, links, fit, notes, bench_line = _links(ctx, args)
    prof, prof_line = (None, "") if source == "preset" else published.measured_profile(ctx)
    if prof is None:
        prof = presets.preset(preset_name).compute_profile()
        prof_line = (prof_line + "; " if prof_line else "") + f"compute of preset {preset_name}: {prof.source}"
    skw, strag_lines, val = _stragglers(ctx, fit, prof)
    try:
        t = table(models, kan_sizes, prof, args["bucket_caps_mb"], max_world_size, gpn, global_batch, **skw)
    except ValueError as e:  # a link the extrapolated placements need is missing from the fit
        a.message = f"No extrapolation: {e}."
        return a
    a.extra.update(validation=val, stragglers=skw)
    _describe(a, ctx, t, models, prof, fit, args, gpn, links)
    a.lines += [prof_line, bench_line] + notes + strag_lines
    a.message = (f"Extrapolation from {'measured links' if fit is not None else 'preset ' + preset_name}; presets are "
                 f"specifications, not measurements.")
    if val is not None and not val.ok:
        a.message += (" The model FAILED its leave-one-out check on this folder's DDP runs, so this extrapolation is "
                      "not validated: read it as a what-if, not guidance.")
    a.records = t.data
    return a


def _stragglers(ctx: Context, fit, prof) -> tuple[dict, list[str], object]:
    """The straggler terms of the extrapolation and their sentences: with measured links, the per-rank spread and
    the contention measured here and the leave-one-out error of the DDP model (its validation, or None); with a
    preset, none (a CPU's spread says nothing of a GPU cluster's)."""
    if fit is None:
        return ({}, ["Stragglers: none assumed with preset links (no per-rank times of that cluster): the curve is "
                     "the optimistic bound."], None)
    sigma, interval, spread_line = measured_spread(ctx)
    parity = calibration.ddp_parity(ctx)
    val = commmodel.model_validation(parity)
    con = commmodel.fitted_contention(parity)
    err = val.step_max_abs_err if val.n_runs else 0.0
    lines = [f"Stragglers: {spread_line}; the slowest of N ranks from its lognormal fit.",
             f"Contention when communication shares the cores (fitted on {val.n_runs} DDP runs at up to "
             f"{int(parity['world_size'].max())} processes, carried to every N): {con['contention']:+.0%} of compute, "
             f"{con['sync_s'] * 1e3:.3g} ms per step, {con['per_bucket_s'] * 1e3:.3g} ms per bucket."
             if val.n_runs else "Contention: no DDP run with a no-op twin to fit it on (0).",
             val.sentence + (f" The band adds the largest leave-one-out step error ({err:.0%})." if val.n_runs else
                             " The band is the straggler spread's alone.")]
    hf, hf_line = host_factor(ctx, prof)
    return ({"rank_sigma": sigma, "rank_sigma_interval": interval, "loo_rel_err": err, "host_factor": hf, **con},
            lines + [hf_line], val)


def _describe(a: StudyAnalysis, ctx: Context, t: Table, models: dict, prof, fit, args: dict, gpn: int,
              links: str) -> None:
    """The figure, the sizes above the target, the ring/tree crossover and the measured points beside the model."""
    table = t.data
    target, at_n, max_n = args["target_efficiency"], args["at_world_size"], args["max_world_size"]
    a.extra.update(table=table, models=models, profile=prof, gpus_per_node=gpn)
    skw = a.extra.get("stragglers") or {}
    measured = measured_points(ctx, models.get("ring") or next(iter(models.values())), prof,
                               **{k: v for k, v in skw.items()
                                  if k in ("rank_sigma", "host_factor") + commmodel.CONTENTION_TERMS}) \
        if fit is not None else pd.DataFrame()
    rank = "GPUs" if fit is None else f"{fit.key[1]} processes"
    link = (f"GPUs on links of preset {args['preset_name']}" if fit is None else
            f"{fit.key[1]} processes on the {fit.key[0]} links measured here")
    fig = figure(table, measured, target, link=link)
    above = sorted((fig.layout.meta or {}).get("above_100") or [], key=lambda v: not v.startswith("measured"))
    a.add_figure("efficiency", fig, (
        f"Predicted strong-scaling efficiency and exposed communication share, 1 to {max_n} {rank} "
        f"({gpn} per node), global batch {args['global_batch']}, for each KAN size (shade), algorithm (line style) "
        f"and bucket size (subplot pair); {links}; compute: {prof.source}. The long-dashed line is the target "
        f"{target:.0%}. "
        + ("Lines: the straggler model (the slowest of N ranks, contention measured here); shaded: its band (the "
           "per-rank spread's interval and the leave-one-out error); thin lines: the optimistic bound without "
           "stragglers or contention. Neither has congestion or NIC sharing."
           if fit is not None else "An optimistic bound: no stragglers, congestion or NIC sharing.")
        + (" Filled markers: measured strong-scaling points; open: the model for the same configuration."
           if len(measured) else "")
        + (f" Ringed in red, above 100% efficiency (beyond ideal scaling: a one-process baseline slower than its "
           f"share, noise, or a model outside what it was fitted on; not a gain to expect): {style.listed(above)}."
           if above else "")))
    above = commmodel.sizes_above(table, target, at_n)
    a.add_table("above", _above_table(above, at_n, target), f"Which sizes stay at or above {target:.0%} at {at_n} GPUs")
    a.extra["above"] = above
    a.lines.append(_summary(above, at_n, target) + f" ({links}; compute {prof.source}).")
    if "ring" in models and "tree" in models:
        cross, shown = _crossover_table(models, max_n, gpn)
        a.add_table("crossover", shown, "Where tree all-reduce overtakes ring, per message size")
        a.extra["crossover"] = cross
    if len(measured):
        a.add_table("measured", pd.DataFrame({"configuration": measured["label"], "placement": measured["placement"],
                                              "measured efficiency": measured["efficiency"].map(fmt.pct1),
                                              "predicted": measured["pred_efficiency"].map(fmt.pct1)}),
                    "Measured strong-scaling points beside the model's prediction for each")


def finding(a: StudyAnalysis) -> list[dict]:
    """The model sizes above the target efficiency at scale."""
    if "above" not in a.extra:
        return []
    return [{"study": SECTION, "topic": "Model sizes above the target efficiency at scale",
             "ours": a.lines[0] if a.lines else "", "published": PUBLISHED}]


def guideline(ctx: Context, goals: Goals) -> tuple[list[dict], list[str]]:
    """None: a prediction of the model, not a decision from these records."""
    return [], []
