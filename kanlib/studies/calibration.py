"""The calibrated link model: the collective benchmark of the folder (``collbench`` records) fitted once
(kanlib.analysis.commmodel), checked on a known signal and against every DDP run of the communication study.

Part of the communication section: the link constants with each point's leave-one-out error, the known-signal
check (injected against recovered emulated link), DDP through the emulated link, the parity of predicted and
measured DDP steps, and transfer against waiting in the DDP hook's time. Without benchmark records it says so
and fits nothing (the DDP hook times mix transfer and waiting). The guidelines' extrapolation of a measured
point with this model is in kanlib.studies.communication (it extrapolates that study's best point).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kanlib.analysis import commmodel, fmt, groups, load, style
from kanlib.analysis.context import Context, Goals, LinkFit
from kanlib.analysis.explorer import View
from kanlib.analysis.section import StudyAnalysis
from kanlib.analysis.style import go, make_subplots
from kanlib.analysis.table import Table
from kanlib.studies import communication

NAME = "calibration"
SECTION = RECORDS = "communication"
TITLE = "The link model calibrated on the collective benchmark"
PUBLISHED = "not done: the overhead was attributed to algorithm choice and inter-node latency unmeasured"
AXES, SWEPT, EXPLORER = communication.AXES, communication.SWEPT, View()
LINK_COLORS = {"no emulation": "#333333", "emulated": "#d62728"}
"""Collective-benchmark series: the machine's own links, and an emulated inter-node link on top."""
TRANSFER_COLORS = {"transfer": "#555555", "waiting": "#bbbbbb"}


def link_fit(ctx: Context, time_col: str | None = None) -> LinkFit:
    """The folder's link model fitted on the benchmark's ``time_col`` (default: the context's), once per build;
    a time the benchmark does not have is refused."""
    return ctx.link_fit(time_col)


def ddp_parity(ctx: Context) -> pd.DataFrame:
    """:func:`kanlib.analysis.commmodel.ddp_parity` of the communication study's runs with the folder's link fit
    (empty without benchmark fits or communication records), once per build (:meth:`Context.ddp_parity`)."""
    return ctx.ddp_parity()


def validation(ctx: Context) -> commmodel.ModelValidation:
    """Whether the DDP model passed its leave-one-out check on this folder (:func:`kanlib.analysis.commmodel.
    model_validation`): guidance and extrapolation use the model only when ``.ok``; ``.sentence`` says why not."""
    return commmodel.model_validation(ddp_parity(ctx))


def table(ctx: Context) -> Table:
    """The fitted link constants, one row per fit x link (:func:`kanlib.analysis.commmodel.fit_table`); empty
    without a fit."""
    fits = link_fit(ctx).fits
    return Table(commmodel.fit_table(fits) if fits else pd.DataFrame())


def display_table(t: Table) -> pd.DataFrame:
    """The fitted link constants, display-ready: a constant the data do not resolve says why instead of a number."""
    rows = []
    for _, r in t.data.iterrows():
        lat = (f"{r['alpha_s'] * 1e6:.3g} (+-{r['alpha_rel_se']:.0%})" if fmt.finite(r["alpha_s"])
               else f"not resolved: {r['alpha_why']}")
        bw = (f"{r['bandwidth_bytes_per_s'] / 1e9:.3g} (+-{r['beta_rel_se']:.0%})"
              if fmt.finite(r["bandwidth_bytes_per_s"]) else f"not resolved: {r['bandwidth_why']}")
        rows.append({"backend / device": f"{r['backend']} / {r['device']}", "algorithm": r["algo"],
                     "emulated link": fmt.link_desc(r["emulate_latency_s"], r["emulate_bandwidth_bytes_per_s"]),
                     "link": r["link"], "latency (us)": lat, "bandwidth (GB/s)": bw, "points": r["n_points"],
                     "fit error (rel. RMS)": fmt.pct1(r["rel_rmse"]), "leave-one-out error (rel. RMS)":
                     fmt.pct1(r["loo_rel_rmse"])})
    return pd.DataFrame(rows)


def points_table(fits: dict) -> pd.DataFrame:
    """Every benchmark point: measured, fitted, and predicted with the point left out of the fit."""
    p = commmodel.fit_points(fits)
    if p.empty:
        return p
    return pd.DataFrame({
        "fit": [f"{a}, emulated {fmt.link_desc(b, c)}" for a, b, c in
                zip(p["algo"], p["emulate_latency_s"], p["emulate_bandwidth_bytes_per_s"])],
        "placement": p["placement"], "link": p["link"], "bytes": p["size_bytes"].map(lambda v: f"{int(v):,}"),
        "measured (us)": p["time_s"].map(fmt.us), "fitted (us)": p["pred_s"].map(fmt.us),
        "left out (us)": p["loo_pred_s"].map(fmt.us), "leave-one-out error": p["loo_rel_err"].map(fmt.signed_pct)})


