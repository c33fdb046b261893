"""What a study on one machine says about another: quantities that carry, and a deployment advisor built on the link
model and the straggler model (kanlib.analysis.commmodel), checked on the study's own DDP steps before it answers.

**Quantities that carry** (:func:`carried_quantities`), per placement and work size: samples/s per process, the
step's compute and its exposed communication, the gradient bytes all-reduced per step, the compute-to-communication
ratio (step compute over the link model's transfer time of one step's buckets), the fitted latency and bandwidth of
the link the placement uses, and the peak memory per process. None of them names this machine's world size.

**The model** of a DDP step at world size W (:func:`predict_point`): :func:`kanlib.analysis.commmodel.predict_scaling`
with the compute profile of the configuration's single-process runs (``step = fixed_s + c n_params B_local``), the
link model fitted on the collective benchmark, the per-rank spread of the single-process steps (a step waits for the
slowest of W ranks) and one ``host_factor`` (a process's compute at W > 1 over the profile's), fitted on DDP steps.

**Its own check** (:func:`loo_check`): every multi-process DDP point (placement x work size x bucket size) is
predicted from the single-process compute, the collective benchmark and a host factor fitted on the *other* points
(its own DDP step left out). The model passes when the median |error| is at most :data:`LOO_MEDIAN_MAX` and every
point's at most :data:`LOO_POINT_MAX`; its largest |error| is the band that travels with every prediction.

**Its range**: a prediction is vouched for where the per-process work (``n_params x batch per process``) lies within
:data:`VOUCH_FACTOR` of the single-process work measured and each bucket within that factor of the benchmark's
message sizes; world size is extrapolated by the formulas (that is the point), never the work per process.

pandas and numpy only: no torch import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from kanlib.analysis import commmodel as cm
from kanlib.analysis import groups, straggler

LOO_MEDIAN_MAX = 0.10
"""The advisor answers only when the median |leave-one-out error| of the DDP step is at most this."""
LOO_POINT_MAX = 0.25
"""... and every point's |leave-one-out error| is at most this."""
VOUCH_FACTOR = 4.0
"""How far (a factor either way) beyond the measured per-process work and message sizes a prediction is vouched for."""
DDP_HOOKS = ("default", "timed")
"""Runs whose step is a plain DDP step with the real all-reduce (the timed hook only times it)."""
CONFIG_KEYS = ("model", "widths", "grid_size", "spline_order")
"""What fixes the parameters all-reduced: a configuration."""
KERNEL_KEYS = ("kan_impl", "precision")
"""What else sets a configuration's compute (its single-process runs must match them where recorded)."""
POINT_KEYS = CONFIG_KEYS + KERNEL_KEYS + ("global_batch", "bucket_cap_mb", "nnodes", "nproc_per_node", "backend",
                                         "device", "nccl_algo")
"""What makes one DDP point (its repeats pooled)."""


class AdvisorInputError(ValueError):
    """The records lack what the advisor needs (single-process runs, a collective benchmark, multi-process DDP runs)."""


def _col(df: pd.DataFrame, c: str, default) -> pd.Series:
    return df[c] if c in df else pd.Series(default, index=df.index)


def _plain_ddp(df: pd.DataFrame) -> pd.Series:
    """Rows of KAN or MLP models trained by plain DDP on the machine's own links, one gradient step per update."""
    return (_col(df, "model", "kan").isin(["kan", "mlp"]) & _col(df, "parallelism", "ddp").fillna("ddp").eq("ddp")
            & pd.to_numeric(_col(df, "grad_accum_steps", 1), errors="coerce").fillna(1).eq(1) & ~groups.emulated(df))


def config_of(row) -> dict:
    """The configuration (:data:`CONFIG_KEYS`, and :data:`KERNEL_KEYS` where recorded) of a record or point, widths
    as a tuple."""
    out = {"model": row.get("model", "kan"), "widths": tuple(int(w) for w in row["widths"]),
           "grid_size": int(row.get("grid_size", 5)), "spline_order": int(row.get("spline_order", 3))}
    return {**out, **{k: row[k] for k in KERNEL_KEYS if isinstance(row.get(k), str)}}


