"""Hardware presets for the performance model (kanlib.analysis.commmodel): PRESETS, NOT MEASUREMENTS.

Each preset takes its link bandwidths from vendor specifications and its per-hop latencies from
NCCL's own tuning model, with the source beside every number. Datasheet bandwidths are peaks
(all-reduce bus bandwidth measured with nccl-tests is lower); compute comes from a peak rate and an
assumed utilisation. Use them for what-if questions and to set the published setup beside the model;
replace them with a collective-benchmark fit (kanlib.collbench) of the cluster at hand when there is one.

- ``a100-hdr``: A100 SXM, NVLink 3 inside a node, one HDR InfiniBand NIC per GPU (DGX A100 layout);
- ``h100-ndr`` / ``h200-ndr``: H100 / H200 SXM, NVLink 4 inside a node, one NDR NIC per GPU (DGX H100 layout).

Bandwidth is per GPU and direction, which is what one rank of a ring all-reduce sends and receives
at the same time: NVLink's "600 / 900 GB/s" totals count both directions, so 300 / 450 GB/s; HDR is
200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s per port and direction.

:func:`published_comparison` sets the model's prediction for the published shape (8 GPUs over 4
nodes, 2 per node) beside the published 5.97x speedup, 74.7% efficiency and 1.3-6.1% communication
overhead, and says which assumptions move the prediction most.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pandas as pd

from kanlib.analysis.commmodel import ComputeProfile, Link, LinkModel, kan_param_bytes, predict_scaling

NCCL_TUNING_SOURCE = "NCCL src/graph/tuning.cc (ncclTunerConstantsDefaults: baseLatencies, hwLatencies), NCCL 2.30"
# NCCL's latency model (us): a collective costs baseLat + steps x hwLat; LL protocol (small messages).
_NCCL_BASE_LAT_S = {"ring": 6.6e-6, "tree": 6.8e-6}
_NCCL_HW_LAT_LL_S = {("nvlink", "ring"): 0.6e-6, ("nvlink", "tree"): 0.6e-6,
                     ("net", "ring"): 2.7e-6, ("net", "tree"): 5.0e-6}


@dataclass(frozen=True)
class Preset:
    """A cluster's links and compute, from specifications (``kind`` is always ``"preset"``)."""

    name: str
    gpu: str
    gpus_per_node: int
    intra_bandwidth_bytes_per_s: float
    inter_bandwidth_bytes_per_s: float
    peak_flops: float
    sources: dict = field(default_factory=dict)
    kind: str = "preset"
    note: str = "a preset from specifications, not a measurement"

    def link_model(self, algo: str = "ring") -> LinkModel:
        """The preset's :class:`~kanlib.analysis.commmodel.LinkModel` for ``algo`` (ring or tree): NCCL's LL
        per-hop latencies for NVLink / network and its base latency per all-reduce, datasheet bandwidths."""
        if algo not in ("ring", "tree"):
            raise ValueError(f"algo: unknown value {algo!r}; choose ring or tree")
        src = f"preset {self.name}"
        links = {"intra": Link.given("intra", _NCCL_HW_LAT_LL_S[("nvlink", algo)], self.intra_bandwidth_bytes_per_s,
                                     src),
                 "inter": Link.given("inter", _NCCL_HW_LAT_LL_S[("net", algo)], self.inter_bandwidth_bytes_per_s,
                                     src)}
        return LinkModel(algo, links, "nccl", _NCCL_BASE_LAT_S[algo], f"{src} ({algo}; {self.note})")

    def compute_profile(self, utilisation: float = 0.3, flops_per_sample_param: float = 6.0,
                        fixed_s: float = 0.0, backward_fraction: float = 2.0 / 3.0) -> ComputeProfile:
        """Compute at ``utilisation`` of ``peak_flops``: ``flops_per_sample_param`` FLOPs per sample and
        parameter for forward + backward (6 = 2 forward + 4 backward for GEMM-dominated layers; KAN's
        basis evaluation adds to it) - an assumption, stated in ``source``."""
        if not 0 < utilisation <= 1:
            raise ValueError(f"utilisation: must be in (0, 1], got {utilisation!r}")
        return ComputeProfile(flops_per_sample_param / (utilisation * self.peak_flops), fixed_s, backward_fraction,
                              f"preset {self.name}: {utilisation:.0%} of {self.peak_flops:.3g} FLOP/s, "
                              f"{flops_per_sample_param:g} FLOP per sample-parameter (assumed)")