def _no_bandwidth_injected(r, got) -> str:
    """The known-signal check's sentence for an emulated link that injected no bandwidth limit."""
    total = r["bandwidth_bytes_per_s"]
    if got is None or not np.isfinite(got):
        note = "none injected; none recovered"
    elif total and np.isfinite(total) and got > 10 * total:  # 1/got is under a tenth of the link's
        note = (f"none injected; the fits differ by a {got / 1e9:.3g} GB/s link in series, under a "
                f"tenth of the emulated link's own inverse bandwidth: no measurable limit")
    else:
        note = (f"none injected, yet the fits differ by a {got / 1e9:.3g} GB/s link in series (a limit "
                f"the emulation did not add: noise or load)")
    return (f"Emulated link {fmt.link_desc(r['emulate_latency_s'], 0)} ({r['backend']}, {r['algo']}): "
            f"bandwidth {note}.")


def calibration_check(fits: dict, tolerance: float = 0.2) -> tuple[pd.DataFrame, list[str]]:
    """The known-signal check: for each emulated link, what was injected beside what the fits recovered
    (the emulated fit minus the machine's own inter-node link), the relative error and whether it is
    within ``tolerance``; and one sentence per check."""
    rec = commmodel.recovered_links(fits)
    rows, lines = [], []
    for _, r in rec.iterrows():
        for what, inj, got, err in (("latency", r["emulate_latency_s"], r["recovered_latency_s"], r["latency_rel_err"]),
                                    ("bandwidth", r["emulate_bandwidth_bytes_per_s"],
                                     r["recovered_bandwidth_bytes_per_s"], r["bandwidth_rel_err"])):
            if not inj:
                if what == "bandwidth":
                    lines.append(_no_bandwidth_injected(r, got))
                continue
            unit, scale = ("ms", 1e3) if what == "latency" else ("GB/s", 1e-9)
            ok = got is not None and np.isfinite(got) and abs(err) <= tolerance
            got_txt = f"{got * scale:.3g} {unit}" if got is not None and np.isfinite(got) else "not resolved"
            rows.append({"emulated link": fmt.link_desc(r["emulate_latency_s"], r["emulate_bandwidth_bytes_per_s"]),
                         "backend / algorithm": f"{r['backend']} / {r['algo']}", "constant": what,
                         "injected": f"{inj * scale:.3g} {unit}", "recovered": got_txt,
                         "error": fmt.signed_pct(err) if got is not None else "n/a",
                         f"within {tolerance:.0%}": "yes" if ok else "no", "note": r["why"] or ""})
            lines.append(f"Known-signal check ({r['backend']}, {r['algo']}): injected {what} {inj * scale:.3g} {unit}, "
                         f"recovered {got_txt}" + (f" ({err:+.1%})" if got is not None and np.isfinite(err) else "")
                         + f": {'within' if ok else 'NOT within'} {tolerance:.0%}"
                         + (f" ({r['why']})" if r["why"] else "") + ".")
    return pd.DataFrame(rows), lines


def emulation_growth(recs: pd.DataFrame) -> pd.DataFrame:
    """Per placement and bucket size: the timed hook's time per step with and without the emulated link,
    its growth, and what the link injected (``emulated_s``): the growth should match on multi-node
    placements, and a single-node placement injects nothing."""
    timed = recs[recs["comm_hook"] == "timed"].copy()
    timed["emulated"] = groups.emulated(timed)
    if not timed["emulated"].any():
        return pd.DataFrame()
    rows = []
    for key, g in groups.groupby(timed, ["placement", "bucket_cap_mb"]):
        plain, emu = g[~g["emulated"]], g[g["emulated"]]
        if plain.empty or emu.empty:
            continue
        for ekey, e in groups.groupby(emu, ["emulate_latency_s", "emulate_bandwidth_bytes_per_s"]):
            c0 = float(np.nanmedian(pd.to_numeric(plain["comm_total_s"], errors="coerce")))
            c1 = float(np.nanmedian(pd.to_numeric(e["comm_total_s"], errors="coerce")))
            inj = float(np.nanmedian(pd.to_numeric(e["emulated_s"], errors="coerce"))) if "emulated_s" in e else np.nan
            rows.append({"placement": key["placement"], "bucket (MiB)": f"{key['bucket_cap_mb']:g}",
                         "emulated link": fmt.link_desc(ekey["emulate_latency_s"],
                                                        ekey["emulate_bandwidth_bytes_per_s"]),
                         "hook time, own link (ms)": fmt.ms(c0), "hook time, emulated (ms)": fmt.ms(c1),
                         "growth (ms)": fmt.ms(c1 - c0), "injected (ms)": fmt.ms(inj),
                         "growth / injected": f"{(c1 - c0) / inj:.2f}" if inj and np.isfinite(inj) else "n/a"})
    return pd.DataFrame(rows)