def param_bytes(config: dict) -> list[int]:
    """Bytes of the configuration's parameter tensors in registration order (what DDP buckets)."""
    return cm.kan_param_bytes(config["widths"], config["grid_size"], config["spline_order"], config["model"])


def ddp_points(df: pd.DataFrame) -> pd.DataFrame:
    """One row per multi-process DDP point (:data:`POINT_KEYS`; plain DDP steps, :data:`DDP_HOOKS`): the median step
    and peak memory over its runs, ``n_runs``, ``n_params``, ``world_size``, ``placement``, ``work_per_process``
    (``n_params x global_batch / world_size``) and the buckets the runs recorded (None when none did)."""
    d = df[(df["world_size"] > 1) & _col(df, "comm_hook", "default").isin(DDP_HOOKS) & _plain_ddp(df)]
    d = groups.with_placement(d[np.isfinite(groups.numbers(d, "step_time_s"))])
    rows = []
    for key, g in groups.groupby(d, [k for k in POINT_KEYS if k in d]):
        buckets = [b for b in _col(g, "bucket_bytes", None) if isinstance(b, (list, tuple)) and b]
        w = int(g["world_size"].iloc[0])
        n = int(g["n_params"].iloc[0])
        rows.append({**key, "widths": tuple(key["widths"]), "world_size": w, "placement": g["placement"].iloc[0],
                     "n_params": n, "n_runs": len(g), "step_time_s": float(np.median(groups.numbers(g, "step_time_s"))),
                     "peak_mem_bytes": float(np.nanmedian(groups.numbers(g, "peak_mem_bytes"))) if
                     np.isfinite(groups.numbers(g, "peak_mem_bytes")).any() else math.nan,
                     "work_per_process": n * float(key["global_batch"]) / w,
                     "bucket_bytes": list(buckets[0]) if buckets else None,
                     "nccl_algo_used": groups.constant(g, "nccl_algo_used", None)})
    return pd.DataFrame(rows)


def single_runs(df: pd.DataFrame, config: dict) -> tuple[pd.DataFrame, str]:
    """The single-process runs the configuration's compute comes from: its own, else every single-process run of its
    model (said so); with the sentence saying which."""
    ones = df[(df["world_size"] == 1) & _plain_ddp(df) & np.isfinite(groups.numbers(df, "step_time_s"))]
    ones = ones[_col(ones, "model", "kan") == config["model"]]
    own = groups.select_records(ones, config)
    if len(own):
        return own, f"{len(own)} single-process run(s) of this configuration"
    return ones, f"{len(ones)} single-process {config['model']} run(s) of other widths (none of this one)"


@dataclass
class Compute:
    """One configuration's compute: the profile (:class:`kanlib.analysis.commmodel.ComputeProfile`), the per-process
    work range it was measured on (sample-parameters per step), the lognormal spread of a rank's step (sigma) and
    where it came from."""

    profile: cm.ComputeProfile
    work_range: tuple[float, float]
    rank_sigma: float
    source: str

    def vouched(self, work: float) -> bool:
        """Whether a per-process work lies within :data:`VOUCH_FACTOR` of the work measured."""
        lo, hi = self.work_range
        return lo / VOUCH_FACTOR <= work <= hi * VOUCH_FACTOR


def compute_of(df: pd.DataFrame, config: dict) -> Compute:
    """The configuration's :class:`Compute` from its single-process runs (:func:`single_runs`); raises
    :class:`AdvisorInputError` when the folder has none of its model."""
    runs, source = single_runs(df, config)
    if runs.empty:
        raise AdvisorInputError(f"no single-process {config['model']} run under this folder: the compute per step "
                                f"comes from one (the strong-scaling or model-size study at N=1)")
    prof = cm.profile_from_records(runs, config["model"])
    if not (np.isfinite(prof.backward_fraction) and 0 < prof.backward_fraction <= 1):
        prof = replace(prof, backward_fraction=2.0 / 3.0)  # runs without a backward time: the usual 2/3
    work = groups.numbers(runs, "n_params") * groups.numbers(runs, "global_batch")
    parts = [x / np.median(x) for x in (straggler.rank_times(runs.iloc[i:i + 1]).samples for i in range(len(runs)))]
    sigma = straggler.RankTimes(np.concatenate(parts), len(runs), source).lognormal.sigma
    return Compute(prof, (float(np.nanmin(work)), float(np.nanmax(work))), float(sigma), source)