PRESETS: dict[str, Preset] = {
    "a100-hdr": Preset(
        "a100-hdr", "A100 SXM4", 8, 300e9, 25e9, 156e12,
        {"intra": "NVLink 3: 12 links, 600 GB/s total per A100 (both directions) - "
                  "https://www.nvidia.com/en-us/data-center/nvlink/",
         "inter": "HDR InfiniBand 200 Gb/s per port (ConnectX-6); DGX A100 has one per GPU - "
                  "https://www.nvidia.com/en-us/data-center/dgx-a100/",
         "compute": "A100 TF32 Tensor Core 156 TFLOP/s dense - "
                    "https://www.nvidia.com/en-us/data-center/a100/",
         "latency": NCCL_TUNING_SOURCE}),
    "h100-ndr": Preset(
        "h100-ndr", "H100 SXM5", 8, 450e9, 50e9, 494.7e12,
        {"intra": "NVLink 4: 18 links, 900 GB/s total per H100 (both directions) - "
                  "https://www.nvidia.com/en-us/data-center/nvlink/",
         "inter": "NDR InfiniBand 400 Gb/s per port (ConnectX-7); DGX H100 has one per GPU - "
                  "https://www.nvidia.com/en-us/data-center/dgx-h100/",
         "compute": "H100 SXM TF32 Tensor Core 989 TFLOP/s with sparsity, 494.7 dense - "
                    "https://www.nvidia.com/en-us/data-center/h100/",
         "latency": NCCL_TUNING_SOURCE}),
    "h200-ndr": Preset(
        "h200-ndr", "H200 SXM", 8, 450e9, 50e9, 494.7e12,
        {"intra": "NVLink 4: 900 GB/s total per H200 (both directions) - "
                  "https://www.nvidia.com/en-us/data-center/h200/",
         "inter": "NDR InfiniBand 400 Gb/s per port (ConnectX-7), one per GPU as in DGX H200",
         "compute": "H200 SXM TF32 Tensor Core 989 TFLOP/s with sparsity, 494.7 dense (same GH100 compute as H100) - "
                    "https://www.nvidia.com/en-us/data-center/h200/",
         "latency": NCCL_TUNING_SOURCE}),
}
"""The presets by name. URLs were not opened from this machine (no network); numbers are as cited."""

PUBLISHED = {"nnodes": 4, "nproc_per_node": 2, "world_size": 8, "speedup": 5.97, "efficiency": 0.747,
             "overhead_fraction_min": 0.013, "overhead_fraction_max": 0.061}
"""The published KAN DDP result kanlib compares with: 8 GPUs over 4 nodes (2 per node)."""