def parity_table(parity: pd.DataFrame, link_only: pd.DataFrame | None = None) -> pd.DataFrame:
    """Predicted against measured, per DDP run, display-ready: ``parity`` from
    :func:`kanlib.analysis.commmodel.ddp_parity` (the straggler model, each run predicted by a model fitted without
    it) or :func:`kanlib.analysis.commmodel.validate_ddp` (the link model alone); ``link_only``: validate_ddp's rows of
    the same runs, whose exposed prediction is set beside."""
    emu = groups.emulated(parity)
    opts = [communication.option_label({f: (r[f] if f in r and pd.notna(r[f]) else v)
                                        for f, v in communication.OPTION_FIELDS.items()}, communication.PLAIN_BUCKET_MB)
            for _, r in parity.iterrows()]  # the bucket size has its own column
    out = pd.DataFrame({
        "placement": parity["placement"], "option": opts,
        "bucket (MiB)": parity["bucket_cap_mb"].map(lambda v: f"{v:g}"),
        "emulated link": [fmt.link_desc(a, b) if e else "none" for a, b, e in
                          zip(parity.get("emulate_latency_s", 0), parity.get("emulate_bandwidth_bytes_per_s", 0), emu)],
        "step measured (ms)": parity["step_time_s"].map(fmt.ms),
        "step predicted (ms)": parity["pred_step_time_s"].map(fmt.ms),
        "step error": parity["step_rel_err"].map(fmt.signed_pct),
        "exposed measured (ms)": parity["exposed_s"].map(fmt.ms),
        "exposed predicted (ms)": parity["pred_exposed_s"].map(fmt.ms),
        "exposed error": parity["exposed_rel_err"].map(fmt.signed_pct)})
    if "pred_waiting_share" in parity:
        out["waiting share measured / predicted"] = [f"{fmt.pct1(a)} / {fmt.pct1(b)}" for a, b in
                                                     zip(parity["waiting_share"], parity["pred_waiting_share"])]
        out["slowest of W ranks (ms)"] = parity["slowest_rank_s"].map(fmt.ms)
        out["contention fitted without this run (compute / per step / per bucket)"] = [
            f"{fmt.signed_pct(g)} / {fmt.ms(c)} ms / {fmt.ms(b)} ms" for g, c, b in
            zip(parity["contention"], parity["sync_s"], parity["per_bucket_s"])]
        out["estimator"] = parity["estimator"]
    if link_only is not None and len(link_only) == len(parity):
        out["exposed, link model alone (ms)"] = link_only["pred_exposed_s"].map(fmt.ms).to_numpy()
    out["why not predicted"] = parity["why"].fillna("").to_numpy()
    return out


def transfer_waiting(recs: pd.DataFrame, fits: dict) -> pd.DataFrame:
    """Transfer vs waiting per placement, bucket size and emulated link, over plain timed DDP runs
    (no compression, no other option): nothing of different configurations is pooled."""
    plain = recs[recs["comm_hook"] == "timed"]
    for f, v in communication.OPTION_FIELDS.items():
        if f in plain and f != "comm_hook":  # a record without the field predates it: plain DDP
            plain = plain[plain[f].isna() | (plain[f].map(groups.hashable) == v)]
    tw = commmodel.transfer_waiting(plain, fits)
    if tw.empty:
        return tw
    tw["placement"] = [f"{p}, {c:g} MiB" + (f", emulated {fmt.link_desc(a, b)}" if a or b else "")
                       for p, c, a, b in zip(tw["placement"], tw["bucket_cap_mb"], tw["emulate_latency_s"].fillna(0),
                                             tw["emulate_bandwidth_bytes_per_s"].fillna(0))]
    tw = tw[tw["transfer_s"].notna()]
    return commmodel.transfer_waiting_by_placement(tw) if not tw.empty else tw


