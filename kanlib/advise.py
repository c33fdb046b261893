"""The deployment advisor: from a study folder, or from a few numbers measured on another cluster, the placement,
bucket size, batch per process and the largest world size that keeps a target efficiency, each with its band and the
points it rests on (the model and its check: kanlib.analysis.advisor).

``python -m kanlib.advise OUT --target 0.8 [--widths 64,256,256,1] [--global-batch 4096]`` answers from a study
folder: it needs single-process runs, the collective benchmark and multi-process DDP runs (exit 2 naming what is
missing), and refuses (exit 3, saying why) where its model fails its own leave-one-out check or the question leaves the
range it was measured on by more than it vouches for.

``python -m kanlib.advise --what-if --step-compute-s 0.05 --grad-bytes 1e7 --link a100-hdr --world-sizes 8,64,1024
--target 0.8`` answers for a cluster without a study: a per-device step from a short one-process ``kanlib.train`` run,
the gradient bytes all-reduced per step, and a link preset (kanlib.analysis.presets) or ``--latency-s`` and
``--bandwidth-Bps`` measured with the collective benchmark on two nodes. No stragglers unless ``--rank-cv``: an
optimistic bound.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import pandas as pd

from kanlib.analysis import advisor, fmt, groups, load, presets
from kanlib.analysis import commmodel as cm
from kanlib.analysis.context import Context

DEFAULT_CAPS_MB = (1.0, 4.0, 25.0, 100.0)
"""Bucket sizes the advisor weighs besides those the study measured (25 MiB is DDP's default)."""


@dataclass
class Answer:
    """One recommendation: its ``value`` as a reader wants it, its ``band`` in words, and what it ``rests_on``."""

    question: str
    value: str
    band: str
    rests_on: str


@dataclass
class Advice:
    """The advisor's answers for one configuration and global batch, or why it refuses (``refused``), with its own
    check (``check``, ``loo``: the leave-one-out table), the prediction per bucket size (``predictions``) and what
    the model is made of (``basis``)."""

    config: dict
    global_batch: int
    target: float
    check: advisor.AdvisorCheck
    loo: pd.DataFrame
    answers: list[Answer] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    basis: list[str] = field(default_factory=list)
    predictions: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.refused


def _inputs(ctx: Context) -> tuple[pd.DataFrame, dict]:
    """The folder's records and link fits; :class:`kanlib.analysis.advisor.AdvisorInputError` naming what is
    missing."""
    try:
        df = ctx.runs().data
    except load.NoRecordsError as e:
        raise advisor.AdvisorInputError(f"no training records under {ctx.out_dir!r} ({e})") from None
    missing = []
    if not (df["world_size"] == 1).any():
        missing.append("single-process runs (the strong-scaling study at N=1)")
    fit = ctx.link_fit()
    if fit.fits is None:
        missing.append(f"the collective benchmark (notebook 03; {fit.error or 'no collbench records'})")
    if advisor.ddp_points(df).empty:
        missing.append("multi-process DDP runs (the strong-scaling or communication study)")
    if missing:
        raise advisor.AdvisorInputError(f"{ctx.out_dir}: the advisor needs " + "; ".join(missing))
    return df, fit.fits


def _choose(df: pd.DataFrame, widths, global_batch) -> tuple[dict, int, pd.DataFrame]:
    """The configuration and global batch asked for (default: the DDP points' one measured at the most placements,
    then the most work), and its DDP points."""
    pts = advisor.ddp_points(df)
    if widths is not None:
        pts = pts[pts["widths"] == tuple(int(w) for w in widths)]
        if pts.empty:
            cfg = {"model": "kan", "widths": tuple(int(w) for w in widths), "grid_size": 5, "spline_order": 3}
            if global_batch is None:
                raise advisor.AdvisorInputError(f"widths {list(widths)}: not measured here; give --global-batch too")
            return cfg, int(global_batch), pts
    if global_batch is not None and (pts["global_batch"] == int(global_batch)).any():
        pts = pts[pts["global_batch"] == int(global_batch)]
    score = {}
    keys = [k for k in advisor.CONFIG_KEYS + advisor.KERNEL_KEYS + ("global_batch",) if k in pts]
    for (key, g) in groups.groupby(pts, keys):
        score[tuple(key.items())] = (g["placement"].nunique(), float(g["work_per_process"].max()))
    best = dict(max(score, key=score.get))
    cfg = advisor.config_of(best)
    batch = int(global_batch if global_batch is not None else best["global_batch"])
    return cfg, batch, groups.select_records(pts, {**cfg, "global_batch": batch})


def _world_sizes(max_world_size: int, gpn: int) -> list[int]:
    return [w for w in cm.powers_of_two(max_world_size) if w <= gpn or w % gpn == 0]


def _largest(pred: pd.DataFrame, col: str, target: float) -> int | None:
    return cm.largest_world_size_at(pred.assign(efficiency=pred[col]), target)


def advise(out_dir: str | None = None, target: float = 0.8, widths=None, global_batch: int | None = None,
           gpus_per_node: int = 0, max_world_size: int = 1024, ctx: Context | None = None) -> Advice:
    """The advisor on a study folder (or a :class:`Context`): for the configuration ``widths`` (default: the one the
    DDP runs measured at the most placements) at ``global_batch``, the largest world size up to ``max_world_size``
    whose predicted strong-scaling efficiency stays at or above ``target``, the batch per process there, the bucket
    size and the placement (nodes of ``gpus_per_node``; 0: the most processes the benchmark ran on one node), each
    with its band (the largest leave-one-out error of the check) and the points it rests on. Raises
    :class:`kanlib.analysis.advisor.AdvisorInputError` when the folder lacks a study it needs; ``Advice.refused`` says
    why it will not answer."""
    if not 0 < target <= 1:
        raise ValueError(f"target: must be in (0, 1], got {target!r}")
    ctx = ctx or Context(out_dir)
    df, fits = _inputs(ctx)
    loo, check = advisor.loo_check(df, fits)
    cfg, batch, pts = _choose(df, widths, global_batch)
    adv = Advice(cfg, batch, target, check, loo)
    adv.basis.append(check.sentence)
    if not check.ok:
        adv.refused.append(f"its model failed its own check: {check.why}")
        return adv
    comp = advisor.compute_of(df, cfg)
    model = advisor.link_model_for(fits, pts.iloc[0] if len(pts) else df[df["world_size"] > 1].iloc[0])
    bench = ctx.link_fit().bench
    gpn = gpus_per_node or int(max(bench.loc[bench["nnodes"] == 1, "nproc_per_node"].max(), 1))
    own = pd.to_numeric(loo.get("own_host_factor", pd.Series(dtype=float)), errors="coerce").dropna()
    hf = float(own.median()) if len(own) else 1.0  # every point in: the check left each out in turn
    n_params = sum(advisor.param_bytes(cfg)) / 4
    adv.basis += [f"Compute: {comp.source}: {comp.profile.seconds_per_sample_param:.3g} s per sample-parameter, fixed "
                  f"{comp.profile.fixed_s * 1e3:.3g} ms, per-process work measured {comp.work_range[0]:.3g}-"
                  f"{comp.work_range[1]:.3g} sample-parameters; per-rank spread sigma {comp.rank_sigma:.3f}.",
                  f"Links: {model.label}: {model.describe()}; nodes of {gpn} processes.",
                  f"Host factor {hf:.3g} (a process's compute at N > 1 over one alone, fitted on the DDP points)."]
    if not comp.vouched(n_params * batch / 2):
        adv.refused.append(f"{n_params * batch / 2:.3g} sample-parameters per process at N=2 is beyond "
                           f"{advisor.VOUCH_FACTOR:g}x the single-process work measured "
                           f"({comp.work_range[0]:.3g}-{comp.work_range[1]:.3g})")
        return adv
    _answer(adv, model, comp, pts, bench, gpn, hf, max_world_size)
    return adv


def _predict(adv: Advice, model, comp, gpn: int, hf: float, cap: float, max_world_size: int) -> pd.DataFrame:
    pred = cm.predict_scaling(model, comp.profile, advisor.param_bytes(adv.config),
                              _world_sizes(max_world_size, gpn), gpn, global_batch=adv.global_batch,
                              bucket_cap_mb=cap, rank_sigma=comp.rank_sigma, host_factor=hf)
    pred = advisor.with_band(pred, adv.check.max_abs_err)
    pred["work_per_process"] = sum(advisor.param_bytes(adv.config)) / 4 * pred["local_batch"]
    pred["vouched"] = [comp.vouched(w) for w in pred["work_per_process"]]
    return pred


def _answer(adv: Advice, model, comp, pts: pd.DataFrame, bench: pd.DataFrame, gpn: int, hf: float,
            max_world_size: int) -> None:
    """The four answers: world size, batch per process, bucket size, placement."""
    sizes = bench["size_bytes"].to_numpy(float)
    caps = sorted(set(DEFAULT_CAPS_MB) | set(pts["bucket_cap_mb"].astype(float) if len(pts) else []))
    preds = {}
    for cap in caps:
        b = cm.ddp_buckets(advisor.param_bytes(adv.config), cap)
        if max(b) > sizes.max() * advisor.VOUCH_FACTOR or min(b) < sizes.min() / advisor.VOUCH_FACTOR:
            continue  # buckets beyond the messages the benchmark measured
        preds[cap] = _predict(adv, model, comp, gpn, hf, cap, max_world_size)
    adv.predictions = preds
    if not preds:
        adv.refused.append(f"every bucket size weighed gives messages beyond {advisor.VOUCH_FACTOR:g}x the benchmark's "
                           f"{fmt.nbytes(sizes.min())}-{fmt.nbytes(sizes.max())}")
        return
    target, e = adv.target, adv.check.max_abs_err
    pick = 25.0 if 25.0 in preds else next(iter(preds))
    best_n = {cap: advisor_largest(p, target)[0] for cap, p in preds.items()}
    n_ref = max((n for n in best_n.values() if n), default=None) or 2
    at_ref = {cap: float(p.set_index("world_size").loc[n_ref, "efficiency"]) for cap, p in preds.items()
              if n_ref in set(p["world_size"])}
    top = max(at_ref, key=at_ref.get)
    tied = [c for c, v in at_ref.items() if v >= at_ref[top] / (1 + e)] if e > 0 else [top]
    cap = pick if pick in tied else top
    pred = preds[cap]
    n, n_lo, n_hi, edge = advisor_largest(pred, target)
    rests = (f"{adv.check.n_points} DDP point(s) checked ({', '.join(sorted(set(adv.loo['placement'].dropna())))}), "
             f"{comp.source}, the link fit ({model.label})")
    band = f"{n_lo or 1}-{n_hi or 1} within the ±{e:.0%} band"
    if n is None:
        adv.answers.append(Answer("largest world size at the target", "none beyond 1", band, rests))
    else:
        eff = float(pred.set_index("world_size").loc[n, "efficiency"])
        adv.answers.append(Answer("largest world size at the target", (f"at least {n}" if edge else f"{n}")
                                  + f" ({fmt.pct1(eff)} predicted)"
                                  + (f"; beyond, the work per process leaves {advisor.VOUCH_FACTOR:g}x the measured"
                                     if edge else ""), band, rests))
    per = [adv.global_batch / max(v or 1, 1) for v in (n, n_hi, n_lo)]
    adv.answers.append(Answer("batch per process", f"{per[0]:.4g} (global batch {adv.global_batch} over {n or 1})",
                              f"{per[1]:.4g}-{per[2]:.4g}", "the largest world size's answer"))
    caps_txt = ", ".join(f"{c:g} MiB {fmt.pct1(v)}" for c, v in sorted(at_ref.items()))
    adv.answers.append(Answer("bucket size", f"{cap:g} MiB" + (" (no difference within the band: "
                                                                + ", ".join(f"{c:g}" for c in sorted(tied)) + " MiB)"
                                                                if len(tied) > 1 else ""),
                              f"predicted efficiency at N={n_ref}: {caps_txt}",
                              f"the link fit over {fmt.nbytes(sizes.min())}-{fmt.nbytes(sizes.max())} messages"))
    adv.answers.append(_placement(adv, model, comp, cap, max(n or 2, 2), gpn, hf, e))


def advisor_largest(pred: pd.DataFrame, target: float) -> tuple[int | None, int | None, int | None, bool]:
    """The largest world size at the target within the vouched range, at the point prediction and at either end of
    its band, and whether the vouched range ended before the target was lost."""
    v = pred[pred["vouched"] | (pred["world_size"] == 1)]
    n = _largest(v, "efficiency", target)
    edge = n is not None and n == int(v["world_size"].max()) and n < int(pred["world_size"].max())
    return n, _largest(v, "efficiency_lo", target), _largest(v, "efficiency_hi", target), edge


def _placement(adv: Advice, model, comp, cap: float, n: int, gpn: int, hf: float, e: float) -> Answer:
    """Fill nodes of ``gpn`` processes, or one process per node, at world size ``n``."""
    packed = advisor.predict_point(model, comp, adv.config, n, min(n, gpn), adv.global_batch, cap, hf)
    try:
        spread = advisor.predict_point(model, comp, adv.config, n, 1, adv.global_batch, cap, hf)
    except ValueError as err:  # no inter-node link in the fit
        return Answer(f"placement at N={n}", f"{int(packed['nnodes'])}x{int(packed['nproc_per_node'])}",
                      "the only one the fit can predict", f"the intra-node link alone ({err})")
    options = {f"{int(p['nnodes'])}x{int(p['nproc_per_node'])}": float(p["step_time_s"]) for p in (packed, spread)}
    ranked = sorted(options, key=options.get)  # fewer nodes first on a tie
    best, other = ranked[0], ranked[-1]
    value = best
    if other != best and options[other] <= options[best] * (1 + e):  # apart by no more than the model's own error
        value = f"{best} (no difference within the band from {other})"
    measured = adv.loo[["placement", "step_time_s", "pred_step_time_s"]].dropna() if "pred_step_time_s" in adv.loo \
        else pd.DataFrame()
    pts = "; ".join(f"{r['placement']} measured {fmt.ms(r['step_time_s'])} ms, predicted without it "
                    f"{fmt.ms(r['pred_step_time_s'])} ms" for _, r in measured.iterrows())
    return Answer(f"placement at N={n}", value,
                  "; ".join(f"{k} {fmt.ms(v)} ms per step" for k, v in options.items()) + f" (±{e:.0%})",
                  f"intra {model.link('intra').describe()}; inter {_inter(model)}; {pts}")


def _inter(model) -> str:
    try:
        return model.link("inter").describe()
    except ValueError:
        return "not measured"


# -- printing and the command line -----------------------------------------------------------------------
def advice_text(adv: Advice) -> str:
    """The advice as a reader reads it: what was asked, the check with its points, then the answers or why not."""
    cfg = adv.config
    lines = [f"Advisor for {cfg['model']} {list(cfg['widths'])} (G={cfg['grid_size']}, k={cfg['spline_order']}), "
             f"global batch {adv.global_batch}, target efficiency {adv.target:.0%}", ""]
    lines += adv.basis + ["", "Leave-one-out points (measured step, predicted without it, error):"]
    for _, r in adv.loo.iterrows():
        if isinstance(r.get("why"), str):
            lines.append(f"  {r.get('label', '')}: not predicted ({r['why']})")
        else:
            lines.append(f"  {r['label']}: {fmt.ms(r['step_time_s'])} ms, {fmt.ms(r['pred_step_time_s'])} ms, "
                         f"{r['rel_err']:+.1%}")
    lines.append("")
    if adv.refused:
        lines.append("REFUSED: " + "; ".join(adv.refused) + ".")
        return "\n".join(lines)
    for a in adv.answers:
        lines += [f"{a.question}: {a.value}", f"    band: {a.band}", f"    rests on: {a.rests_on}"]
    return "\n".join(lines)


def what_if_text(pred: pd.DataFrame, target: float, link: str) -> str:
    """The what-if's table and its largest world size at the target."""
    n = cm.largest_world_size_at(pred, target)
    lines = [f"What-if on {link} (a model of another machine, no study: no stragglers unless --rank-cv, no "
             f"congestion)", f"{'N':>6} {'placement':>9} {'compute ms':>11} {'comm ms':>9} {'exposed ms':>11} "
                             f"{'step ms':>9} {'efficiency':>10}"]
    for _, r in pred.iterrows():
        placement = f"{int(r['nnodes'])}x{int(r['nproc_per_node'])}"
        lines.append(f"{int(r['world_size']):>6} {placement:>9} "
                     f"{r['compute_s'] * 1e3:>11.4g} {r['comm_s'] * 1e3:>9.4g} {r['exposed_s'] * 1e3:>11.4g} "
                     f"{r['step_time_s'] * 1e3:>9.4g} {r['efficiency']:>10.1%}")
    lines.append(f"largest world size at {target:.0%}: " + (f"{n}" if n else "none of those asked"))
    return "\n".join(lines)


def _link_model(args) -> tuple[cm.LinkModel, str]:
    if args.link and (args.latency_s is not None or args.bandwidth_Bps is not None):
        raise ValueError("--link: give a preset or --latency-s with --bandwidth-Bps, not both")
    if args.link:
        p = presets.preset(args.link)
        return p.link_model(args.algo), f"preset {p.name} ({args.algo})"
    if args.latency_s is None or args.bandwidth_Bps is None:
        raise ValueError("--what-if needs --link PRESET, or --latency-s and --bandwidth-Bps")
    links = {k: cm.Link.given(k, args.latency_s, args.bandwidth_Bps) for k in ("intra", "inter")}
    model = cm.LinkModel(args.algo, links, label="given link")
    return model, f"a link of {args.latency_s * 1e6:.3g} us and {args.bandwidth_Bps / 1e9:.3g} GB/s (every hop)"


def _ints(text: str) -> list[int]:
    return [int(v) for v in str(text).replace(" ", "").split(",") if v]


def main(argv: list[str] | None = None) -> int:
    """Advise on placement, bucket size, batch per process and world size from a study folder, or for another
    machine with --what-if. Exit 0: answered; 2: bad arguments or a folder without the studies needed; 3: refused."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kanlib.advise", description=main.__doc__)
    ap.add_argument("out_dir", nargs="?", help="a study folder (not with --what-if)")
    ap.add_argument("--target", type=float, default=0.8, help="target parallel efficiency (0, 1]")
    ap.add_argument("--widths", type=_ints, help="the KAN asked about, e.g. 64,256,256,1")
    ap.add_argument("--global-batch", type=int, help="global batch (strong scaling)")
    ap.add_argument("--gpus-per-node", type=int, default=0, help="processes per node (0: the study's / the preset's)")
    ap.add_argument("--max-world-size", type=int, default=1024)
    ap.add_argument("--what-if", action="store_true", help="a machine without a study (the options below)")
    ap.add_argument("--step-compute-s", type=float, help="one process's step compute (s)")
    ap.add_argument("--grad-bytes", type=float, help="gradient bytes all-reduced per step")
    ap.add_argument("--link", help=f"a link preset: {', '.join(presets.PRESETS)}")
    ap.add_argument("--latency-s", type=float, help="per-hop latency of the link (s)")
    ap.add_argument("--bandwidth-Bps", type=float, help="bandwidth of the link (bytes/s)")
    ap.add_argument("--world-sizes", type=_ints, default=[8, 64, 1024])
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--scaling", choices=("weak", "strong"), default="weak")
    ap.add_argument("--algo", choices=cm.ALGOS, default="ring")
    ap.add_argument("--rank-cv", type=float, default=0.0, help="per-rank variability of the step (0: none)")
    args = ap.parse_args(argv)
    try:
        if args.what_if:
            if args.step_compute_s is None or args.grad_bytes is None:
                raise ValueError("--what-if needs --step-compute-s and --grad-bytes")
            model, link = _link_model(args)
            gpn = args.gpus_per_node or (presets.preset(args.link).gpus_per_node if args.link else 8)
            pred = advisor.what_if(args.step_compute_s, args.grad_bytes, model, args.world_sizes, gpn, args.bucket_mb,
                                   scaling=args.scaling, rank_cv=args.rank_cv)
            print(what_if_text(pred, args.target, link))
            return 0
        if not args.out_dir:
            raise ValueError("give a study folder, or --what-if")
        adv = advise(args.out_dir, args.target, args.widths, args.global_batch, args.gpus_per_node,
                     args.max_world_size)
    except (advisor.AdvisorInputError, ValueError) as e:
        print(f"kanlib.advise: {e}", file=sys.stderr)
        return 2
    print(advice_text(adv))
    return 0 if adv.ok else 3


if __name__ == "__main__":
    raise SystemExit(main())


REPORT_PRESETS = ("a100-hdr", "h100-ndr")
"""The link presets the report draws the advisor's what-if on, beside the study's own machine."""


def report_section(ctx: Context, target: float = 0.8, world_sizes=(1, 2, 8, 64, 512, 1024)) -> str:
    """The report's advisor section (HTML): the quantities that carry per placement and work size
    (:func:`kanlib.analysis.advisor.carried_quantities`), the advice with its leave-one-out check or why it refuses,
    and predicted efficiency against world size for the study's own machine (its measured compute and fitted links)
    and for :data:`REPORT_PRESETS` (the same measured per-process compute and gradient bytes on a preset's links):
    what the study says about another machine."""
    import html

    from kanlib.analysis import style
    from kanlib.analysis.style import go

    try:
        df, fits = _inputs(ctx)
    except advisor.AdvisorInputError as e:
        return f"<p class='note'>{html.escape(str(e))}: no advice.</p>"
    carried = advisor.carried_quantities(df, fits)
    adv = advise(ctx=ctx, target=target)
    body = "<p class='note'>" + html.escape(" ".join(adv.basis[:1])) + "</p>"
    body += ("<p class='warn'>The advisor refuses: " + html.escape("; ".join(adv.refused)) + ".</p>" if adv.refused
             else "<table class='decisions'><tr><th>question</th><th>answer</th><th>band</th><th>rests on</th></tr>"
             + "".join(f"<tr><td>{html.escape(a.question)}</td><td>{html.escape(a.value)}</td>"
                       f"<td>{html.escape(a.band)}</td><td>{html.escape(a.rests_on)}</td></tr>" for a in adv.answers)
             + "</table>")
    if len(carried):
        body += ("<details><summary><b>Quantities that carry to another machine</b> (per placement and work size)"
                 "</summary>" + carried.to_html(index=False, classes="table", border=0, float_format="%.4g")
                 + "</details>")
    if len(adv.loo):
        body += ("<details><summary><b>Leave-one-out check</b>: each multi-process point predicted without its own "
                 "DDP step</summary>" + adv.loo.to_html(index=False, classes="table", border=0,
                                                         float_format="%.4g") + "</details>")
    fig = go.Figure()
    comp = advisor.compute_of(df, adv.config)
    grad_bytes = float(sum(advisor.param_bytes(adv.config)))
    step_s = comp.profile.seconds_per_sample_param * grad_bytes / 4 * adv.global_batch + comp.profile.fixed_s
    curves = []
    for name in ("this machine",) + REPORT_PRESETS:
        if name == "this machine":
            pts = advisor.ddp_points(df)
            model = advisor.link_model_for(fits, pts.iloc[0] if len(pts) else df[df["world_size"] > 1].iloc[0])
            label = f"this machine's links ({model.label})"
        else:
            model, label = presets.preset(name).link_model("ring"), f"preset {name} links (ring)"
        try:
            pred = advisor.what_if(step_s, grad_bytes, model, [w for w in world_sizes if w <= 2 or w % 8 == 0],
                                   gpus_per_node=8, scaling="strong")
        except ValueError:
            continue
        curves.append((label, pred))
        fig.add_trace(go.Scatter(x=pred["world_size"], y=pred["efficiency"], mode="lines+markers", name=label))
    fig.add_hline(y=target, line_dash="longdash", annotation_text=f"target {target:.0%}")
    style.axis_titles(fig, x="world size (processes; nodes of 8)", y="predicted strong-scaling efficiency (fraction)")
    fig.update_layout(title="What this study predicts on other links (the measured compute per process)",
                      xaxis_type="log", height=380, margin=dict(t=50))
    body += fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False)
    body += (f"<p class='caption'>Predicted efficiency at a global batch of {adv.global_batch} for "
             f"{adv.config['model']} {list(adv.config['widths'])}: the compute one process measured here "
             f"({step_s * 1e3:.3g} ms per step at N=1, {grad_bytes / 2**20:.3g} MiB of gradients) on this machine's "
             f"fitted links and on presets' links. A what-if of the model (no stragglers, no congestion), not a "
             f"measurement; `python -m kanlib.advise --what-if` takes your own cluster's numbers.</p>")
    return body