def link_model_for(fits: dict, point) -> cm.LinkModel:
    """The fitted link model of a point's backend, device and algorithm (the inter-node link too when a multi-node
    benchmark ran); raises :class:`AdvisorInputError` naming what is missing."""
    backend, device = point.get("backend", "gloo"), point.get("device", "cpu")
    algo = cm.row_algorithm(backend, point.get("nccl_algo", ""), point.get("nccl_algo_used"))
    f = cm.find_fit(fits or {}, backend, device, algo, 2) or cm.find_fit(fits or {}, backend, device, algo, 1)
    if f is None:
        raise AdvisorInputError(f"no collective-benchmark fit for {backend}/{device}/{algo}: run the collective "
                                f"benchmark (notebook 03) with this backend")
    return f.model


def predict_point(model: cm.LinkModel, compute: Compute, config: dict, world_size: int, nproc_per_node: int,
                  global_batch: float, bucket_cap_mb: float, host_factor: float = 1.0) -> pd.Series:
    """The model's row (:func:`kanlib.analysis.commmodel.predict_scaling`) for one placement: ``world_size`` processes
    on nodes of ``nproc_per_node``, strong scaling at ``global_batch``."""
    p = cm.predict_scaling(model, compute.profile, param_bytes(config), [1, int(world_size)], int(nproc_per_node),
                           global_batch=global_batch, bucket_cap_mb=float(bucket_cap_mb),
                           rank_sigma=compute.rank_sigma, host_factor=host_factor)
    return p.iloc[-1]


def _point_args(pt) -> tuple:
    return int(pt["world_size"]), int(pt["nproc_per_node"]), float(pt["global_batch"]), float(pt["bucket_cap_mb"])


def fitted_host_factor(model: cm.LinkModel, compute: Compute, config: dict, pt) -> float:
    """The host factor at which the model's step equals the point's measured one (bisection; the step grows with it,
    since backward hides less communication than compute adds), kept within 1/16 to 16."""
    lo, hi = math.log(1 / 16), math.log(16)

    def gap(lh: float) -> float:
        return float(predict_point(model, compute, config, *_point_args(pt), math.exp(lh))["step_time_s"]) \
            - float(pt["step_time_s"])

    if gap(lo) >= 0:
        return math.exp(lo)
    if gap(hi) <= 0:
        return math.exp(hi)
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    return math.exp((lo + hi) / 2)


@dataclass(frozen=True)
class AdvisorCheck:
    """The advisor's own check (:func:`loo_check`): over ``n_points`` DDP points, the median and the largest
    |leave-one-out error| of the step, each against its limit; ``why`` says what failed (empty when it passed)."""

    n_points: int
    median_abs_err: float
    max_abs_err: float
    median_limit: float = LOO_MEDIAN_MAX
    point_limit: float = LOO_POINT_MAX

    @property
    def ok(self) -> bool:
        return (self.n_points > 0 and self.median_abs_err <= self.median_limit
                and self.max_abs_err <= self.point_limit)

    @property
    def why(self) -> str:
        if self.n_points == 0:
            return "no multi-process DDP point could be predicted, so the model is not checked"
        out = []
        if not self.median_abs_err <= self.median_limit:
            out.append(f"median |leave-one-out error| {self.median_abs_err:.0%} > {self.median_limit:.0%}")
        if not self.max_abs_err <= self.point_limit:
            out.append(f"a point's |leave-one-out error| {self.max_abs_err:.0%} > {self.point_limit:.0%}")
        return "; ".join(out)

    @property
    def sentence(self) -> str:
        if self.n_points == 0:
            return f"Not checked: {self.why}."
        return (f"Leave one out over {self.n_points} DDP point(s), each predicted from the single-process compute and "
                f"the collective benchmark without its own step: median |error| {self.median_abs_err:.1%} (limit "
                f"{self.median_limit:.0%}), largest {self.max_abs_err:.1%} (limit {self.point_limit:.0%}): "
                + ("passed." if self.ok else f"FAILED ({self.why})."))