# -- figures -----------------------------------------------------------------------------------------
def _bench_label(r) -> str:
    emu = (r.get("emulate_latency_s") or 0) > 0 or (r.get("emulate_bandwidth_bytes_per_s") or 0) > 0
    text = f"{r['placement']} {r.get('backend', '')}"
    if r.get("nccl_algo"):
        text += f" {r['nccl_algo']}"
    if emu and int(r["nnodes"]) > 1:
        bw = r.get("emulate_bandwidth_bytes_per_s") or 0
        text += f", emulated {float(r['emulate_latency_s']) * 1e6:g} us" + (f", {bw / 1e9:g} GB/s" if bw else "")
    return text


def _constant_str(g: pd.DataFrame, col: str) -> str:
    if col not in g:
        return ""
    vals = [v for v in g[col].dropna().unique() if isinstance(v, str)]
    return vals[0] if len(vals) == 1 else ""


def _fitted_line(fig: go.Figure, key: dict, g: pd.DataFrame, sizes, fits: dict, label: str, col: str) -> None:
    """The fitted time of one benchmark series, dotted, in the time panel (when a fit describes it)."""
    algo = commmodel.row_algorithm(key["backend"], key.get("nccl_algo", ""), _constant_str(g, "nccl_algo_used"))
    f = commmodel.find_fit(fits, key["backend"], _constant_str(g, "device") or "cpu", algo,
                           int(key["nnodes"]), key["emulate_latency_s"], key["emulate_bandwidth_bytes_per_s"])
    if f is not None:
        fig.add_trace(go.Scatter(x=sizes, y=f.model.time_s(sizes, int(key["nnodes"]), int(key["nproc_per_node"])),
                                 mode="lines", name=f"fit {label}", legendgroup=label, showlegend=False,
                                 line=dict(color=col, dash="dot", width=1), hoverinfo="skip"), 1, 1)


