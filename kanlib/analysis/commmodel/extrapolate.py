"""Extrapolation of the DDP step from 1 to thousands of GPUs with the link model and the straggler model.

**Extrapolation** (:func:`predict_scaling`, :func:`extrapolation_table`, :func:`ring_tree_crossover`,
:func:`sizes_above`): step time, efficiency and exposed communication from 1 to thousands of GPUs for
a compute profile (:class:`ComputeProfile`, measured or a preset of kanlib.analysis.presets). With ``rank_sigma``
and ``contention`` a step waits for the slowest of N ranks; ``extrapolation_table`` adds the band
(``efficiency_lo``/``_hi``) and the optimistic bound without either (``efficiency_bound``). Neither has
congestion or the P processes of a node sharing its network. :func:`largest_world_size_at`,
:func:`world_size_band` and :func:`world_size_reached` read a prediction against a target efficiency.

pandas and numpy only: no torch import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kanlib.analysis import stats, straggler
from kanlib.analysis.commmodel.ddp import ddp_buckets, kan_param_bytes, overlap
from kanlib.analysis.commmodel.links import LinkModel, find_fit, nnls, row_algorithm


# -- compute profiles and extrapolation ---------------------------------------------------------------------
@dataclass
class ComputeProfile:
    """Per-process compute of one training step, without communication.

    ``step_s(n_params, local_batch) = fixed_s + seconds_per_sample_param * n_params * local_batch``;
    ``backward_fraction`` of it is backward (when buckets become ready). ``source`` says where it came
    from (measured records, or a preset's assumption).
    """

    seconds_per_sample_param: float
    fixed_s: float = 0.0
    backward_fraction: float = 2.0 / 3.0
    source: str = ""

    def step_s(self, n_params, local_batch):
        work = np.asarray(n_params, float) * np.asarray(local_batch, float)  # sample-parameters per step
        return self.fixed_s + self.seconds_per_sample_param * work


def profile_from_records(records: pd.DataFrame, model: str = "kan") -> ComputeProfile:
    """A compute profile from single-process runs (``world_size == 1``) of ``model``: least squares
    ``step_time_s = fixed_s + c * n_params * global_batch`` (fixed_s = 0 with one configuration), and
    the median backward share of the step."""
    d = records[(records["world_size"] == 1)]
    if "model" in d:
        d = d[d["model"] == model]
    if d.empty:
        raise ValueError(f"a measured compute profile needs single-process runs of model={model!r}; got none")
    work = d["n_params"].to_numpy(float) * d["global_batch"].to_numpy(float)
    y = d["step_time_s"].to_numpy(float)
    if len(set(work)) >= 2:
        fixed, c = nnls(np.stack([np.ones_like(work), work], axis=1), y)
    else:
        fixed, c = 0.0, float(np.median(y / work))
    bf = float(np.median(d["backward_s"].to_numpy(float) / y)) if "backward_s" in d else 2.0 / 3.0
    return ComputeProfile(float(c), float(fixed), bf, f"measured: {len(d)} single-process {model} runs")


def placement_for(world_size: int, gpus_per_node: int) -> tuple[int, int]:
    """``(nnodes, nproc_per_node)`` of ``world_size`` ranks filling nodes of ``gpus_per_node``."""
    if world_size <= gpus_per_node:
        return 1, world_size
    if world_size % gpus_per_node:
        raise ValueError(f"world_size: {world_size} is not a multiple of gpus_per_node={gpus_per_node}")
    return world_size // gpus_per_node, gpus_per_node


def predict_scaling(model: LinkModel, profile: ComputeProfile, param_bytes, world_sizes, gpus_per_node: int = 8,
                    global_batch: int | None = None, local_batch: int | None = None, bucket_cap_mb: float = 25.0,
                    first_bucket_mb: float | None = None, overlap_backward: bool = True, rank_sigma: float = 0.0,
                    contention: float = 0.0, sync_s: float = 0.0, per_bucket_s: float = 0.0,
                    host_factor: float = 1.0) -> pd.DataFrame:
    """Predicted step time, speedup, efficiency and exposed communication at each world size.

    Strong scaling with ``global_batch`` (local batch = global / W) or weak scaling with
    ``local_batch``. param_bytes: parameter tensor sizes in registration order
    (:func:`kan_param_bytes`); buckets from :func:`ddp_buckets`; each bucket's all-reduce from
    ``model`` at the placement :func:`placement_for` gives; overlap with backward unless
    ``overlap_backward`` is False (then all communication is exposed). Efficiency is against one process:
    strong ``T(1) / (W T(W))``, weak ``T(1) / T(W)``.

    Stragglers: the profile's compute is one rank's median; with ``rank_sigma`` > 0 each rank's compute is
    lognormal around it (:class:`kanlib.analysis.straggler.LogNormal`) and a step at W > 1 waits for the median of the
    slowest of W (``slowest_rank_s``), slowed by the contention :func:`ddp_parity` fits (``contention`` a fraction,
    ``sync_s`` per step, ``per_bucket_s`` per bucket: communication sharing the cores); all 0 is the optimistic
    bound without either. ``host_factor``: a process's compute at W > 1 over the profile's (processes sharing a
    host's cores and memory bandwidth, measured from the no-op runs; 1 = as alone).
    """
    if (global_batch is None) == (local_batch is None):
        raise ValueError("give exactly one of global_batch (strong scaling) and local_batch (weak scaling)")
    n_params = sum(param_bytes) / 4.0
    buckets = ddp_buckets(param_bytes, bucket_cap_mb, first_bucket_mb)
    rows = []
    for w in sorted(set(int(v) for v in world_sizes)):
        nn, pp = placement_for(w, gpus_per_node)
        lb = global_batch / w if global_batch is not None else local_batch
        compute = float(profile.step_s(n_params, lb)) * (float(host_factor) if w > 1 else 1.0)
        slowest = compute
        if w > 1:
            t = model.time_s(np.asarray(buckets, float), nn, pp)
            bwd = profile.backward_fraction * compute if overlap_backward else 0.0
            ov = overlap(buckets, bwd, t)
            if rank_sigma > 0 and compute > 0:
                slowest = straggler.LogNormal(math.log(compute), float(rank_sigma)).quantile_of_max(w)
            slowest = slowest * (1.0 + float(contention)) + float(sync_s) + float(per_bucket_s) * len(buckets)
        else:
            ov = {"transfer_s": 0.0, "exposed_s": 0.0}
        rows.append({"world_size": w, "nnodes": nn, "nproc_per_node": pp, "local_batch": lb, "compute_s": compute,
                     "slowest_rank_s": slowest, "comm_s": ov["transfer_s"], "exposed_s": ov["exposed_s"],
                     "step_time_s": slowest + ov["exposed_s"]})
    out = pd.DataFrame(rows)
    t1 = float(profile.step_s(n_params, global_batch if global_batch is not None else local_batch))
    if global_batch is not None:
        out["speedup"] = t1 / out["step_time_s"]
        out["efficiency"] = out["speedup"] / out["world_size"]
    else:
        out["speedup"] = out["world_size"] * t1 / out["step_time_s"]
        out["efficiency"] = t1 / out["step_time_s"]
    out["overhead_fraction"] = out["exposed_s"] / out["step_time_s"]
    out["n_buckets"] = len(buckets)
    out["unresolved"] = ", ".join(model.unresolved())
    return out


def extrapolation_table(models: dict[str, LinkModel], kan_sizes: dict[str, dict], profile: ComputeProfile,
                        bucket_caps_mb=(25.0,), max_world_size: int = 4096, gpus_per_node: int = 8,
                        global_batch: int | None = 65536, local_batch: int | None = None,
                        first_bucket_mb: float | None = None, rank_sigma: float = 0.0,
                        rank_sigma_interval: tuple[float, float] | None = None, contention: float = 0.0,
                        loo_rel_err: float = 0.0, sync_s: float = 0.0, per_bucket_s: float = 0.0,
                        host_factor: float = 1.0) -> pd.DataFrame:
    """:func:`predict_scaling` for every model size x bucket size x algorithm, from 1 to ``max_world_size``.

    models: ``{algo name: LinkModel}``; kan_sizes: ``{name: {"widths": [...], "grid_size": G,
    "spline_order": k}}``. Strong scaling at ``global_batch``, or weak scaling at ``local_batch`` per
    process (then pass ``global_batch=None``). Long format: one row per (kan, algo, bucket_cap_mb, world_size).

    With stragglers (``rank_sigma``, ``contention``, ``sync_s``, ``per_bucket_s``, ``host_factor``: see
    :func:`predict_scaling`)
    ``efficiency`` is the straggler model's and ``efficiency_bound`` the optimistic bound without stragglers or
    contention (with ``host_factor``, a measurement of compute). The band
    ``efficiency_lo`` / ``efficiency_hi`` (and ``step_time_s_lo`` / ``_hi``) spans the straggler spread's interval
    ``rank_sigma_interval`` (default: ``rank_sigma`` itself) widened by ``loo_rel_err``, the model's relative
    leave-one-out error of the step time (:func:`ddp_parity`): ``step_lo = T(sigma_lo) (1 - e)``, ``step_hi =
    T(sigma_hi) (1 + e)``; ``efficiency_hi`` stops at the optimistic bound (stragglers and contention only slow).
    """
    lo_s, hi_s = rank_sigma_interval or (rank_sigma, rank_sigma)
    e = abs(float(loo_rel_err))
    parts = []
    for kname, spec in kan_sizes.items():
        pb = kan_param_bytes(spec["widths"], spec.get("grid_size", 5), spec.get("spline_order", 3),
                             spec.get("model", "kan"))
        for algo, m in models.items():
            for cap in bucket_caps_mb:
                kw = dict(bucket_cap_mb=float(cap), first_bucket_mb=first_bucket_mb)
                ckw = dict(contention=contention, sync_s=sync_s, per_bucket_s=per_bucket_s, host_factor=host_factor)
                ws = powers_of_two(max_world_size)
                p = predict_scaling(m, profile, pb, ws, gpus_per_node, global_batch, local_batch, rank_sigma=rank_sigma,
                                    **ckw, **kw)
                bound = predict_scaling(m, profile, pb, ws, gpus_per_node, global_batch, local_batch,
                                        host_factor=host_factor, **kw)
                lo = predict_scaling(m, profile, pb, ws, gpus_per_node, global_batch, local_batch, rank_sigma=lo_s,
                                     **ckw, **kw)
                hi = predict_scaling(m, profile, pb, ws, gpus_per_node, global_batch, local_batch, rank_sigma=hi_s,
                                     **ckw, **kw)
                p["efficiency_bound"] = bound["efficiency"]
                p["step_time_s_lo"] = lo["step_time_s"] * (1 - e)
                p["step_time_s_hi"] = hi["step_time_s"] * (1 + e)
                p.loc[p["world_size"] == 1, ["step_time_s_lo", "step_time_s_hi"]] = p.loc[p["world_size"] == 1,
                                                                                          "step_time_s"]
                p["efficiency_lo"] = p["efficiency"] * p["step_time_s"] / p["step_time_s_hi"]
                # stragglers and contention only slow a step: the band stops at the optimistic bound
                p["efficiency_hi"] = np.minimum(p["efficiency"] * p["step_time_s"] / p["step_time_s_lo"],
                                                np.maximum(p["efficiency_bound"], p["efficiency"]))
                p.insert(0, "kan", kname)
                p.insert(1, "n_params", int(sum(pb) // 4))
                p.insert(2, "algo", algo)
                p.insert(3, "bucket_cap_mb", float(cap))
                parts.append(p)
    return pd.concat(parts, ignore_index=True)


def ring_tree_crossover(ring: LinkModel, tree: LinkModel, sizes_bytes, max_world_size: int = 4096,
                        gpus_per_node: int = 8) -> pd.DataFrame:
    """Per message size: the smallest world size (power of two) from which tree's all-reduce is faster
    than ring's and stays so up to ``max_world_size`` (None: ring is never overtaken), with both times there."""
    rows = []
    ws = [w for w in powers_of_two(max_world_size) if w > 1]
    for nb in sizes_bytes:
        t_ring = np.array([float(ring.time_s(nb, *placement_for(w, gpus_per_node))) for w in ws])
        t_tree = np.array([float(tree.time_s(nb, *placement_for(w, gpus_per_node))) for w in ws])
        faster = t_tree < t_ring
        cross = None
        for i in range(len(ws)):
            if faster[i:].all():
                cross = i
                break
        rows.append({"size_bytes": int(nb), "crossover_world_size": ws[cross] if cross is not None else None,
                     "ring_s_at_crossover": t_ring[cross] if cross is not None else math.nan,
                     "tree_s_at_crossover": t_tree[cross] if cross is not None else math.nan,
                     "ring_s_at_max": t_ring[-1], "tree_s_at_max": t_tree[-1]})
    return pd.DataFrame(rows)


def sizes_above(table: pd.DataFrame, target_efficiency: float = 0.8, world_size: int = 1024) -> pd.DataFrame:
    """Rows of :func:`extrapolation_table` at ``world_size`` with ``above`` = efficiency >= target."""
    d = table[table["world_size"] == world_size].copy()
    d["above"] = d["efficiency"] >= target_efficiency
    extra = [c for c in ("efficiency_lo", "efficiency_hi", "efficiency_bound") if c in d]
    return d[["kan", "n_params", "algo", "bucket_cap_mb", "efficiency", "exposed_s", "step_time_s", "above"] + extra]


# -- helpers of the extrapolation ---------------------------------------------------------------------
def largest_world_size_at(pred: pd.DataFrame, target_efficiency: float) -> int | None:
    """Largest predicted world size whose efficiency (and every smaller one's) reaches the target."""
    best = None
    for n, e in zip(pred["world_size"], pred["efficiency"]):
        if not e + 1e-12 >= target_efficiency:  # a NaN efficiency never meets the target
            break
        best = int(n)
    return best


def band_efficiencies(pred: pd.DataFrame, band: float, compute: tuple[float, float] = (1.0, 1.0)
                      ) -> tuple[pd.Series, pd.Series]:
    """The efficiencies of ``pred`` at the pessimistic and the optimistic end of its band: the exposed
    communication taken ``band`` (a relative error, e.g. 0.38) larger and smaller, and the measured compute at the
    ends of its interval ``compute`` (factors of it, e.g. the bootstrap interval of the no-op twin's median step
    over that median, ``(0.91, 1.03)``). Compute ``k`` times the measured one leaves a strong-scaling efficiency as
    exposed communication ``1/k`` times the predicted one would, so the pessimistic end takes the exposed time
    ``(1 + band) / k_lo`` times, the optimistic end ``(1 - band) / k_hi`` times."""
    k_lo, k_hi = (float(c) for c in compute)
    if not (k_lo > 0 and k_hi > 0):
        raise ValueError(f"world_size_band: compute factors must be positive; got {compute!r}")
    out = []
    for k in ((1.0 + band) / k_lo, max(0.0, 1.0 - band) / k_hi):
        step = pred["step_time_s"] + (k - 1.0) * pred["exposed_s"]
        out.append(pred["efficiency"] * pred["step_time_s"] / step)
    return out[0], out[1]


def world_size_band(pred: pd.DataFrame, target_efficiency: float, band: float,
                    compute: tuple[float, float] = (1.0, 1.0)) -> tuple[int | None, int | None]:
    """:func:`largest_world_size_at` at either end of the prediction's band (:func:`band_efficiencies`):
    ``(pessimistic, optimistic)`` largest world sizes at the target."""
    return tuple(largest_world_size_at(pred.assign(efficiency=e), target_efficiency)
                 for e in band_efficiencies(pred, band, compute))


def world_size_reached(pred: pd.DataFrame, target_efficiency: float, band: float,
                       compute: tuple[float, float] = (1.0, 1.0), margin: float | None = None
                       ) -> tuple[int | None, list[tuple[int, float, float, float]]]:
    """The predicted largest world size at the target, decided on the band as a measured point is on its interval
    (:func:`kanlib.analysis.stats.reaches`, the rule of every threshold decision): a world size reaches the target
    when the pessimistic end of its band does, or its point prediction does and the pessimistic end is within the
    decision ``margin`` (default :data:`kanlib.analysis.stats.MARGIN`); every smaller one must too. Returns that
    size (None when not even the first does; a world size whose band is not finite never does) and the world sizes,
    up to the first that does not reach it, whose band holds the target, as ``(N, point, pessimistic,
    optimistic)``: the decision is near the target there.

    Why not the range the band allows: nine default studies (X2-Z4) predicted N=4 at 73-78% at their point
    predictions, with optimistic ends of 79.4-83.5%: the range said "2-4" in eight and "2" in one (Y4, 79.4%)."""
    margin = stats.MARGIN if margin is None else margin
    pess, opt = band_efficiencies(pred, band, compute)
    best, near = None, []
    for n, e, lo, hi in zip(pred["world_size"], pred["efficiency"], pess, opt):
        if stats.holds(e, lo, hi, target_efficiency):
            near.append((int(n), float(e), float(lo), float(hi)))
        finite = bool(np.isfinite(lo) and np.isfinite(hi))  # a band that cannot be computed decides nothing
        if not (finite and stats.reaches(e, lo, hi, target_efficiency, margin=margin) == "yes"):
            break  # the first world size that does not reach it is the last the decision depends on
        best = int(n)
    return best, near


def powers_of_two(up_to: int) -> list[int]:
    """1, 2, 4, ... up to ``up_to``."""
    return [2 ** k for k in range(int(math.log2(up_to)) + 1)]


def calibrated_prediction(timed: pd.DataFrame, noop: pd.DataFrame, fits: dict, target: float,
                          max_world_size: int = 4096) -> dict:
    """Extrapolate one measured DDP point with the collective-benchmark fit.

    timed / noop: the point's runs with the timed hook and its no-op twins (one configuration). The
    compute profile comes from the no-op twin: ``T_noop(N) = c n_params B / N`` gives ``c``, and its
    backward share says when buckets become ready; the buckets are the ones the timed runs recorded;
    each bucket's all-reduce comes from the fit of the same backend, device, algorithm and emulated link
    (:func:`find_fit`), on nodes of the point's processes per node. Returns
    ``world_size`` (largest with efficiency >= target, or None), the prediction table, a description and
    ``compute_interval``, the bootstrap interval of the no-op twin's median step as factors of it (what the measured
    compute is uncertain by, :func:`world_size_band`); raises ValueError saying why when
    the point or the fit cannot support a prediction.
    """
    if timed.empty or noop.empty:
        raise ValueError("the point needs timed runs and their no-op twins")
    r = timed.iloc[0]
    buckets = r.get("bucket_bytes")
    if not isinstance(buckets, (list, tuple)) or not buckets:
        raise ValueError("its records carry no bucket_bytes (schema 1)")
    nn, pp = int(r["nnodes"]), int(r["nproc_per_node"])
    n, b, n_params = nn * pp, int(r["global_batch"]), int(r["n_params"])
    t_noop, t_noop_lo, t_noop_hi = stats.median_ci(noop["step_time_s"].to_numpy(float))
    bwd = float(np.median(noop["backward_s"].to_numpy(float))) if "backward_s" in noop else 2 * t_noop / 3
    profile = ComputeProfile(t_noop * n / (n_params * b), 0.0, min(max(bwd / t_noop, 0.0), 1.0),
                                       f"measured: the no-op twin at {nn}x{pp}")
    algo = row_algorithm(r.get("backend", ""), r.get("nccl_algo", ""), r.get("nccl_algo_used"))
    f = find_fit(fits, r.get("backend", ""), r.get("device", "cpu"), algo, nn,
                           r.get("emulate_latency_s", 0.0), r.get("emulate_bandwidth_bytes_per_s", 0.0))
    if f is None:
        raise ValueError(f"no collective-benchmark fit for {r.get('backend')}/{r.get('device')}/{algo} with this "
                         f"run's link (emulated latency {float(r.get('emulate_latency_s') or 0):g} s)")
    pred = predict_scaling(f.model, profile, list(reversed(list(buckets))),
                                     powers_of_two(max_world_size), pp, global_batch=b,
                                     bucket_cap_mb=float(r["bucket_cap_mb"]))
    return {"world_size": largest_world_size_at(pred, target), "prediction": pred, "profile": profile,
            "fit": f.model.label, "links": f.model.describe(), "loo_rel_rmse": f.loo_rel_rmse,
            "n_params": n_params, "global_batch": b, "n_buckets": len(buckets), "placement_per_node": pp,
            "compute_interval": ((t_noop_lo / t_noop, t_noop_hi / t_noop)
                                 if t_noop > 0 and np.isfinite([t_noop_lo, t_noop_hi]).all() else (1.0, 1.0))}