def loo_check(df: pd.DataFrame, fits: dict) -> tuple[pd.DataFrame, AdvisorCheck]:
    """Predict every multi-process DDP point of ``df`` (:func:`ddp_points`) from the single-process compute and the
    collective-benchmark fit, with the median host factor of the *other* points (1 when there is none): its own DDP
    step left out. Returns the table (per point: ``label``, ``placement``, ``work_per_process``, measured
    ``step_time_s``, ``pred_step_time_s``, ``rel_err``, ``host_factor`` (the others' median, used),
    ``own_host_factor`` (the point's own, for predictions beyond the check), ``n_fit``, ``why`` when not predicted) and
    the :class:`AdvisorCheck`."""
    pts = ddp_points(df)
    rows, own = [], []
    for _, pt in pts.iterrows():
        cfg = config_of(pt)
        try:
            model, comp = link_model_for(fits, pt), compute_of(df, cfg)
            own.append((model, comp, cfg, fitted_host_factor(model, comp, cfg, pt)))
        except (AdvisorInputError, ValueError) as e:
            own.append(None)
            rows.append({"why": str(e)})
            continue
        rows.append({"why": None})
    hs = np.array([o[3] if o else np.nan for o in own])
    for i, (_, pt) in enumerate(pts.iterrows()):
        label = (f"{pt['model']} {list(pt['widths'])}, B={int(pt['global_batch'])}, "
                 f"{float(pt['bucket_cap_mb']):g} MiB, {pt['placement']}")
        rows[i].update(label=label, placement=pt["placement"], world_size=int(pt["world_size"]),
                       global_batch=int(pt["global_batch"]), bucket_cap_mb=float(pt["bucket_cap_mb"]),
                       work_per_process=float(pt["work_per_process"]), n_runs=int(pt["n_runs"]),
                       step_time_s=float(pt["step_time_s"]))
        if own[i] is None:
            continue
        others = np.isfinite(hs) & (np.arange(len(hs)) != i)
        h = float(np.median(hs[others])) if others.any() else 1.0
        model, comp, cfg, _ = own[i]
        pred = float(predict_point(model, comp, cfg, *_point_args(pt), h)["step_time_s"])
        rows[i].update(pred_step_time_s=pred, rel_err=(pred - float(pt["step_time_s"])) / float(pt["step_time_s"]),
                       host_factor=h, own_host_factor=hs[i], n_fit=int(others.sum()), compute=comp.source)
    table = pd.DataFrame(rows)
    errs = np.abs(pd.to_numeric(table.get("rel_err", pd.Series(dtype=float)), errors="coerce").to_numpy(float))
    errs = errs[np.isfinite(errs)]
    check = AdvisorCheck(int(errs.size), float(np.median(errs)) if errs.size else math.nan,
                         float(errs.max()) if errs.size else math.nan)
    return table, check