def bench_figure(bench: pd.DataFrame, fits: dict | None = None, time_col: str = "time_s",
                 title: str = "Collective benchmark: all-reduce against message size",
                 largest_bucket_bytes: float | None = None) -> go.Figure:
    """nccl-tests' three views of the benchmark (kanlib.analysis.load.load_bench rows): time, algbw and busbw
    against message size (log-log), one series per placement, backend, NCCL setting and emulated link
    (median over repeats at each size). Marker: placement; solid within one node, dashed across nodes;
    colour: the machine's own links, or an emulated link. With ``fits`` each series' fitted time is drawn as
    a dotted line in the time panel. ``largest_bucket_bytes``: the largest gradient bucket to model, a long-dashed
    vertical line in each panel (:func:`bench_caption_note` says whether the benchmark measured past it)."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=("Time per all-reduce (s)", "algbw (GB/s)",
                                                        "busbw = algbw x 2(N-1)/N (GB/s)"), horizontal_spacing=0.1)
    b = bench.copy()
    for c in ("emulate_latency_s", "emulate_bandwidth_bytes_per_s"):
        b[c] = b[c].fillna(0.0) if c in b else 0.0
    b.loc[b["nnodes"] == 1, ["emulate_latency_s", "emulate_bandwidth_bytes_per_s"]] = 0.0
    b["nccl_algo"] = b["nccl_algo"].fillna("") if "nccl_algo" in b else ""
    keys = ["placement", "nnodes", "nproc_per_node", "backend", "nccl_algo", "emulate_latency_s",
            "emulate_bandwidth_bytes_per_s"]
    fams = set()
    for key, g in groups.groupby(b, [k for k in keys if k in b]):
        pts = g.groupby("size_bytes", as_index=False).agg(t=(time_col, "median"), algbw=("algbw_bytes_per_s", "median"),
                                                          busbw=("busbw_bytes_per_s", "median"))
        emu = key["emulate_latency_s"] > 0 or key["emulate_bandwidth_bytes_per_s"] > 0
        col = LINK_COLORS["emulated" if emu else "no emulation"]
        fam = groups.family(int(key["nnodes"]))
        fams.add(fam)
        label = _bench_label(key)
        look = dict(mode="lines+markers", legendgroup=label, showlegend=False, name=label,
                    line=dict(color=col, dash=style.FAMILY_DASH[fam]),
                    marker=dict(symbol=style.placement_symbol(key["placement"]), size=7, color=col))
        hover = [f"{label}<br>{int(s):,} B<br>{t * 1e6:.4g} us<br>algbw {a / 1e9:.3g} GB/s<br>busbw {u / 1e9:.3g} GB/s"
                 for s, t, a, u in zip(pts["size_bytes"], pts["t"], pts["algbw"], pts["busbw"])]
        for i, y in enumerate((pts["t"], pts["algbw"] / 1e9, pts["busbw"] / 1e9), start=1):
            fig.add_trace(go.Scatter(x=pts["size_bytes"], y=y, hovertext=hover, hoverinfo="text", **look), 1, i)
        if fits and int(key["nnodes"]) * int(key["nproc_per_node"]) > 1:
            _fitted_line(fig, key, g, pts["size_bytes"].to_numpy(float), fits, label, col)
    any_emulated = bool(((b["emulate_latency_s"] > 0) | (b["emulate_bandwidth_bytes_per_s"] > 0)).any())
    colours = [k for k in LINK_COLORS if k == "no emulation" or any_emulated]  # no key for what is not drawn
    style.legend_key(fig, placements=style.drawn_placements(fig, b), families=sorted(fams),
                     extra=[(f"colour: {k}", dict(mode="lines", line=dict(color=LINK_COLORS[k], width=3)))
                            for k in colours]
                     + ([("dotted: the fitted model", dict(mode="lines", line=dict(color=style.GREY, dash="dot")))]
                        if fits else []))
    fig.update_xaxes(type="log", title_text="message size (bytes)")
    fig.update_yaxes(type="log")
    for col, y in enumerate(BENCH_Y_TITLES, start=1):
        style.axis_titles(fig, None, y, 1, col)
    if largest_bucket_bytes:  # named in the legend: an annotation on a log axis would need log10 coordinates
        for col in (1, 2, 3):
            fig.add_vline(x=float(largest_bucket_bytes), line=dict(dash="longdash", color=style.TARGET_COLOR, width=1),
                          row=1, col=col)
        style.legend_key(fig, extra=[(f"long dashes: largest gradient bucket ({fmt.nbytes(largest_bucket_bytes)})",
                                      dict(mode="lines", line=dict(dash="longdash", color=style.TARGET_COLOR)))])
    fig.update_layout(title=title, template=style.TEMPLATE, height=460)
    return style.with_meta(fig, largest_bucket_bytes=largest_bucket_bytes,
                           max_size_bytes=float(b["size_bytes"].max()) if len(b) else None)


BENCH_Y_TITLES = ("time per all-reduce (s)", "algbw = bytes / time (GB/s)", "busbw = algbw x 2(N-1)/N (GB/s)")
"""The y-axis titles of :func:`bench_figure`'s three panels (nccl-tests' time, algbw and busbw)."""


def bench_caption_note(fig: go.Figure) -> str:
    """The caption's sentence on the largest gradient bucket (the vertical line of :func:`bench_figure`): whether
    the benchmark measured past it, or the link model extrapolates there."""
    meta = fig.layout.meta or {}
    big, top = meta.get("largest_bucket_bytes"), meta.get("max_size_bytes")
    if not big or not top:
        return ""
    if top >= big:
        return (f" The long-dashed line is the largest gradient bucket ({fmt.nbytes(big)}); the benchmark measured "
                f"up to {fmt.nbytes(top)}, past it.")
    return (f" The long-dashed line is the largest gradient bucket ({fmt.nbytes(big)}): the benchmark stops at "
            f"{fmt.nbytes(top)}, below it, so the link model extrapolates there (run the benchmark with max_bytes "
            f"past it).")


def bench_table(bench: pd.DataFrame, time_col: str = "time_s") -> pd.DataFrame:
    """The benchmark as nccl-tests prints it: per series (placement, backend, NCCL setting, emulated link) and
    message size, the elements, the time (median over repeats of ``time_col``, in us), algbw and busbw (GB/s)."""
    if bench.empty:
        return pd.DataFrame()
    b = bench.copy()
    for c in ("emulate_latency_s", "emulate_bandwidth_bytes_per_s"):
        b[c] = b[c].fillna(0.0) if c in b else 0.0
    b.loc[b["nnodes"] == 1, ["emulate_latency_s", "emulate_bandwidth_bytes_per_s"]] = 0.0
    b["nccl_algo"] = b["nccl_algo"].fillna("") if "nccl_algo" in b else ""
    b["count"] = b["count"] if "count" in b else b["size_bytes"] // 4
    keys = [k for k in ("placement", "nnodes", "nproc_per_node", "backend", "nccl_algo", "emulate_latency_s",
                        "emulate_bandwidth_bytes_per_s") if k in b]
    rows = []
    for key, g in groups.groupby(b, keys):
        pts = g.groupby("size_bytes", as_index=False).agg(count=("count", "first"), t=(time_col, "median"),
                                                          algbw=("algbw_bytes_per_s", "median"),
                                                          busbw=("busbw_bytes_per_s", "median"))
        label = _bench_label(key)
        rows += [{"series": label, "size": fmt.nbytes(r["size_bytes"]), "count (elements)": f"{int(r['count']):,}",
                  "time (us)": fmt.us(r["t"]), "algbw (GB/s)": f"{r['algbw'] / 1e9:.3g}",
                  "busbw (GB/s)": f"{r['busbw'] / 1e9:.3g}"} for _, r in pts.sort_values("size_bytes").iterrows()]
    return pd.DataFrame(rows)


def parity_figure(parity: pd.DataFrame, title: str = "The calibrated model against every DDP run",
                  link_only: pd.DataFrame | None = None) -> go.Figure:
    """Predicted against measured step time and exposed communication for every timed DDP run with a
    no-op twin, on the diagonal where the model is right: ``parity`` from
    kanlib.analysis.commmodel.ddp_parity (each run predicted by the straggler model fitted without it; filled
    markers) or validate_ddp; ``link_only``: validate_ddp's predictions of the same runs (the link model alone, no
    stragglers or contention), as grey open markers named ``link model alone``. Colour: model; marker: placement;
    the dotted line is y = x. Runs the model could not predict are listed in ``layout.meta['not_drawn']``."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Step time (ms)", "Exposed communication (ms)"))
    p = parity.copy()
    if "model" not in p:
        p["model"] = "kan"
    ok = np.isfinite(pd.to_numeric(p["pred_exposed_s"], errors="coerce").to_numpy(float))
    not_drawn = [f"{r['placement']} {r.get('run_key', '')}: {r.get('why')}" for _, r in p[~ok].iterrows()]
    p = p[ok]
    for col, (meas, pred) in enumerate((("step_time_s", "pred_step_time_s"), ("exposed_s", "pred_exposed_s")), start=1):
        hi = 0.0
        for key, g in groups.groupby(p, ["model", "placement"]):
            m = key["model"]
            emu = g["emulate_latency_s"].fillna(0).to_numpy(float) if "emulate_latency_s" in g else np.zeros(len(g))
            hover = [f"{m} {key['placement']}, {cap:g} MiB{', emulated %g us' % (e * 1e6) if e else ''}<br>"
                     f"measured {a * 1e3:.3g} ms, predicted {b * 1e3:.3g} ms" for cap, e, a, b in
                     zip(g["bucket_cap_mb"], emu, g[meas], g[pred])]
            fig.add_trace(go.Scatter(x=g[meas] * 1e3, y=g[pred] * 1e3, mode="markers", name=f"{m} {key['placement']}",
                                     legendgroup=str(m), showlegend=False, hovertext=hover, hoverinfo="text",
                                     marker=dict(symbol=style.placement_symbol(key["placement"]), size=10,
                                                 color=style.model_color(m))), 1, col)
            hi = max(hi, float(np.nanmax(np.r_[g[meas].to_numpy(float), g[pred].to_numpy(float)])) * 1e3)
        if link_only is not None and len(link_only):
            lo = link_only[np.isfinite(pd.to_numeric(link_only["pred_exposed_s"], errors="coerce").to_numpy(float))]
            fig.add_trace(go.Scatter(x=lo[meas] * 1e3, y=lo[pred] * 1e3, mode="markers", name="link model alone",
                                     legendgroup="link model alone", showlegend=col == 1,
                                     hovertext=[f"link model alone, {p}: measured {a * 1e3:.3g} ms, predicted "
                                                f"{b * 1e3:.3g} ms" for p, a, b in
                                                zip(lo["placement"], lo[meas], lo[pred])], hoverinfo="text",
                                     marker=dict(symbol="circle-open", size=9, color=style.GREY)), 1, col)
        hi = hi * 1.1 or 1.0
        fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", name="y = x", legendgroup="y = x",
                                 showlegend=col == 1, line=dict(dash="dot", color="grey"), hoverinfo="skip"), 1, col)
        fig.update_xaxes(title_text="measured (ms)", range=[0, hi], row=1, col=col)
        fig.update_yaxes(title_text="predicted (ms)", range=[0, hi], row=1, col=col)
    style.legend_key(fig, sorted(p["model"].unique()) if len(p) else [], style.drawn_placements(fig, parity))
    fig.update_layout(title=title, template=style.TEMPLATE, height=440)
    return style.with_meta(fig, not_drawn=not_drawn)


