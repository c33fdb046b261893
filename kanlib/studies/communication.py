"""Communication: exposed communication by the no-op-hook method, per placement, bucket size and NCCL algorithm.

Each point runs with a timed all-reduce hook and with a no-op hook (same bucketing, no network); the exposed
communication is the difference, clipped to the hook's total all-reduce time. Plain DDP (the timed
full-precision hook, no other option) is what placements, buckets and the calibrated model are judged on; the
options are weighed against it in kanlib.studies.options. Guideline: the placement and bucket size exposing the
least communication, and the largest world size the link model calibrated on the collective benchmark predicts
at the target.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kanlib.analysis import claims, commmodel, fmt, groups, stats, style, twins
from kanlib.analysis.context import Context, Goals, disturbed_why, unanswered
from kanlib.analysis.explorer import View
from kanlib.analysis.section import StudyAnalysis
from kanlib.analysis.style import go
from kanlib.analysis.table import Table

NAME = SECTION = RECORDS = "communication"
TITLE = "Communication: overhead, the calibrated link model, data-parallel options"
PAPER = claims.PUBLISHED
PUBLISHED_RANGE = f"{PAPER['overhead_fraction_min']:.1%}-{PAPER['overhead_fraction_max']:.1%}"
PUBLISHED = f"communication overhead {PUBLISHED_RANGE} of the step"
CONFIRM_UP_TO = 1.5
"""The measured overhead confirms the published range while its largest point is at most this many times the
paper's largest."""
AXES = ("comm_hook", "emulate_latency_s", "emulate_bandwidth_bytes_per_s", "nnodes", "nproc_per_node",
        "bucket_cap_mb", "nccl_algo")
"""What varies within a group: the no-op run is each point's reference; emulation applies to the hooked runs."""
SWEPT = ("nnodes", "nproc_per_node", "bucket_cap_mb", "nccl_algo", "comm_hook", "emulate_latency_s",
         "emulate_bandwidth_bytes_per_s", "grad_accum_steps", "gradient_as_bucket_view", "static_graph",
         "powersgd_rank")
EXPLORER = View(x=("world_size", "bucket_cap_mb", "n_params"),
                series=("comm_hook", "grad_accum_steps", "gradient_as_bucket_view", "static_graph"))
OPTION_FIELDS = {"comm_hook": "timed", "grad_accum_steps": 1, "gradient_as_bucket_view": False, "static_graph": False}
"""The data-parallel options of the study and their plain-DDP values."""
PLAIN_BUCKET_MB = 25.0
"""DDP's default bucket cap: the plain point a bucket-size option is compared with."""


def design(df: pd.DataFrame) -> groups.Design:
    """How this study's records split (:func:`kanlib.analysis.groups.design`)."""
    return _with_twins(groups.design(df, NAME, AXES, SWEPT), df)


def _with_twins(d: groups.Design, df: pd.DataFrame) -> groups.Design:
    """``d`` without the MLP twins' widths among its several sweeps: one sweep runs the KAN beside its
    matched-parameter MLP (whose widths differ), so widths that vary only through the twins are one sweep's."""
    if "widths" in d.several_sweeps and "model" in df and not groups.varies(subject_rows(df)["widths"]):
        d.several_sweeps = [f for f in d.several_sweeps if f != "widths"]
    return d