def carried_quantities(df: pd.DataFrame, fits: dict | None) -> pd.DataFrame:
    """Per placement and work size (every DDP point, :func:`ddp_points`, and every single-process configuration and
    batch): ``samples_per_s_per_process``; ``step_compute_s`` (the no-op twin's median step where the communication
    study ran one, else the single-process profile at the batch per process; ``compute_source`` says which) and
    ``exposed_comm_s`` (the step minus it); ``grad_bytes_per_step`` (the buckets recorded, else the parameters'
    bytes); ``transfer_s`` (the link model's time for those buckets, one after the other) and
    ``compute_to_comm_ratio`` (``step_compute_s / transfer_s``); the link the placement uses with its fitted
    ``link_latency_s`` and ``link_bandwidth_bytes_per_s`` (None where the fit did not resolve it); and
    ``peak_mem_bytes_per_process`` (the record's peak is the maximum over ranks of each process's)."""
    pts = ddp_points(df)
    ones = df[(df["world_size"] == 1) & _plain_ddp(df) & np.isfinite(groups.numbers(df, "step_time_s"))]
    for key, g in groups.groupby(ones, [k for k in CONFIG_KEYS + KERNEL_KEYS + ("global_batch",) if k in ones]):
        row = {**key, "widths": tuple(key["widths"]), "world_size": 1, "placement": "1x1", "nnodes": 1,
               "nproc_per_node": 1, "n_params": int(g["n_params"].iloc[0]), "n_runs": len(g),
               "step_time_s": float(np.median(groups.numbers(g, "step_time_s"))),
               "peak_mem_bytes": float(np.nanmedian(groups.numbers(g, "peak_mem_bytes"))),
               "bucket_cap_mb": math.nan, "bucket_bytes": None}
        pts = pd.concat([pts, pd.DataFrame([row])], ignore_index=True)
    noop = groups.with_placement(df[(df["world_size"] > 1) & (_col(df, "comm_hook", "") == "noop") & _plain_ddp(df)])
    rows = []
    for _, pt in pts.iterrows():
        cfg, w, b = config_of(pt), int(pt["world_size"]), float(pt["global_batch"])
        out = {"model": cfg["model"], "widths": list(cfg["widths"]), **{k: cfg.get(k) for k in KERNEL_KEYS},
               "n_params": int(pt["n_params"]),
               "global_batch": int(b), "batch_per_process": b / w, "bucket_cap_mb": pt["bucket_cap_mb"],
               "placement": pt["placement"], "world_size": w, "n_runs": int(pt["n_runs"]),
               "work_per_process": float(pt["n_params"]) * b / w, "step_time_s": float(pt["step_time_s"]),
               "samples_per_s_per_process": b / float(pt["step_time_s"]) / w,
               "peak_mem_bytes_per_process": pt["peak_mem_bytes"]}
        out.update(_compute_and_comm(df, noop, fits, pt, cfg))
        rows.append(out)
    return pd.DataFrame(rows)


def _compute_and_comm(df: pd.DataFrame, noop: pd.DataFrame, fits: dict | None, pt, cfg: dict) -> dict:
    """The compute, communication and link columns of :func:`carried_quantities` for one point."""
    w = int(pt["world_size"])
    if w == 1:
        return {"step_compute_s": float(pt["step_time_s"]), "compute_source": "the single-process step",
                "exposed_comm_s": 0.0, "grad_bytes_per_step": 0, "transfer_s": 0.0,
                "compute_to_comm_ratio": math.nan, "link": None, "link_latency_s": None,
                "link_bandwidth_bytes_per_s": None}
    twin = groups.select_records(noop, {k: pt[k] for k in POINT_KEYS if k in pt and k in noop})
    if len(twin):
        comp, src = float(np.median(groups.numbers(twin, "step_time_s"))), f"no-op twin ({len(twin)} run(s))"
    else:
        try:
            c = compute_of(df, cfg)
            comp = float(c.profile.step_s(float(pt["n_params"]), float(pt["global_batch"]) / w))
            src = f"single-process profile at the batch per process ({c.source})"
        except AdvisorInputError:
            comp, src = math.nan, "no single-process run of this model"
    buckets = pt["bucket_bytes"] if isinstance(pt["bucket_bytes"], list) else \
        cm.ddp_buckets(param_bytes(cfg), float(pt["bucket_cap_mb"]))
    out = {"step_compute_s": comp, "compute_source": src, "exposed_comm_s": float(pt["step_time_s"]) - comp,
           "grad_bytes_per_step": int(sum(buckets)), "transfer_s": math.nan, "compute_to_comm_ratio": math.nan,
           "link": "intra" if int(pt["nnodes"]) == 1 else "inter", "link_latency_s": None,
           "link_bandwidth_bytes_per_s": None}
    try:
        model = link_model_for(fits, pt)
        t = float(np.sum(model.time_s(np.asarray(buckets, float), int(pt["nnodes"]), int(pt["nproc_per_node"]))))
        link = model.link(out["link"])
    except (AdvisorInputError, ValueError):
        return out
    out.update(transfer_s=t, compute_to_comm_ratio=comp / t if t > 0 else math.nan, link_latency_s=link.alpha_s,
               link_bandwidth_bytes_per_s=link.bandwidth_bytes_per_s)
    return out