def transfer_waiting_figure(by_placement: pd.DataFrame,
                            title: str = "DDP hook time: transfer (benchmark) vs waiting for other ranks") -> go.Figure:
    """Per placement (kanlib.analysis.commmodel.transfer_waiting_by_placement): the median hook time per step
    split into the transfer the collective benchmark predicts for the run's buckets and the rest, waiting
    for the slower rank (negative when the benchmark predicts more than the hook saw)."""
    fig = go.Figure()
    x = by_placement["placement"].astype(str)
    for part in ("transfer", "waiting"):
        fig.add_trace(go.Bar(x=x, y=by_placement[f"{part}_s"] * 1e3, name=part,
                             marker=dict(color=TRANSFER_COLORS[part]),
                             hovertext=[f"{p}: {part} {v * 1e3:.3g} ms of {t * 1e3:.3g} ms ({runs} runs)"
                                        for p, v, t, runs in zip(x, by_placement[f"{part}_s"],
                                                                 by_placement["comm_total_s"],
                                                                 by_placement["n_runs"])], hoverinfo="text"))
    fig.update_layout(barmode="relative", title=title, template=style.TEMPLATE, height=400,
                      yaxis_title="hook time per step (ms)", xaxis_title="placement (nodes x processes per node)")
    return fig


# -- the section's part ------------------------------------------------------------------------------
def _add_checks(a: StudyAnalysis, ctx: Context, fits: dict) -> None:
    """The constants, every point, the known-signal check and DDP through the emulated link."""
    a.extra["fits"] = fits
    a.add_table("links", display_table(table(ctx)), (
        "Fitted link constants per backend, algorithm and emulated link (non-negative relative least squares; +- "
        "the relative standard error). A constant the data cannot resolve is named so with the reason, never "
        "printed as 0."))
    a.add_table("points", points_table(fits),
                "Every benchmark point: measured, fitted, and predicted with the point left out of the fit")
    cal, cal_lines = calibration_check(fits, ctx.calibration_tolerance)
    a.lines += cal_lines
    if not cal.empty:
        a.add_table("calibration", cal, "Known-signal check: the emulated link's injected constants against the "
                                        "recovered")
    grow = emulation_growth(communication.records_of(ctx))
    if not grow.empty:
        a.add_table("emulation", grow, (
            "DDP through the emulated link: the hook's time per step with and without it, beside what the link "
            "injected (growth below the injection: the emulated delay absorbed time the plain run spent waiting for "
            "the other rank)"))