def subject_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``df`` (records or a table) of the study's subject: every model but the matched-parameter MLP
    twins (:data:`kanlib.analysis.twins.TWIN_MODEL`); all rows when the frame holds no other model."""
    if "model" not in df or not len(df):
        return df
    keep = df["model"] != twins.TWIN_MODEL
    return df[keep] if keep.any() else df


def subject(t: Table) -> Table:
    """:func:`subject_rows` of a table, its group fields less those that no longer vary (the twins' widths)."""
    rows = subject_rows(t.data)
    if len(rows) == len(t.data):
        return t
    return t.with_data(rows.copy(), [f for f in t.groups if f == "model" or f not in rows or groups.varies(rows[f])])


def table(df: pd.DataFrame, n_boot: int = stats.N_BOOT, seed: int = stats.SEED) -> Table:
    """Exposed communication by the no-op-hook method, per point (group, placement, bucket size, NCCL
    algorithm) and communication hook.

    Each point needs runs with a real communication hook (``timed``, or ``bf16``/``fp16``/``powersgd``,
    each bucket timed; possibly through an emulated link) and runs with ``comm_hook='noop'`` (same
    bucketing, no network). With medians over repeats:

    - ``t_allreduce_s``: step time with the hook's communication; ``t_noop_s``: step time without it;
    - ``comm_total_s``: summed bucket communication time per step (includes queueing and waiting);
    - ``exposed_raw_s = t_allreduce_s - t_noop_s``: the communication the step waits for;
    - ``exposed_s``: the same clipped to ``[0, comm_total_s]`` (outside it is timing noise;
      ``exposed_clipped`` says when that happened);
    - ``overlap_s = comm_total_s - exposed_s``; ``overlap_fraction = overlap_s / comm_total_s``;
    - ``overhead_fraction = exposed_s / t_allreduce_s`` (the study's 'communication overhead'), with a
      bootstrap interval ``overhead_lo``/``overhead_hi`` resampling both kinds of run (of the difference
      clipped at 0 only, so the no-op runs' noise shows; it always holds the point);
    - ``compute_s = t_allreduce_s - exposed_s``;
    - ``exposed_rounds``: ``((repeat, seconds), ...)``, per round the timed runs' step minus the no-op twins' step
      of the same round (they ran back to back in one launch): what the guidelines compare points on, paired by
      round (:func:`exposes_more`), so that load drifting between rounds does not widen the comparison;
      ``comm_total_rounds``: the same rounds' hook time per step;
    - ``n_params``: trainable parameters; ``grad_bytes``: bytes DDP all-reduces per step (the sum of the timed runs'
      ``bucket_bytes``; NaN for records without them).

    Groups are every other config field that differs (grid size, ``kan_impl``, widths, ...). Raises KeyError
    when no point has both kinds of run.
    """
    have = set(df["comm_hook"].unique()) if "comm_hook" in df else set()
    if "noop" not in have or not have - {"noop", "default"}:
        raise KeyError("communication_table needs runs with comm_hook 'noop' and with a timed hook "
                       f"('timed', 'bf16', 'fp16' or 'powersgd'); have {sorted(have)}")
    df, dropped = groups.valid(groups.with_placement(df), "step_time_s")
    for c in ("emulate_latency_s", "emulate_bandwidth_bytes_per_s"):
        if c not in df:
            df[c] = 0.0
    d = _with_twins(groups.groups_of(df, NAME, AXES, SWEPT), df)
    point = list(dict.fromkeys(d.groups + [k for k in ("nnodes", "nproc_per_node", "bucket_cap_mb", "nccl_algo")
                                           if k in df]))
    rows = []
    for key, g in groups.groupby(df, point):
        z = g[g["comm_hook"] == "noop"]
        if z.empty:
            continue
        hooked = g[~g["comm_hook"].isin(["noop", "default"])]
        for hk, t in groups.groupby(hooked, ["comm_hook", "emulate_latency_s", "emulate_bandwidth_bytes_per_s"]):
            rows.append({**key, **hk, **_point(key, t, z, n_boot, seed)})
    out = pd.DataFrame(rows)
    if not out.empty:
        out = out.sort_values(["world_size", "nnodes", "bucket_cap_mb"], kind="stable").reset_index(drop=True)
    return groups.finish(out, d, dropped, "step_time_s")


def _point(key: dict, t: pd.DataFrame, z: pd.DataFrame, n_boot: int, seed: int) -> dict:
    """One row of the table: the hooked runs ``t`` of a point against its no-op runs ``z``."""
    tz = z["step_time_s"].to_numpy(float)
    tn, tn_lo, tn_hi = stats.median_ci(tz, n_boot, seed)
    ta_v = t["step_time_s"].to_numpy(float)
    ta, ta_lo, ta_hi = stats.median_ci(ta_v, n_boot, seed)
    ct_v = groups.numbers(t, "comm_total_s")
    ct = float(np.nanmedian(ct_v)) if np.isfinite(ct_v).any() else float("nan")
    raw = ta - tn
    exposed = float(np.clip(raw, 0.0, ct)) if np.isfinite(ct) else max(raw, 0.0)
    # The interval is that of the unclipped difference (clipped at 0 only), widened to hold the point:
    # clipping the bootstrap at comm_total_s too collapsed it onto that bound whenever the no-op runs
    # were noisy ("27% [27%, 28%]" where two runs of the same point measured 20% and 28%).
    ov_lo, ov_hi = stats.exposed_share_ci(ta_v, tz, n_boot, seed)
    ov_lo, ov_hi = min(ov_lo, exposed / ta), max(ov_hi, exposed / ta)
    n = int(key["nnodes"]) * int(key["nproc_per_node"])
    # per round, the timed runs' step against the no-op twins' of the same round (one launch, back to back)
    med = lambda g: np.median(g["step_time_s"].to_numpy(float))  # noqa: E731
    noop_r = dict(stats.by_round(z, med))
    rounds = tuple((r, v - noop_r[r]) for r, v in stats.by_round(t, med) if r in noop_r)
    total_rounds = stats.by_round(t, lambda g: twins.median_finite(groups.numbers(g, "comm_total_s")))
    sent = [sum(b) for b in t.get("bucket_bytes", pd.Series(dtype=object)) if isinstance(b, (list, tuple)) and b]
    return {"world_size": n, "placement": groups.placement_of(key["nnodes"], key["nproc_per_node"]),
            "inter_node": int(key["nnodes"]) > 1, "n_runs": int(min(len(t), len(z))),
            "t_allreduce_s": ta, "t_allreduce_lo": ta_lo, "t_allreduce_hi": ta_hi,
            "t_noop_s": tn, "t_noop_lo": tn_lo, "t_noop_hi": tn_hi,
            "comm_total_s": ct, "exposed_raw_s": raw, "exposed_s": exposed, "exposed_clipped": bool(exposed != raw),
            "overlap_s": ct - exposed, "overlap_fraction": (ct - exposed) / ct if ct > 0 else np.nan,
            "overhead_fraction": exposed / ta, "overhead_lo": ov_lo, "overhead_hi": ov_hi, "compute_s": ta - exposed,
            "exposed_rounds": rounds, "comm_total_rounds": total_rounds,
            "n_params": float(np.median(groups.numbers(t, "n_params"))) if "n_params" in t else np.nan,
            "grad_bytes": float(np.median(sent)) if sent else np.nan}


def plain_ddp(t: Table) -> Table:
    """The rows of a communication table that are plain DDP: the timed full-precision hook and every
    option of :data:`OPTION_FIELDS` at its plain value (a missing value predates the
    option: plain). The option fields leave the group fields, so figures do not facet by them."""
    return t.with_data(plain_rows(t.data).copy(), [f for f in t.groups if f not in OPTION_FIELDS])


def plain_rows(df: pd.DataFrame, skip: tuple = ()) -> pd.DataFrame:
    """The rows of ``df`` (records or a table) with every option of :data:`OPTION_FIELDS` but ``skip`` at its plain
    value (a missing value predates the option: plain)."""
    for f, v in OPTION_FIELDS.items():
        if f in df and f not in skip:
            df = df[df[f].isna() | (df[f].map(groups.hashable) == v)]
    return df


def overhead_points(t: pd.DataFrame) -> pd.DataFrame:
    """The points the published overhead is compared on (the verdict and the finding alike): the KAN's plain-DDP
    points (a ``grad_accum_steps=2`` point is an option), timed hook, own link, with a no-op twin."""
    t = plain_rows(subject_rows(t))
    if t.empty:
        return t
    t = t[(t["comm_hook"] == "timed") & (t["emulate_latency_s"] == 0) & (t["emulate_bandwidth_bytes_per_s"] == 0)]
    return t[np.isfinite(t["overhead_fraction"].to_numpy(float))]


def option_label(opts: dict, bucket_cap_mb: float, powersgd_rank: int | None = None) -> str:
    """A readable name of a data-parallel option set: ``plain DDP``, ``bf16``, ``powersgd rank 1``,
    ``grad_accum_steps=2``, ``0.05 MiB buckets``, joined by ``+``."""
    parts = []
    hook = opts.get("comm_hook", "timed")
    if hook != "timed":
        parts.append(f"powersgd rank {int(powersgd_rank or 1)}" if hook == "powersgd" else hook)
    if int(opts.get("grad_accum_steps", 1)) != 1:
        parts.append(f"grad_accum_steps={int(opts['grad_accum_steps'])}")
    for f in ("gradient_as_bucket_view", "static_graph"):
        if bool(opts.get(f, False)):
            parts.append(f)
    if float(bucket_cap_mb) != PLAIN_BUCKET_MB:
        parts.append(f"{float(bucket_cap_mb):g} MiB buckets")
    return " + ".join(parts) or "plain DDP"


# -- KAN against its matched-parameter MLP -------------------------------------------------------------


def gradient_structure(t: Table, n_boot: int = stats.N_BOOT, seed: int = stats.SEED) -> pd.DataFrame:
    """Per point (placement, bucket size, NCCL algorithm, emulated link; plain DDP, timed hook) measured with the
    KAN and its matched-parameter MLP twin (:data:`kanlib.analysis.twins.TWIN_MODEL`, the same global batch and every other group field):
    the two models' exposed communication (``exposed_rounds``) and hook time per step (``comm_total_rounds``),
    compared round by round (:func:`kanlib.analysis.stats.paired_difference`, KAN minus MLP), beside the two models'
    parameters and gradient bytes all-reduced per step.

    Columns: ``group`` (the KAN's group label), the pair fields, ``kan_widths``/``mlp_widths``,
    ``kan_params``/``mlp_params``, ``kan_bytes``/``mlp_bytes``, ``kan_exposed_s``/``mlp_exposed_s`` and
    ``kan_total_s``/``mlp_total_s`` (medians over the rounds both have), ``exposed_diff_s`` (with ``_lo``/``_hi``,
    the 95% interval) and ``total_diff_s`` (likewise), ``n_rounds`` (rounds both have), ``margin_s``
    (:data:`kanlib.analysis.stats.MARGIN` of the MLP's step with the all-reduce: the margin every communication
    decision here allows, :func:`exposes_more`) and ``exposed``/``total``, each :func:`kanlib.analysis.twins.compare_paired`'s outcome.
    Empty when no point has both models."""
    d = plain_rows(t.data)
    if d.empty or "model" not in d or not (d["model"] == twins.TWIN_MODEL).any():
        return pd.DataFrame()
    d = d[d["comm_hook"] == "timed"]
    shared = [f for f in t.group_fields(("model", "widths")) if f not in OPTION_FIELDS]
    keys = shared + [f for f in twins.PAIR_FIELDS if f in d and f not in shared]
    return twins.pair_twins(d, keys, t.group_fields(), n_boot, seed)


def records_of(ctx: Context) -> pd.DataFrame:
    """The study's records with placements, and the emulated link's fields filled (0 = none), once per build."""
    return ctx.comm_records()


def table_of(ctx: Context) -> Table:
    """:func:`table` of the study's records, once per build."""
    return ctx.cached((NAME, "table"), lambda: table(ctx.runs(RECORDS).data))


# -- figure ----------------------------------------------------------------------------------------
def _point_labels(t: pd.DataFrame) -> pd.Series:
    parts = [t["placement"], t["bucket_cap_mb"].map(lambda v: f"{v:g} MiB")]
    if "nccl_algo" in t and t["nccl_algo"].nunique() > 1:
        parts.append(t["nccl_algo"].replace("", "NCCL's choice"))
    if t["comm_hook"].nunique() > 1:
        parts.append(t["comm_hook"])
    emu = (t["emulate_latency_s"] > 0) | (t["emulate_bandwidth_bytes_per_s"] > 0)
    if emu.any():
        parts.append(np.where(emu, [f"link {a * 1e6:g} us" + (f", {b / 1e9:g} GB/s" if b else "")
                                    for a, b in zip(t["emulate_latency_s"], t["emulate_bandwidth_bytes_per_s"])],
                              "no emulation"))
    out = pd.Series(parts[0].astype(str).to_numpy(), index=t.index)
    for p in parts[1:]:
        out = out + ", " + pd.Series(np.asarray(p, dtype=str), index=t.index)
    return out


POINT_AXIS = "point (placement, bucket size, ...)"
"""The x-axis title of the overhead figure: one category per measured point."""
BAND_LABEL = f"published {PUBLISHED_RANGE}"
"""The published overhead range's band in the overhead figure (the numbers are presets.PUBLISHED's)."""


def figure(table: Table, title: str = "Communication overhead") -> go.Figure:
    """Per point (placement, bucket size, ...): step time split into compute (light bar, hidden
    communication included) and exposed communication (solid bar) in the model's colour, the total
    all-reduce time (placement marker), and the exposed share of the step with its interval beside the published
    overhead range (shaded band, :data:`BAND_LABEL`); every overhead panel shares one y range."""
    facets = style.facets(table.data, table.group_fields())
    fig, cols = style.grid(len(facets), 2, [f for f, _ in facets],
                           ["Step time: compute + exposed communication (ms)", "Exposed share of the step (overhead)"])
    # one y range for every overhead panel: the data's highest interval end, never less than the published band
    hi = pd.to_numeric(table.data.get("overhead_hi", table.data["overhead_fraction"]), errors="coerce")
    hi = np.r_[hi.to_numpy(float), table.data["overhead_fraction"].to_numpy(float)]
    hi = hi[np.isfinite(hi)]
    top = min(1.05, max(1.5 * PAPER["overhead_fraction_max"], 1.1 * float(hi.max()) if hi.size else 0.0))
    for i, (label, g) in enumerate(facets):
        g = g.sort_values(["world_size", "nnodes", "bucket_cap_mb"], kind="stable")
        x = _point_labels(g)
        for m, gm in g.groupby("model", sort=True):
            xm, col = x[gm.index], style.model_color(m)
            r, c = style.cell(i, 0, cols, 2)
            fig.add_trace(go.Bar(x=xm, y=gm["compute_s"] * 1e3, name=f"{m} compute", legendgroup=str(m),
                                 showlegend=False, marker=dict(color=col, opacity=0.35)), r, c)
            fig.add_trace(go.Bar(x=xm, y=gm["exposed_s"] * 1e3, name=f"{m} exposed", legendgroup=str(m),
                                 showlegend=False, marker=dict(color=col)), r, c)
            fig.add_trace(go.Scatter(x=xm, y=gm["comm_total_s"] * 1e3, mode="markers", name=f"{m} total comm",
                                     legendgroup=str(m), showlegend=False,
                                     marker=dict(symbol=style.symbols(gm), size=11, color="white",
                                                 line=dict(color=col, width=2))), r, c)
            r, c = style.cell(i, 1, cols, 2)
            fig.add_trace(go.Scatter(x=xm, y=gm["overhead_fraction"], mode="markers", name=f"{m} overhead",
                                     legendgroup=str(m), showlegend=False,
                                     marker=dict(symbol=style.symbols(gm), size=11, color=col),
                                     **style.error_bars(gm, "overhead_fraction", "overhead_lo", "overhead_hi")), r, c)
        r, c = style.cell(i, 0, cols, 2)
        style.axis_titles(fig, POINT_AXIS, "time per step (ms)", r, c)
        r, c = style.cell(i, 1, cols, 2)
        style.axis_titles(fig, POINT_AXIS, "exposed communication / step (%)", r, c)
        fig.update_yaxes(range=[0, top], tickformat=".0%", row=r, col=c)
        style.published_band(fig, PAPER["overhead_fraction_min"], PAPER["overhead_fraction_max"], BAND_LABEL, r, c)
    style.legend_key(fig, sorted(table.data["model"].unique()), style.drawn_placements(fig, table.data),
                     extra=[("bar: compute (light), exposed (solid)", dict(mode="markers", marker=dict(
                         symbol="square", color=style.GREY, size=12))),
                            ("hollow marker: total all-reduce time", dict(mode="markers", marker=dict(
                                symbol="circle", color="white", size=11, line=dict(color=style.GREY, width=2)))),
                            style.band_key(BAND_LABEL)])
    fig.update_layout(barmode="stack", title=title, template=style.TEMPLATE)
    return fig


def analyze(ctx: Context) -> StudyAnalysis:
    """The table and the overhead figure of plain DDP (the calibration and the options follow in their own
    modules of the same section)."""
    t = table_of(ctx)
    kan = subject(t)  # the MLP twins are a control: compared with the KAN below, not drawn as a subject
    plain = plain_ddp(kan)
    a = StudyAnalysis(NAME, table=t)
    a.add_figure("overhead", figure(plain if len(plain) else kan), (
        "Per point (placement, bucket size, ...): step time split into compute with hidden communication (light) "
        "and exposed communication (solid), the total all-reduce time (hollow marker), and the exposed share of "
        f"the step with its bootstrap 95% interval, beside the shaded band of the published {PUBLISHED_RANGE}. "
        "See which placement and bucket size expose the least, and how "
        "much of the all-reduce hides behind the backward pass."
        + (" Plain DDP points only (the timed full-precision hook, no other option); the options follow below."
           if 0 < len(plain) < len(kan) else "")
        + (" The KAN only: its matched-parameter MLP twins are compared with it in the table that follows."
           if len(kan) < len(t) else "")))
    g = gradient_structure(t)
    if len(g):
        a.extra["gradient_structure"] = g
        a.add_table("gradient_structure", twins.display(g), (
            "The KAN against its matched-parameter MLP (the same input and output widths, the parameter count nearest "
            "the KAN's, so the all-reduce carries nearly the same gradient bytes; the bytes are those the timed runs' "
            "buckets held), same global batch, bucket size and placement, run in the same rounds: exposed "
            "communication and the hook's time per step, and the KAN's minus the MLP's median within-round "
            f"difference with its 95% interval. 'larger' where the whole interval lies beyond the margin "
            f"({stats.MARGIN:.0%} of the MLP's step), 'not larger' where it lies within it. The hook time also holds "
            "the wait for the other rank's backward, which is longer for the KAN."))
        a.lines.append(twins.sentence(g))
    return a


def record_label(row) -> str:
    """What names one record in the report's list besides model, widths, batch, placement and repeat: its hook
    and bucket size."""
    return f" {row.get('comm_hook', '')} {row.get('bucket_cap_mb', '')} MiB"


def display_table(t: Table) -> pd.DataFrame:
    """Per point: step with and without the network, the hook's total, the exposed part and its share, overlap."""
    d = t.data
    if d.empty:
        return pd.DataFrame()
    out = {**{f: d[f].map(fmt.value) for f in t.group_fields()}, "placement": d["placement"],
           "bucket (MiB)": d["bucket_cap_mb"].map(lambda v: f"{v:g}")}
    if d["nccl_algo"].nunique() > 1 or (d["nccl_algo"] != "").any():
        out["NCCL algorithm"] = d["nccl_algo"].replace("", "NCCL's choice")
    if d["comm_hook"].nunique() > 1:
        out["hook"] = d["comm_hook"]
    emu = (d["emulate_latency_s"] > 0) | (d["emulate_bandwidth_bytes_per_s"] > 0)
    if emu.any():
        out["emulated link"] = [fmt.link_desc(a, b) if e else "none"
                                for a, b, e in zip(d["emulate_latency_s"], d["emulate_bandwidth_bytes_per_s"], emu)]
    out.update({"runs": d["n_runs"],
                "step (ms)": fmt.ci_column(d, "t_allreduce_s", fmt.ms, "t_allreduce_lo", "t_allreduce_hi"),
                "no-op step (ms)": fmt.ci_column(d, "t_noop_s", fmt.ms, "t_noop_lo", "t_noop_hi"),
                "all-reduce total (ms)": d["comm_total_s"].map(fmt.ms),
                "exposed (ms)": [fmt.ms(v) + (" (clipped)" if c else "") for v, c in
                                 zip(d["exposed_s"], d["exposed_clipped"])],
                "overhead": fmt.ci_column(d, "overhead_fraction", fmt.pct1, "overhead_lo", "overhead_hi"),
                "overlap": d["overlap_fraction"].map(fmt.pct)})
    return pd.DataFrame(out).reset_index(drop=True)


def finding(a: StudyAnalysis) -> list[dict]:
    """The range of the exposed share of the step over plain timed KAN points on the machine's own link; the KAN
    against its matched-parameter MLP (:func:`gradient_structure`) where both ran."""
    if a.empty or a.table is None or a.table.empty:
        return []
    t = overhead_points(a.table.data)
    if t.empty:
        return []
    lo, hi = t.loc[t["overhead_fraction"].idxmin()], t.loc[t["overhead_fraction"].idxmax()]
    labels = _point_labels(t)

    def point(r):
        return f"{fmt.row_ci(r, 'overhead_fraction', fmt.pct1, 'overhead_lo', 'overhead_hi')} ({labels[r.name]})"

    out = [{"study": SECTION, "topic": "Communication overhead (exposed / step)",
            "ours": f"{point(lo)} to {point(hi)} over {len(t)} points", "published": PUBLISHED}]
    g = a.extra.get("gradient_structure")
    if g is None:
        g = gradient_structure(a.table)
    if len(g):
        out.append({"study": SECTION, "topic": "KAN vs matched-parameter MLP: communication at equal gradient bytes",
                    "ours": twins.pairs_text(g), "published": "the overhead is the all-reduce and the link, not KAN's "
                                                         "gradients (not measured)"})
    return out


# -- guideline -------------------------------------------------------------------------------------
def best_bucket(comm: pd.DataFrame, placement: str | None = None) -> dict:
    """The bucket size (and NCCL algorithm) with the least exposed communication at the largest N (of
    ``placement``, when given). Points whose exposed time is not finite are not candidates."""
    c = comm if placement is None else comm[comm["placement"] == placement]
    c = c[np.isfinite(c["exposed_s"].to_numpy(float))]
    if c.empty:
        raise ValueError("best_bucket: no point with a finite exposed communication time")
    n_max = int(c["world_size"].max())
    at = c[c["world_size"] == n_max]
    row = at.loc[at["exposed_s"].idxmin()]
    # the other bucket sizes not measurably worse than the best one: the data do not rank them
    tied = sorted(float(r["bucket_cap_mb"]) for _, r in at.iterrows()
                  if r["bucket_cap_mb"] != row["bucket_cap_mb"] and not exposes_more(row, r))
    return {"world_size": n_max, "placement": row["placement"], "bucket_cap_mb": float(row["bucket_cap_mb"]),
            "nccl_algo": row.get("nccl_algo", "") or "default", "exposed_s": float(row["exposed_s"]),
            "overhead_fraction": float(row["overhead_fraction"]), "overhead_lo": float(row.get("overhead_lo", np.nan)),
            "overhead_hi": float(row.get("overhead_hi", np.nan)), "tied_caps_mb": tied}


def exposes_more(best, other) -> bool:
    """Whether point ``other`` (a row of :func:`table`) exposes measurably more communication than ``best``.

    Paired by round where both have at least :data:`kanlib.analysis.stats.MIN_PAIRS` rounds in common
    (``exposed_rounds``): the 95% interval of the median within-round difference of their exposed times must lie
    above the decision margin, 10% of ``best``'s step (:func:`kanlib.analysis.stats.clearly_larger`). Two
    independent intervals of the overhead share, each from two noisy step times, reached [0%, 51%] in quiet study
    runs where 0.01 MiB buckets exposed 2-3 ms more than 25 MiB ones in every round, so one run ranked them and the
    next did not. Otherwise (records without rounds): the overhead shares' 95% intervals, widened by the margin,
    do not overlap (:func:`kanlib.analysis.stats.intervals_overlap`); without intervals, on the medians (such
    points have too few runs to be ranked on, and the guidelines say so)."""
    paired = stats.clearly_larger(best.get("exposed_rounds"), other.get("exposed_rounds"),
                                  scale=float(best.get("t_allreduce_s", np.nan)))
    if paired is not None:
        return paired
    both = stats.intervals_overlap(best, other)
    return float(other["exposed_s"]) > float(best["exposed_s"]) if both is None else not both


def _overlaps(a, b) -> bool:
    """Whether points ``a`` and ``b`` expose the same communication as far as the data tell (neither exposes
    measurably more, :func:`exposes_more`; a point always ties with itself)."""
    if a is b:
        return True
    lo, hi = (a, b) if a["exposed_s"] <= b["exposed_s"] else (b, a)
    return not exposes_more(lo, hi)


def _least_exposing_placement(g: pd.DataFrame, label: str, rows: list, text: list) -> None:
    """(a) Which placement exposes the least, at each world size measured at several placements."""
    for n, gn in g.groupby("world_size"):
        per = gn[np.isfinite(gn["exposed_s"].to_numpy(float))].sort_values("exposed_s")
        per = per.drop_duplicates("placement")  # each placement's best bucket
        if per["placement"].nunique() < 2:
            continue
        top = per.iloc[0]

        def share(r):
            return fmt.pct_ci(r, "overhead_fraction", "overhead_lo", "overhead_hi")

        rest = "; ".join(f"{r['placement']} {r['exposed_s'] * 1e3:.3g} ms ({share(r)})"
                         for _, r in per.iloc[1:].iterrows())
        tied = per[[_overlaps(top, r) for _, r in per.iterrows()]]
        if len(tied) > 1:  # the intervals overlap: the data do not rank these placements
            names = ", ".join(sorted(tied["placement"], key=groups.placement_key))  # not in measured order
            answer = (f"no measurable difference between {names}: "
                      + "; ".join(f"{r['placement']} {r['exposed_s'] * 1e3:.3g} ms ({share(r)})"
                                  for _, r in tied.iterrows()))
            text.append(f"{label}: at N={n}, {names} expose the same communication within their 95% intervals "
                        f"(least: {top['placement']}, {top['exposed_s'] * 1e3:.3g} ms per step, "
                        f"{top['bucket_cap_mb']:g} MiB buckets); {rest}.")
        else:
            answer = f"{top['placement']}: {top['exposed_s'] * 1e3:.3g} ms exposed ({share(top)} of the step)"
            text.append(f"{label}: at N={n}, {top['placement']} exposes the least communication, "
                        f"{top['exposed_s'] * 1e3:.3g} ms per step ({share(top)} "
                        f"of the step, {top['bucket_cap_mb']:g} MiB buckets); {rest}.")
        rows.append({"question": f"N={n}: placement exposing the least communication", "group": label,
                     "answer": answer, "value": float(top["exposed_s"]), "basis": NAME})


def _best_bucket_answer(g: pd.DataFrame, p: str, label: str, rows: list, text: list) -> dict | None:
    """(b) The bucket size exposing the least communication at placement ``p``; None when there is none."""
    try:
        bb = best_bucket(g, p)
    except ValueError as e:
        text.append(f"{label}, {p}: {e}.")
        return None
    n_buckets = g[(g["placement"] == p) & (g["world_size"] == bb["world_size"])]["bucket_cap_mb"].nunique()
    why = "" if n_buckets > 1 else " (the only bucket size measured)"
    ov = fmt.pct_ci(bb, "overhead_fraction", "overhead_lo", "overhead_hi")
    text.append(f"{label}, {p}: a {bb['bucket_cap_mb']:g} MiB bucket ({bb['nccl_algo']} all-reduce){why} "
                f"exposes the least communication: {bb['exposed_s'] * 1e3:.3g} ms per step, {ov} of the step.")
    answer = f"{bb['bucket_cap_mb']:g} MiB ({bb['nccl_algo']}){why}: {bb['exposed_s'] * 1e3:.3g} ms"
    if bb["tied_caps_mb"]:
        caps = ", ".join(f"{c:g}" for c in sorted([bb["bucket_cap_mb"], *bb["tied_caps_mb"]]))
        answer = f"no measurable difference between {caps} MiB: the least, {answer} ({ov} of the step)"
        text.append(f"{label}, {p}: the 95% intervals of {caps} MiB buckets overlap, so the data do not rank them.")
    rows.append({"question": f"{p}: bucket size minimising exposed communication", "group": label,
                 "answer": answer, "value": bb["exposed_s"], "basis": NAME})
    return bb


def _prediction_answer(sel: pd.DataFrame, key: dict, p: str, label: str, fits: dict, target: float,
                       rows: list, text: list, band: float = float("nan")) -> None:
    """(c) The calibrated model (collective-benchmark fit) extrapolating one placement's best point; ``band``: the
    model's own relative error on exposed communication (kanlib.analysis.context.ModelCheck.exposed_band), which
    travels with the prediction."""
    question = f"{p}: predicted largest world size with efficiency >= {target:g}"
    timed = sel[(sel["comm_hook"] == "timed")
                & (sel["emulate_latency_s"] == key["emulate_latency_s"])
                & (sel["emulate_bandwidth_bytes_per_s"] == key["emulate_bandwidth_bytes_per_s"])]
    try:
        pr = commmodel.calibrated_prediction(timed, sel[sel["comm_hook"] == "noop"], fits, target)
    except ValueError as e:
        text.append(f"{label}, {p}: no calibrated-model extrapolation: {e}.")
        rows.append({"question": question, "group": label, "answer": f"not predicted: {e}",
                     "value": np.nan, "basis": "communication model"})
        return
    n_point = max(pr["world_size"] or 1, 1)  # at the point prediction
    # decided as every threshold answer is (kanlib.analysis.stats.reaches): the largest world size whose band's
    # pessimistic end reaches the target, or whose point prediction does with the pessimistic end within the
    # decision margin; the range the band allows is a detail (the range alone flipped between "2-4" and "2" with the
    # optimistic end at N=4 on either side of 80%: 79.4% in one of nine studies, 80.9-83.5% in eight)
    kc = pr["compute_interval"]
    bw = band if np.isfinite(band) else 0.0
    n_dec, near = commmodel.world_size_reached(pr["prediction"], target, bw, kc)
    n_dec = max(n_dec or 1, 1)
    if n_dec <= 1:
        n_txt = f"that no multi-process world size reaches {target:.0%} strong-scaling efficiency"
        ans = f"none beyond 1: calibrated model; {pr['links']}"
    else:
        n_txt = f"{target:.0%} strong-scaling efficiency up to N={n_dec}"
        ans = f"{n_dec} processes: calibrated model; {pr['links']}"
    lo, hi = (max(n or 1, 1) for n in commmodel.world_size_band(pr["prediction"], target, bw, kc))
    if (lo, hi, n_point) != (n_dec, n_dec, n_dec):
        ans += f"; {n_point} at its point prediction, {lo}-{hi} within its band"
        n_txt += f" ({lo} to {hi} within its band, {n_point} at its point prediction)"
    compute_txt = f"measured compute {kc[0] - 1:+.0%}/{kc[1] - 1:+.0%} (95% interval of the no-op twin's median step)"
    ans += (f"; model error band ±{band:.0%} on exposed communication, " if np.isfinite(band) else "; ") + compute_txt
    text.append(f"{label}, {p}: the model calibrated on the collective benchmark ({pr['fit']}; {pr['links']}; "
                f"leave-one-out error {pr['loo_rel_rmse']:.0%}) with this point's measured compute "
                f"({pr['n_params']} parameters, global batch {pr['global_batch']}, {pr['n_buckets']} "
                f"bucket(s), {pr['placement_per_node']} processes per node) predicts {n_txt}; an optimistic "
                f"bound that ignores stragglers and congestion"
                + (f"; the model's own error, ±{band:.0%} on exposed communication, travels with it"
                   if np.isfinite(band) else "") + f", as does the {compute_txt}.")
    rows.append({"question": question, "group": label, "answer": ans, "value": float(n_dec),
                 "basis": "communication model",
                 "near": stats.near_note([f"N={n} at {fmt.ci_text(e, a, b, fmt.pct)}" for n, e, a, b in near], target,
                                         "the prediction's band")})


def _lost_placements(ctx: Context, points: pd.DataFrame, rows: list, text: list) -> None:
    """Per model and multi-process placement with no plain-DDP point left because every run measured there was
    disturbed and left out: an unanswered bucket-size question (not a silent absence)."""
    left = subject_rows(ctx.left_out(RECORDS))
    if not len(left):
        return
    have = set(zip(points["model"], points["placement"])) if len(points) else set()
    left = left[left["world_size"] > 1]
    for (m, p), lp in left.groupby(["model", "placement"], sort=True):
        if (m, p) in have:
            continue
        answer = unanswered(f"every run at {p} was disturbed", lp)
        text.append(f"{m}, {p}: no bucket size can be recommended: {answer.split(': ', 2)[2]}, every run measured "
                    f"there ({disturbed_why(lp)}).")
        rows.append({"question": f"{p}: bucket size minimising exposed communication", "group": str(m),
                     "answer": answer, "value": np.nan, "basis": NAME})


NO_BENCH = ("Communication model: no collective-benchmark records in this folder, so the calibrated model is not "
            "fitted and nothing is extrapolated (the DDP hook times mix transfer and waiting for other ranks and are "
            "not fitted instead); run the collective-benchmark section of 03_communication_overhead.")


def guideline(ctx: Context, goals: Goals) -> tuple[list[dict], list[str]]:
    """Per group of plain DDP points: (a) the placement exposing the least communication at each world size
    measured at several placements; (b) the bucket size (and NCCL algorithm) exposing the least per placement;
    (c) the largest world size the link model calibrated on the collective benchmark predicts at the target
    (not predicted, and said so, without benchmark records: the DDP hook times mix transfer and waiting)."""
    rows, text = [], []
    fit = ctx.link_fit()
    if fit.error is not None:
        text.append(f"Communication model: the collective benchmark could not be fitted: {fit.error}.")
    try:
        t = plain_ddp(subject(table_of(ctx)))  # the MLP twins are a control, not a deployment to advise on
    except KeyError as e:  # no pair of timed and no-op runs
        _lost_placements(ctx, pd.DataFrame(), rows, text)
        return rows, text + [f"Communication: {e.args[0]}."]
    if t.empty:
        text.append("Communication: no point has both a timed and a no-op run, so nothing can be said.")
        _lost_placements(ctx, t.data, rows, text)
        return rows, text
    _lost_placements(ctx, t.data, rows, text)
    keys, recs, said_no_bench = t.group_fields(), subject_rows(records_of(ctx)), False
    for key, g in groups.groupby(t.data, keys + ["comm_hook", "emulate_latency_s", "emulate_bandwidth_bytes_per_s"]):
        gkey = {k: v for k, v in key.items() if k in keys}
        label = groups.model_label(gkey)
        if key["comm_hook"] != "timed":
            label += f", hook {key['comm_hook']}"
        emulated = bool(key["emulate_latency_s"] or key["emulate_bandwidth_bytes_per_s"])
        if emulated:
            label += f", emulated link {key['emulate_latency_s'] * 1e6:g} us"
        _least_exposing_placement(g, label, rows, text)
        if g.groupby("world_size")["placement"].nunique().max() < 2 and not emulated:  # emulation: multi-node only
            text.append(f"{label}: every world size was measured at one placement only "
                        f"({', '.join(sorted(set(g['placement'])))}), so placements cannot be compared; add e.g. "
                        f"placements ['1x2', '2x1'].")
        for p in sorted(set(g["placement"]), key=groups.placement_key):
            bb = _best_bucket_answer(g, p, label, rows, text)
            if bb is None or key["comm_hook"] != "timed":
                continue  # the model describes the full-precision all-reduce; compressed hooks send other bytes
            if fit.fits is None:
                if not said_no_bench:
                    text.append(NO_BENCH)
                    said_no_bench = True
                rows.append({"question": f"{p}: predicted largest world size with efficiency >= "
                                         f"{goals.target_efficiency:g}", "group": label,
                             "answer": "not predicted: no collective-benchmark records in this folder",
                             "value": np.nan, "basis": "communication model"})
                continue
            check = ctx.model_check()
            if not check.usable:  # the one rule (kanlib.analysis.context.check_model): no guidance from a failed model
                question = f"{p}: predicted largest world size with efficiency >= {goals.target_efficiency:g}"
                text.append(f"{label}, {p}: no calibrated-model prediction: {check.describe()}.")
                rows.append({"question": question, "group": label,
                             "answer": f"not used: the link model {check.status} its own check",
                             "value": np.nan, "basis": "communication model"})
                continue
            sel = groups.select_records(recs, {**gkey, "placement": p, "bucket_cap_mb": bb["bucket_cap_mb"],
                                               "nccl_algo": "" if bb["nccl_algo"] == "default" else bb["nccl_algo"]})
            # plain DDP's timed runs and no-op twins only: not the no-op twins of gradient accumulation
            sel = plain_rows(sel[sel["comm_hook"].isin(["timed", "noop"])], skip=("comm_hook",))
            _prediction_answer(sel, key, p, label, fit.fits, goals.target_efficiency, rows, text, check.exposed_band)
    return rows, text


def judge_overhead(a: StudyAnalysis, machine: dict, other: str, guidelines=None, ctx=None) -> dict:
    """The verdict on the published overhead range over :func:`overhead_points` (the same points the finding counts),
    its largest at most :data:`CONFIRM_UP_TO` times the paper's largest."""
    t = overhead_points(a.table.data)
    if t.empty:
        return {"verdict": "untested", "number": "no timed plain-DDP point with its no-op twin", "why": ""}
    lo, hi = t["overhead_fraction"].min(), t["overhead_fraction"].max()
    num = (f"{lo:.1%}-{hi:.1%}" if f"{lo:.1%}" != f"{hi:.1%}" else f"{lo:.1%}") + " of the step" \
        + (f" ({len(t)} points)" if len(t) > 1 else "")
    ok = hi <= PAPER["overhead_fraction_max"] * CONFIRM_UP_TO
    return claims.verdict(ok, num, f"against {PUBLISHED_RANGE}", f"against {PUBLISHED_RANGE}", other)


def judge_gradient_structure(a: StudyAnalysis, machine: dict, other: str, guidelines=None, ctx=None) -> dict:
    """The hardware-independent part of the published attribution: the overhead is the all-reduce and the link, not
    KAN's gradient structure. At equal gradient bytes (the KAN beside its matched-parameter MLP,
    :func:`gradient_structure`) on every placement measured: confirmed when neither the KAN's exposed communication
    nor its hook time is larger than the MLP's beyond the decision margin (the whole paired 95% interval within it,
    :func:`kanlib.analysis.twins.compare_paired`); contradicted when the KAN's exposed communication is clearly larger (the whole interval
    beyond it) on some placement; untested without MLP twins, with fewer than
    :data:`kanlib.analysis.stats.MIN_PAIRS` shared rounds, or while an interval holds the margin (undecided).

    A hook time larger alone does not contradict: the step waits only for the exposed part, and the hook time also
    holds the wait for the other rank's backward, which the KAN's longer compute lengthens (not its gradients). The
    exposed part holds some of that wait too (the ranks synchronise every step, the no-op twins do not), so a
    contradiction on a busy machine is to be checked on a quiet one.
    Any machine decides it (``other`` does not apply): what it decides is said in the reason (:data:`kanlib.analysis.twins.DECIDES`)."""
    g = a.extra.get("gradient_structure")
    if g is None:
        g = gradient_structure(a.table) if a.table is not None else pd.DataFrame()
    return twins.judge(g)


def judge_attribution(a: StudyAnalysis, machine: dict, other: str, guidelines=None, ctx=None) -> dict:
    """The hardware-dependent part of the published attribution (the all-reduce algorithm and inter-node latency):
    from the collective benchmark, the share of the hook's time spent waiting for a late rank rather than in
    transfer; not comparable on a machine unlike the paper's (``other``)."""
    decides = "decides: algorithm choice and inter-node latency (needs real nodes)"
    tw = a.extra.get("transfer_waiting")
    if tw is None or not len(tw):
        return {"verdict": "untested", "number": "no collective benchmark",
                "why": f"{decides}; transfer and waiting are told apart only with the collective benchmark"}
    num = "waiting share of the hook time " + ", ".join(f"{r['placement']} {r['waiting_fraction']:.0%}"
                                                        for _, r in tw.iterrows())
    waiting = float(tw["waiting_fraction"].median()) > 0.5
    if other:
        return {"verdict": claims.NOT_COMPARABLE, "number": num,
                "why": f"{decides}; {other}"
                       + ("; here the hook mostly waits for the other rank (load), not the network" if waiting else "")}
    return claims.verdict(not waiting, num, f"{decides}; most of the hook time is transfer",
                          f"{decides}; most of the hook time is waiting for a late rank, not transfer")


CLAIMS = (claims.Claim("Communication overhead", f"{PUBLISHED_RANGE} of the step", judge_overhead, NAME),
          claims.Claim("Attribution: not KAN's gradient structure", "the overhead is the all-reduce and the link, not "
                       "KAN's gradients (not measured)", judge_gradient_structure, NAME, test_with=""),
          claims.Claim("Attribution: all-reduce algorithm and inter-node latency", "to the all-reduce algorithm and "
                       "inter-node latency (not measured)", judge_attribution, NAME,
                       test_with=claims.CLUSTER_RUN + "; its collective benchmark per NCCL algorithm (nccl_algos)"))
"""The published claims this study answers: the attribution in two parts, the one any machine decides (KAN against
a matched-parameter MLP at equal gradient bytes) and the one that needs a cluster."""