def even_param_bytes(grad_bytes: float, bucket_cap_mb: float) -> list[int]:
    """Parameter sizes (registration order) that DDP buckets into full buckets of ``bucket_cap_mb`` and one
    remainder: gradients of ``grad_bytes`` bytes from layers much smaller than a bucket."""
    cap = int(bucket_cap_mb * cm.MIB)
    n_full, rest = divmod(int(grad_bytes), cap)
    return ([rest] if rest else []) + [cap] * n_full


def what_if(step_compute_s: float, grad_bytes: float, model: cm.LinkModel, world_sizes, gpus_per_node: int = 8,
            bucket_cap_mb: float = 25.0, backward_fraction: float = 2.0 / 3.0, scaling: str = "weak",
            rank_cv: float = 0.0) -> pd.DataFrame:
    """The model for a machine without a study: a per-device step compute (one process: ``step_compute_s`` s) and
    ``grad_bytes`` all-reduced per step over ``model``'s links, at each world size (nodes of ``gpus_per_node``).

    ``scaling``: ``weak`` (each device keeps its batch: compute per device stays ``step_compute_s``) or ``strong``
    (the one-process batch split over W devices: compute ``step_compute_s / W``). Buckets: full ones of
    ``bucket_cap_mb`` and a remainder (:func:`even_param_bytes`), ready as backward (``backward_fraction`` of the
    compute) proceeds. ``rank_cv``: per-rank variability (a step waits for the slowest of W; 0 = the optimistic bound).
    Returns :func:`kanlib.analysis.commmodel.predict_scaling`'s table."""
    if not (step_compute_s > 0 and grad_bytes > 0):
        raise ValueError(f"step_compute_s and grad_bytes: must be positive, got {step_compute_s!r}, {grad_bytes!r}")
    if scaling not in ("weak", "strong"):
        raise ValueError(f"scaling: unknown value {scaling!r}; choose weak or strong")
    bad = [w for w in world_sizes if int(w) > gpus_per_node and int(w) % gpus_per_node]
    if bad or not len(world_sizes) or min(int(w) for w in world_sizes) < 1:
        raise ValueError(f"world_sizes: need positive sizes, multiples of gpus_per_node={gpus_per_node} beyond one "
                         f"node; got {list(world_sizes)}")
    n_params = grad_bytes / 4.0  # predict_scaling counts float32 parameters; only the product with c matters
    prof = cm.ComputeProfile(step_compute_s / n_params, 0.0, backward_fraction, "what-if: one process's step")
    sigma = straggler.LogNormal.from_cv(1.0, rank_cv).sigma if rank_cv > 0 else 0.0
    batch = {"local_batch": 1} if scaling == "weak" else {"global_batch": 1}
    return cm.predict_scaling(model, prof, even_param_bytes(grad_bytes, bucket_cap_mb), world_sizes, gpus_per_node,
                              bucket_cap_mb=bucket_cap_mb, rank_sigma=sigma, **batch)


def with_band(pred: pd.DataFrame, band: float) -> pd.DataFrame:
    """``pred`` with ``efficiency_lo`` / ``efficiency_hi``: the step ``band`` (a relative error) slower / faster at
    every W > 1 (one process is measured, not predicted)."""
    out = pred.copy()
    multi = out["world_size"] > 1
    out["efficiency_lo"] = np.where(multi, out["efficiency"] / (1 + band), out["efficiency"])
    out["efficiency_hi"] = np.where(multi, out["efficiency"] / max(1e-9, 1 - band), out["efficiency"])
    return out