def _add_parity(a: StudyAnalysis, ctx: Context, recs: pd.DataFrame, fits: dict) -> None:
    """Every timed DDP run against the model's prediction - the straggler model fitted without the run (leave one
    out), beside the link model alone - and its hook time split into transfer and waiting."""
    parity = commmodel.validate_ddp(recs, fits)
    loo = ddp_parity(ctx)
    if not parity.empty:
        a.extra["parity"] = parity
    if not loo.empty:
        val = commmodel.model_validation(loo)
        a.extra["ddp_parity"], a.extra["validation"] = loo, val
        fig = parity_figure(loo, "The model against every DDP run, each predicted by a fit without it",
                            link_only=parity)
        nd = (fig.layout.meta or {}).get("not_drawn") or []
        ok = parity[parity["pred_exposed_s"].notna()]
        link_err = (f" The link model alone (open grey markers): median |error| step "
                    f"{ok['step_rel_err'].abs().median():.0%}, exposed {ok['exposed_rel_err'].abs().median():.0%}."
                    if len(ok) else "")
        caption = (
            f"Every timed DDP run with a no-op twin ({len(loo)}): step time and exposed communication as the model "
            f"predicts them - the slowest of W ranks' compute (from the no-op twins' per-rank step times at the run's "
            f"placement), slowed by the contention fitted on the other runs, plus the transfer backward does not "
            f"hide (link fit, the run's buckets) - against the measurement; on the dotted line the model is right. "
            f"{val.sentence}{link_err}")
        a.add_figure("parity", fig, caption + (f" Not drawn (no prediction): {'; '.join(nd)}." if nd else ""))
        a.add_table("parity", parity_table(loo, parity if len(parity) == len(loo) else None),
                    "Predicted (leave-one-out) against measured, per DDP run")
        a.lines.append(val.sentence)
    tw = transfer_waiting(recs, fits)
    if not tw.empty:
        a.add_figure("transfer_waiting", transfer_waiting_figure(tw), (
            "The timed hook's communication time per step (medians over plain timed runs) split into the "
            "transfer the benchmark predicts for the run's buckets and the rest, waiting for the other ranks "
            "(skew). A large waiting share means the hook time measures load imbalance, not the network."))
        a.extra["transfer_waiting"] = tw
        a.lines.append("Transfer vs waiting: " + "; ".join(
            f"{r['placement']}: {r['transfer_s'] * 1e3:.3g} ms transfer, {r['waiting_s'] * 1e3:.3g} ms waiting "
            f"({r['waiting_fraction']:.0%} of {r['comm_total_s'] * 1e3:.3g} ms)" for _, r in tw.iterrows()) + ".")