def preset(name: str) -> Preset:
    """The preset called ``name`` (a KeyError-free lookup that names the choices)."""
    if name not in PRESETS:
        raise ValueError(f"preset: unknown value {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def published_comparison(profile: ComputeProfile | None = None, model: LinkModel | None = None,
                         widths=(64, 256, 256, 1), grid_size: int = 5, spline_order: int = 3,
                         global_batch: int = 65536, bucket_cap_mb: float = 25.0, preset_name: str = "a100-hdr",
                         ) -> dict:
    """The model's prediction for the published shape (8 GPUs = 4 nodes x 2) beside the published numbers.

    profile / model: a compute profile and link model (measured here, or None for ``preset_name``'s);
    widths, grid_size, spline_order, global_batch, bucket_cap_mb: the KAN and run the prediction is for
    (defaults: notebooks/params/gpu_cluster.yaml's; the published paper's exact model is an input).

    Returns ``{"table": DataFrame(quantity, predicted, published), "drivers": DataFrame, "basis": dict,
    "implied_fixed_s": float, "implied_cv": dict (:func:`implied_rank_cv`), "overhead_above_published": bool,
    "text": str}``. ``drivers`` varies one assumption at a time (compute x0.5
    / x2, inter-node latency x0.1 / x10, inter-node bandwidth x0.5 / x2, no overlap with backward, tree
    instead of ring, a fixed per-step time) and gives the change in predicted efficiency, largest first.
    ``implied_fixed_s`` is the per-step time that does not shrink with N (data loading, launches, a
    serial part) that would make the model reproduce the published efficiency; ``implied_cv`` the per-rank
    variability (stragglers) that would, with communication at most the published 6.1%;
    ``overhead_above_published``: the prediction exposes more communication than the paper measured (its speedup
    then matches for a different reason, and the text warns).
    """
    p = preset(preset_name)
    used_preset = [what for what, given in (("compute", profile), ("links", model)) if given is None]
    profile = profile or p.compute_profile()
    tree = p.link_model("tree") if model is None else replace(model, algo="tree")
    model = model or p.link_model("ring")
    pb = kan_param_bytes(widths, grid_size, spline_order)
    shape = (PUBLISHED["nnodes"], PUBLISHED["nproc_per_node"])

    def at8(prof: ComputeProfile, mdl: LinkModel, ovl: bool = True) -> pd.Series:
        pred = predict_scaling(mdl, prof, pb, [1, shape[0] * shape[1]], shape[1], global_batch,
                               bucket_cap_mb=bucket_cap_mb, overlap_backward=ovl)
        return pred.set_index("world_size").loc[8]

    base = at8(profile, model)
    table = pd.DataFrame([
        {"quantity": "speedup at 8 GPUs (4x2)", "predicted": base["speedup"], "published": PUBLISHED["speedup"]},
        {"quantity": "efficiency", "predicted": base["efficiency"], "published": PUBLISHED["efficiency"]},
        {"quantity": "communication overhead (exposed / step)", "predicted": base["overhead_fraction"],
         "published": f"{PUBLISHED['overhead_fraction_min']:.1%}-{PUBLISHED['overhead_fraction_max']:.1%}"},
    ])
    drivers = _drivers(profile, model, tree, base, at8)
    implied = _implied_fixed_s(profile, model, pb, global_batch, bucket_cap_mb, PUBLISHED["efficiency"])
    comm_loss = 1 - base["efficiency"]  # compute scales perfectly in the model unless fixed_s > 0
    published_loss = 1 - PUBLISHED["efficiency"]
    elsewhere = published_loss - PUBLISHED["overhead_fraction_max"]
    text = (f"For {list(widths)} (G={grid_size}, k={spline_order}, {int(sum(pb) // 4)} parameters), global batch "
            f"{global_batch}, on {model.label} with compute from {profile.source}: predicted speedup "
            f"{base['speedup']:.2f}x, efficiency {base['efficiency']:.1%}, communication overhead "
            f"{base['overhead_fraction']:.2%}, against the published 5.97x / 74.7% / 1.3-6.1%. "
            f"The model loses {comm_loss:.1%} of efficiency, {base['overhead_fraction']:.1%} of the step being exposed "
            f"communication. The published run lost {published_loss:.1%} with communication at most "
            f"{PUBLISHED['overhead_fraction_max']:.1%} of its step, so at least {elsewhere:.1%} came from elsewhere "
            f"(per-step work that does not shrink with N: input pipeline, launches, a serial part). ")
    if implied is not None:
        text += (f"With these links a per-step time of {implied * 1e3:.3g} ms that does not shrink with N would make "
                 f"the model reproduce 74.7%. ")
    elif comm_loss > published_loss:
        text += ("Communication alone already costs more than the published loss here: the links or compute "
                 "assumed are slower than the published cluster's. ")
    cv = implied_rank_cv(profile, model, pb, global_batch, bucket_cap_mb)
    if cv["rank_cv"] is not None:
        slower = (f"with compute {cv['compute_scale']:.3g}x slower (so that communication is at most "
                  f"{PUBLISHED['overhead_fraction_max']:.1%} of the step) " if cv["compute_scale"] > 1 + 1e-9 else "")
        text += (f"Alternatively, {slower}per-rank step times varying with a coefficient of variation of "
                 f"{cv['rank_cv']:.0%} (lognormal; each step waits for the slowest of 8) would reproduce 74.7% with "
                 f"{cv['overhead_fraction']:.1%} communication. ")
    else:
        text += "No per-rank variability reproduces 74.7% with at most 6.1% communication on these links. "
    if base["overhead_fraction"] > PUBLISHED["overhead_fraction_max"]:
        text += (f"WARNING: the predicted speedup comes with {base['overhead_fraction']:.1%} exposed communication, "
                 f"where the paper measured at most {PUBLISHED['overhead_fraction_max']:.1%}: a match of the speedup "
                 f"here is not a confirmation. ")
    text += f"Largest effects: {drivers['assumption'].iloc[0]} ({drivers['delta_efficiency'].iloc[0]:+.1%}), " \
            f"{drivers['assumption'].iloc[1]} ({drivers['delta_efficiency'].iloc[1]:+.1%})."
    basis = {"widths": list(widths), "grid_size": grid_size, "spline_order": spline_order,
             "n_params": int(sum(pb) // 4), "global_batch": global_batch, "bucket_cap_mb": bucket_cap_mb,
             "compute": profile.source, "links": model.label,
             "preset": f"{preset_name} ({', '.join(used_preset)})" if used_preset else None}
    return {"table": table, "drivers": drivers, "basis": basis, "implied_fixed_s": implied, "implied_cv": cv,
            "overhead_above_published": bool(base["overhead_fraction"] > PUBLISHED["overhead_fraction_max"]),
            "text": text}


def _drivers(profile: ComputeProfile, model: LinkModel, tree: LinkModel, base: pd.Series, at8) -> pd.DataFrame:
    """:func:`published_comparison`'s drivers: one assumption varied at a time (``at8`` predicts the published
    placement), the change in predicted efficiency against ``base``, largest first."""
    c = profile.seconds_per_sample_param
    variants = {
        "compute x0.5 (faster GPU kernels)": (replace(profile, seconds_per_sample_param=c / 2), model, True),
        "compute x2 (slower kernels)": (replace(profile, seconds_per_sample_param=c * 2), model, True),
        "inter-node latency x10": (profile, _scaled(model, "inter", alpha=10.0), True),
        "inter-node latency x0.1": (profile, _scaled(model, "inter", alpha=0.1), True),
        "inter-node bandwidth x0.5": (profile, _scaled(model, "inter", beta=2.0), True),
        "inter-node bandwidth x2": (profile, _scaled(model, "inter", beta=0.5), True),
        "no overlap with backward": (profile, model, False),
        "tree instead of ring": (profile, tree, True),
        "fixed 1 ms per step (serial part)": (replace(profile, fixed_s=profile.fixed_s + 1e-3), model, True),
    }
    drivers = []
    for name, (prof, mdl, ovl) in variants.items():
        r = at8(prof, mdl, ovl)
        drivers.append({"assumption": name, "efficiency": r["efficiency"],
                        "delta_efficiency": r["efficiency"] - base["efficiency"],
                        "overhead_fraction": r["overhead_fraction"]})
    drivers = pd.DataFrame(drivers)
    order = drivers["delta_efficiency"].abs().sort_values(ascending=False).index
    return drivers.reindex(order).reset_index(drop=True)


def _scaled(model: LinkModel, link: str, alpha: float = 1.0, beta: float = 1.0) -> LinkModel:
    """``model`` with one link's latency and inverse bandwidth multiplied (a what-if)."""
    links = dict(model.links)
    lk = model.link(link)
    links[lk.name] = replace(lk, raw_alpha_s=lk.raw_alpha_s * alpha, raw_beta_s_per_byte=lk.raw_beta_s_per_byte * beta,
                             alpha_s=None if lk.alpha_s is None else lk.alpha_s * alpha,
                             bandwidth_bytes_per_s=None if lk.bandwidth_bytes_per_s is None
                             else lk.bandwidth_bytes_per_s / beta)
    return replace(model, links=links)


def _bisect(f, lo: float, hi: float, grow: bool = True, limit: float = 1e6, iters: int = 60) -> float | None:
    """The x in [lo, ...) where the decreasing ``f`` crosses 0 (hi doubled until ``f(hi) <= 0``); None when it never
    does below ``limit``."""
    if f(lo) <= 0:
        return lo
    while f(hi) > 0:
        if not grow or hi >= limit:
            return None
        hi *= 2
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    return (lo + hi) / 2


def implied_rank_cv(profile: ComputeProfile, model: LinkModel, param_bytes, global_batch: int,
                    bucket_cap_mb: float = 25.0, target_efficiency: float = PUBLISHED["efficiency"],
                    max_overhead: float = PUBLISHED["overhead_fraction_max"]) -> dict:
    """What per-rank variability would reproduce the published efficiency at 8 GPUs (4 x 2) with communication at
    most ``max_overhead`` of the step, on ``model``'s links.

    First the compute is slowed by the smallest factor ``compute_scale`` >= 1 at which the exposed communication is
    at most ``max_overhead`` of the step without stragglers (slower kernels hide more of the all-reduce); then the
    lognormal per-rank spread ``sigma`` (:func:`kanlib.analysis.commmodel.predict_scaling`'s ``rank_sigma``: a step
    waits for the median of the slowest of 8 ranks) at which the efficiency is ``target_efficiency``. Returns
    ``{"compute_scale", "rank_sigma", "rank_cv", "overhead_fraction", "efficiency"}`` (``rank_cv`` None when no
    spread up to CV 1000% reaches the target: communication alone then costs more)."""
    shape = (PUBLISHED["nnodes"], PUBLISHED["nproc_per_node"])
    w = shape[0] * shape[1]

    def at8(scale: float, sigma: float) -> pd.Series:
        prof = replace(profile, seconds_per_sample_param=profile.seconds_per_sample_param * scale,
                       fixed_s=profile.fixed_s * scale)
        p = predict_scaling(model, prof, param_bytes, [1, w], shape[1], global_batch, bucket_cap_mb=bucket_cap_mb,
                            rank_sigma=sigma)
        return p.set_index("world_size").loc[w]

    scale = _bisect(lambda k: at8(k, 0.0)["overhead_fraction"] - max_overhead, 1.0, 2.0)
    out = {"compute_scale": scale, "rank_sigma": None, "rank_cv": None, "overhead_fraction": None, "efficiency": None}
    if scale is None:
        return out
    sigma = _bisect(lambda v: at8(scale, v)["efficiency"] - target_efficiency, 0.0, 0.05, limit=2.2)
    if sigma is None:
        return out
    r = at8(scale, sigma)
    return {"compute_scale": scale, "rank_sigma": sigma, "rank_cv": math.sqrt(math.expm1(sigma ** 2)),
            "overhead_fraction": float(r["overhead_fraction"]), "efficiency": float(r["efficiency"])}


def _implied_fixed_s(profile, model, pb, global_batch, bucket_cap_mb, target) -> float | None:
    """Per-step fixed time (s) at which the predicted efficiency at 8 GPUs (4x2) equals ``target``
    (bisection; None when even no fixed time stays below it)."""
    def eff(fixed):
        prof = replace(profile, fixed_s=fixed)
        pred = predict_scaling(model, prof, pb, [1, 8], 2, global_batch, bucket_cap_mb=bucket_cap_mb)
        return float(pred.set_index("world_size").loc[8, "efficiency"])

    lo, hi = 0.0, 1e-6
    if eff(lo) <= target:
        return None
    while eff(hi) > target and hi < 1e4:
        hi *= 2
    if not math.isfinite(hi) or hi >= 1e4:
        return None
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if eff(mid) > target else (lo, mid)
    return (lo + hi) / 2