def _largest_bucket(ctx: Context) -> float:
    """The largest gradient bucket cap to model, in bytes: DDP's default cap, or a larger one the communication
    study's records ran."""
    try:
        caps = pd.to_numeric(communication.records_of(ctx)["bucket_cap_mb"], errors="coerce").dropna()
    except (load.NoRecordsError, KeyError):
        caps = pd.Series(dtype=float)
    return max([communication.PLAIN_BUCKET_MB] + caps.tolist()) * 2**20


def analyze(ctx: Context) -> StudyAnalysis:
    """The benchmark figure, the fitted constants and their checks, parity and transfer against waiting."""
    fit = link_fit(ctx)
    a = StudyAnalysis(NAME)
    a.lines.append(fit.sentence)
    if not fit.bench.empty:
        fig = bench_figure(fit.bench, fit.fits, time_col=fit.time_col, largest_bucket_bytes=_largest_bucket(ctx))
        a.add_figure("collbench", fig, (
            "Collective benchmark (barrier before every all-reduce, so no waiting for a late rank): time, algbw = "
            "bytes/time and busbw = algbw x 2(N-1)/N against message size, per placement; dashed lines cross nodes, "
            "red ones go through the emulated link; dotted lines are the fitted model. See the latency floor at "
            "small sizes, the bandwidth plateau at large ones, and the emulated link's added latency."
            + bench_caption_note(fig)))
        a.add_table("collbench", bench_table(fit.bench, fit.time_col), (
            "The collective benchmark in nccl-tests' columns: per series and message size, the time of one "
            f"all-reduce (median over repeats of each size's {fit.time_col}), algbw = bytes / time and busbw = "
            "algbw x 2(N-1)/N"))
    if fit.fits:
        _add_checks(a, ctx, fit.fits)
        _add_parity(a, ctx, communication.records_of(ctx), fit.fits)
    return a


def finding(a: StudyAnalysis) -> list[dict]:
    """The known-signal check, the leave-one-out error of the benchmark points, DDP parity and the waiting share."""
    if a.empty:
        return []
    fits = a.extra.get("fits")
    if not fits:
        return [{"study": SECTION, "topic": "The link model (collective benchmark)",
                 "ours": "not fitted: no collective-benchmark records", "published": PUBLISHED}]
    cal = a.tables.get("calibration")
    parts = []
    if cal is not None and not cal.empty:
        ok = cal.columns[-2]
        parts += [f"injected {r['constant']} {r['injected']}, recovered {r['recovered']} ({r['error']}, within 20%: "
                  f"{r[ok]})" for _, r in cal.iterrows()]
    pts = commmodel.fit_points(fits)
    if len(pts):
        parts.append(f"leave-one-out error of {len(pts)} benchmark points: median "
                     f"{pts['loo_rel_err'].abs().median():.0%}, max {pts['loo_rel_err'].abs().max():.0%}")
    val = a.extra.get("validation")
    if val is not None and val.n_runs:
        parts.append(f"DDP parity, leave-one-out over {val.n_runs} runs: median |error| of the step "
                     f"{commmodel.margin_phrase(val.step_median_abs_err, val.step_median_lo, val.step_margin)}, of "
                     f"the exposed communication "
                     f"{commmodel.margin_phrase(val.exposed_median_abs_err, val.exposed_median_lo, val.exposed_margin)}"
                     f", the largest error of a point's median step {val.far_text}")
    tw = a.extra.get("transfer_waiting")
    if tw is not None and len(tw):
        parts.append("waiting share of the hook time " + ", ".join(
            f"{r['placement']} {r['waiting_fraction']:.0%}" for _, r in tw.iterrows()))
    return [{"study": SECTION, "topic": "Calibration: the link model on a known signal",
             "ours": "; ".join(parts) or "fitted", "published": PUBLISHED}]


def guideline(ctx: Context, goals: Goals) -> tuple[list[dict], list[str]]:
    """None of its own: the communication study's guideline extrapolates its best points with this model."""
    return [], []
