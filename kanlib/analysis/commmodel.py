"""A performance model of DDP's gradient all-reduce with intra- and inter-node links, fitted on the
collective benchmark (kanlib.collbench), checked against every DDP run, and used to extrapolate.

**All-reduce of n bytes** over a placement ``N x P`` (N nodes, P processes per node, W = N P ranks).
Each kind of link has a per-message latency ``alpha`` (s) and an inverse bandwidth ``beta``
(s/byte = 1 / bandwidth); a placement uses the inter-node link when N > 1 (:func:`allreduce_terms`):

- ring (also gloo's algorithm): ``2 (W-1) alpha_L + 2 (W-1)/W * n * beta_L`` with L = inter if N > 1
  else intra (every step of the ring waits for its slowest hop);
- tree: N = 1: a chain, ``2 (P-1) alpha_intra + 2 n beta_intra``; N > 1:
  ``2 ceil(log2 N) alpha_inter + 2 (P-1) alpha_intra + 2 n beta_inter`` (reduce up, broadcast down,
  pipelined, so the bandwidth term does not grow with depth);
- NCCL's own choice, when its debug output did not say which it took: fitted with the ring terms.

A model may add a fixed ``base_s`` per all-reduce (NCCL's own base latency; presets only: in a fit it
cannot be told apart from ``alpha`` when every point has the same world size).

**Fit** (:func:`fit_collbench`): per backend, algorithm and emulated link, non-negative relative
least squares (every point counts alike whatever its size) of the benchmark's per-size times, with
the leave-one-out relative error of every point. A constant the data cannot resolve - no point uses
its link, the fit puts it at its bound 0, its term is below ``min_share`` of every point's time (e.g.
a bandwidth from latency-bound sizes), or its standard error exceeds ``max_rel_se`` of it - is
reported as None with the reason, never as 0. Predictions inside the measured range still use the
fit's raw values (``raw_alpha_s``, ``raw_beta_s_per_byte``).

**DDP** (:func:`ddp_buckets`, :func:`overlap`): gradients are bucketed in reverse registration
order, a parameter never split, a bucket closing once it reaches its cap; buckets become ready as
backward proceeds (at a uniform rate per gradient byte); a bucket's all-reduce starts when it is
ready and the previous one is done; the exposed communication is what is left after backward ends.
:func:`validate_ddp` compares predicted and measured step time and exposed communication for every
timed run that has a no-op twin; :func:`transfer_waiting` splits each run's hook time into the
transfer the benchmark predicts for its recorded buckets and the waiting for other ranks (skew).

**Stragglers, contention, leave-one-out** (:func:`ddp_parity`, :func:`model_validation`,
:class:`ModelValidation`, :func:`fitted_contention`, :data:`STEP_MARGIN`, :data:`EXPOSED_MARGIN`): a DDP step at W
ranks is ``(1 + gamma) M_W + sync_s + per_bucket_s n_buckets + X`` - the median of the slowest of W ranks' compute
(kanlib.analysis.straggler, from the no-op twins' per-rank step times at the run's placement), slowed by the
contention that real communication adds on shared cores (:data:`CONTENTION_TERMS`), plus the transfer backward does
not hide; the contention is fitted on the other runs, so every run is predicted by a model fitted without it.
``model_validation(ddp_parity(records, fits))`` (or ``model_validation(records, fits)``) returns the median
|leave-one-out error| of step and exposed communication and ``.ok`` unless a median's whole bootstrap interval lies
beyond 10% / 25%; guidance and extrapolation use the model only then.

**Extrapolation** (:func:`predict_scaling`, :func:`extrapolation_table`, :func:`ring_tree_crossover`,
:func:`sizes_above`): step time, efficiency and exposed communication from 1 to thousands of GPUs for
a compute profile (:class:`ComputeProfile`, measured or a preset of kanlib.analysis.presets). With ``rank_sigma``
and ``contention`` a step waits for the slowest of N ranks; ``extrapolation_table`` adds the band
(``efficiency_lo``/``_hi``) and the optimistic bound without either (``efficiency_bound``). Neither has
congestion or the P processes of a node sharing its network.

pandas and numpy only: no torch import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kanlib.analysis import stats, straggler
from kanlib.analysis.groups import hashable
from kanlib.analysis.stats import bootstrap_ci

ALGOS = ("ring", "tree")
LINKS = ("intra", "inter")
MIB = 1024 * 1024


# -- the all-reduce formulas ------------------------------------------------------------------------------
def allreduce_terms(algo: str, nnodes: int, nproc_per_node: int) -> dict[str, tuple[float, float]]:
    """``{link: (latency_count, bytes_factor)}`` of one all-reduce: its time is
    ``sum over links of latency_count * alpha_link + bytes_factor * n_bytes * beta_link``.

    algo: ring, tree, or auto (NCCL's choice, modelled as ring). nnodes, nproc_per_node: the placement.
    """
    n, p = int(nnodes), int(nproc_per_node)
    if n < 1 or p < 1:
        raise ValueError(f"placement: need nnodes >= 1 and nproc_per_node >= 1, got {n}x{p}")
    w = n * p
    if w == 1:
        return {}
    if algo in ("ring", "auto"):
        return {"inter" if n > 1 else "intra": (2.0 * (w - 1), 2.0 * (w - 1) / w)}
    if algo == "tree":
        if n == 1:
            return {"intra": (2.0 * (p - 1), 2.0)}
        out = {"inter": (2.0 * math.ceil(math.log2(n)), 2.0)}
        if p > 1:
            out["intra"] = (2.0 * (p - 1), 0.0)
        return out
    raise ValueError(f"algo: unknown value {algo!r}; choose one of ring, tree, auto")


def link_name(nnodes: int, emulate_latency_s: float = 0.0, emulate_bandwidth_bytes_per_s: float = 0.0) -> str:
    """``intra`` for one node; ``inter`` across nodes; ``inter+emulated`` when an emulated link applies."""
    if int(nnodes) <= 1:
        return "intra"
    return "inter+emulated" if (emulate_latency_s or 0) > 0 or (emulate_bandwidth_bytes_per_s or 0) > 0 else "inter"


def row_algorithm(backend: str, nccl_algo: str = "", nccl_algo_used: str | None = None) -> str:
    """The algorithm a record's all-reduces ran: ring on gloo (gloo's allreduce defaults to its ring);
    on NCCL the one NCCL logged (lower case: ring, tree, nvls, ...), else the one asked for, else
    ``auto`` (NCCL's choice, unknown)."""
    if backend == "gloo":
        return "ring"
    used = (nccl_algo_used or "").lower() if isinstance(nccl_algo_used, str) else ""
    if used and "+" not in used:
        return used
    asked = (nccl_algo or "").lower() if isinstance(nccl_algo, str) else ""
    return asked or "auto"


def _formula(algo: str) -> str:
    """The formula used for ``algo``: ring and tree have their own; anything else is fitted as ring."""
    return algo if algo in ALGOS else "auto"


@dataclass
class Link:
    """One kind of link: per-message latency and bandwidth, with why a constant is not reported.

    ``alpha_s`` (s) and ``bandwidth_bytes_per_s`` are None when the data do not resolve them
    (``alpha_why`` / ``bandwidth_why`` say why). ``raw_alpha_s`` and ``raw_beta_s_per_byte`` are the
    values predictions use (the fit's, even where too weakly determined to report; 0 = none).
    """

    name: str
    alpha_s: float | None
    bandwidth_bytes_per_s: float | None
    raw_alpha_s: float
    raw_beta_s_per_byte: float
    alpha_why: str | None = None
    bandwidth_why: str | None = None
    alpha_rel_se: float = math.nan
    beta_rel_se: float = math.nan
    n_points: int = 0
    source: str = "fit"

    def describe(self, used: bool = False) -> str:
        """``45 us, 1.2 GB/s`` (see :meth:`LinkModel.describe`)."""
        if used:
            lat = f"{self.raw_alpha_s * 1e6:.3g} us" + ("" if self.alpha_s is not None else " (unresolved)")
            bw = (f"{1 / self.raw_beta_s_per_byte / 1e9:.3g} GB/s" if self.raw_beta_s_per_byte > 0
                  else "no bandwidth term") + ("" if self.bandwidth_bytes_per_s is not None else " (unresolved)")
            return f"{lat}, {bw}"
        lat = f"{self.alpha_s * 1e6:.3g} us" if self.alpha_s is not None else f"latency not resolved ({self.alpha_why})"
        if self.bandwidth_bytes_per_s is not None:
            bw = f"{self.bandwidth_bytes_per_s / 1e9:.3g} GB/s"
        elif self.bandwidth_why == "unlimited (given as 0)":
            bw = "unlimited bandwidth"
        else:
            bw = f"bandwidth not resolved ({self.bandwidth_why})"
        return f"{lat}, {bw}"

    @classmethod
    def given(cls, name: str, alpha_s: float, bandwidth_bytes_per_s: float, source: str = "given") -> "Link":
        """A link with known constants (a preset or a what-if); bandwidth 0 = unlimited."""
        if alpha_s < 0 or bandwidth_bytes_per_s < 0:
            raise ValueError(f"{name}: alpha_s and bandwidth_bytes_per_s must be >= 0, got {alpha_s}, "
                             f"{bandwidth_bytes_per_s}")
        beta = 1.0 / bandwidth_bytes_per_s if bandwidth_bytes_per_s > 0 else 0.0
        return cls(name, alpha_s, bandwidth_bytes_per_s or None, alpha_s, beta,
                   bandwidth_why=None if bandwidth_bytes_per_s > 0 else "unlimited (given as 0)", source=source)


@dataclass
class LinkModel:
    """All-reduce time over the intra- and inter-node links for one backend and algorithm."""

    algo: str
    links: dict[str, Link]
    backend: str = ""
    base_s: float = 0.0
    label: str = ""

    def time_s(self, n_bytes, nnodes: int, nproc_per_node: int):
        """Predicted seconds of one all-reduce of ``n_bytes`` (scalar or array) at placement ``nnodes x
        nproc_per_node``. Raises ValueError naming the link when the placement needs one this model lacks."""
        terms = allreduce_terms(_formula(self.algo), nnodes, nproc_per_node)
        nb = np.asarray(n_bytes, dtype=float)
        t = np.zeros_like(nb) + (self.base_s if terms else 0.0)
        for name, (lat, fac) in terms.items():
            link = self.link(name)
            t = t + lat * link.raw_alpha_s + fac * nb * link.raw_beta_s_per_byte
        return t

    def link(self, kind: str) -> Link:
        """The link of kind ``kind`` (``intra`` or ``inter``; an emulated inter-node link stands in for ``inter``)."""
        if kind in self.links:
            return self.links[kind]
        if kind == "inter":  # a model fitted on one emulated inter-node link uses it as its inter-node link
            emulated = [v for k, v in self.links.items() if k.startswith("inter")]
            if len(emulated) == 1:
                return emulated[0]
        raise ValueError(f"link: this {self.label or self.algo} model has no {kind!r} link "
                         f"(it has {', '.join(self.links) or 'none'}); measure a placement that uses it")

    def describe(self, used: bool = False) -> str:
        """The links in one line: ``intra 45 us, 1.2 GB/s; inter: latency not resolved (why), 80 MB/s`` (a constant
        the data could not resolve is named so, never printed as 0). ``used``: the values predictions use
        instead (the fit's, resolved or not), each unresolved one marked ``(unresolved)``."""
        return "; ".join(f"{name} {link.describe(used)}" for name, link in self.links.items())

    def unresolved(self) -> list[str]:
        """``link.constant`` names that the data did not resolve (predictions there are unreliable)."""
        out = []
        for name, link in self.links.items():
            if link.alpha_s is None:
                out.append(f"{name}.alpha")
            if link.bandwidth_bytes_per_s is None and link.bandwidth_why != "unlimited (given as 0)":
                out.append(f"{name}.bandwidth")
        return out


# -- non-negative least squares --------------------------------------------------------------------------
def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """``argmin ||a x - b||`` subject to ``x >= 0`` (Lawson-Hanson active set, on unit-norm columns:
    latency and bandwidth columns differ by many orders of magnitude)."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    m, n = a.shape
    scale = np.linalg.norm(a, axis=0)
    used = scale > 0
    scale[~used] = 1.0
    a = a / scale
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    max_iter = max_iter or 3 * n + 10
    tol = 10 * np.finfo(float).eps * max(1.0, np.linalg.norm(a, 1)) * max(m, n)
    for _ in range(max_iter):
        w = a.T @ (b - a @ x)
        w[~used] = -np.inf  # an all-zero column stays at 0
        if (passive | ~used).all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            step = x[neg] - z[neg]
            alpha = np.min(np.where(step > 0, x[neg] / np.where(step > 0, step, 1.0), np.inf)) if neg.any() else 0.0
            alpha = 0.0 if not np.isfinite(alpha) else alpha
            x = x + alpha * (z - x)
            passive &= x > 0
            x[~passive] = 0.0
            if not passive.any():
                break
    return x / scale


# -- fitting the collective benchmark ----------------------------------------------------------------------
@dataclass
class CollFit:
    """A fitted :class:`LinkModel` with its points and errors.

    ``points``: one row per (placement, size) - median over repeats - with ``time_s`` measured,
    ``pred_s``, ``rel_err`` (in-sample) and ``loo_pred_s``, ``loo_rel_err`` (the point left out).
    """

    key: tuple
    model: LinkModel
    points: pd.DataFrame
    rel_rmse: float
    loo_rel_rmse: float
    emulate_latency_s: float = 0.0
    emulate_bandwidth_bytes_per_s: float = 0.0


def _design(points: pd.DataFrame, algo: str) -> tuple[np.ndarray, list[str]]:
    """Columns ``[alpha_l, beta_l for l in links]`` of each point's all-reduce time, and the links
    (``intra``, ``inter`` or ``inter+emulated``: a multi-node point's inter-node link is its own)."""
    terms = []
    for nn, pp, ln in zip(points["nnodes"], points["nproc_per_node"], points["link"]):
        terms.append({(ln if kind == "inter" else kind): v
                      for kind, v in allreduce_terms(_formula(algo), nn, pp).items()})
    present = {name for t in terms for name in t}
    links = [ln for ln in ("intra", "inter", "inter+emulated") if ln in present]
    x = np.zeros((len(points), 2 * len(links)))
    for i, (t, nb) in enumerate(zip(terms, points["size_bytes"])):
        for name, (lat, fac) in t.items():
            j = links.index(name)
            x[i, 2 * j] = lat
            x[i, 2 * j + 1] = fac * nb
    return x, links


def _fit_weighted(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Relative NNLS: minimise ``sum ((x c - y) / y)^2`` over ``c >= 0``."""
    w = 1.0 / np.maximum(y, 1e-300)
    return nnls(x * w[:, None], y * w)


def fit_collbench(bench: pd.DataFrame, min_share: float = 0.05, max_rel_se: float = 0.5,
                  time_col: str = "time_s") -> dict[tuple, CollFit]:
    """Fit latency and bandwidth of every link on collbench rows (kanlib.analysis.load.load_bench).

    One fit per ``(backend, device, algorithm, emulate_latency_s, emulate_bandwidth_bytes_per_s)``;
    single-node points (which no emulation touches) join every fit of their backend, device and
    algorithm. ``time_col``: the per-size time fitted - ``time_s`` (the median over iterations) or
    ``time_s_p10`` (the lower decile: the iterations least disturbed by other processes, for a
    machine shared with other work). Returns ``{key: CollFit}``; see the module docstring for when a
    constant is None.
    """
    need = ("backend", "nnodes", "nproc_per_node", "size_bytes", time_col)
    missing = [c for c in need if c not in bench]
    if missing:
        raise ValueError(f"the link fit needs the collbench columns {missing} (kanlib.analysis.load.load_bench)")
    d = bench[bench["nnodes"] * bench["nproc_per_node"] > 1].copy()
    d["time_s"] = d[time_col]
    if d.empty:
        raise ValueError("the link fit needs collbench runs with more than one process; got none")
    d["device"] = d["device"] if "device" in d else "cpu"
    for c in ("nccl_algo", "nccl_algo_used"):
        if c not in d:
            d[c] = ""
    for c in ("emulate_latency_s", "emulate_bandwidth_bytes_per_s"):
        d[c] = d[c].fillna(0.0).astype(float) if c in d else 0.0
    single = d["nnodes"] == 1
    d.loc[single, ["emulate_latency_s", "emulate_bandwidth_bytes_per_s"]] = 0.0  # no emulation on one node
    d["algo"] = [row_algorithm(b, a, u) for b, a, u in zip(d["backend"], d["nccl_algo"], d["nccl_algo_used"])]
    d["link"] = [link_name(n, lat, bw) for n, lat, bw in
                 zip(d["nnodes"], d["emulate_latency_s"], d["emulate_bandwidth_bytes_per_s"])]
    fits = {}
    for (backend, device, algo), g in d.groupby(["backend", "device", "algo"], sort=True):
        multi = g[g["nnodes"] > 1]
        emus = sorted(set(zip(multi["emulate_latency_s"], multi["emulate_bandwidth_bytes_per_s"]))) or [(0.0, 0.0)]
        for lat, bw in emus:
            same_link = (g["emulate_latency_s"] == lat) & (g["emulate_bandwidth_bytes_per_s"] == bw)
            part = g[(g["nnodes"] == 1) | same_link]
            key = (backend, device, algo, float(lat), float(bw))
            fits[key] = _fit_group(key, part, min_share, max_rel_se)
    return fits


def _fit_group(key: tuple, rows: pd.DataFrame, min_share: float, max_rel_se: float) -> CollFit:
    backend, device, algo, lat, bw = key
    pts = (rows.groupby(["nnodes", "nproc_per_node", "link", "size_bytes"], as_index=False)
           .agg(time_s=("time_s", "median"), n_runs=("time_s", "size")))
    pts = pts.sort_values(["nnodes", "nproc_per_node", "size_bytes"]).reset_index(drop=True)
    x, links = _design(pts, algo)
    y = pts["time_s"].to_numpy(float)
    coef = _fit_weighted(x, y)
    pred = x @ coef
    rel = (pred - y) / y
    loo = np.full(len(y), np.nan)
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        if keep.sum() >= 1:
            loo[i] = x[i] @ _fit_weighted(x[keep], y[keep])
    pts["placement"] = pts["nnodes"].astype(str) + "x" + pts["nproc_per_node"].astype(str)
    pts["pred_s"], pts["rel_err"] = pred, rel
    pts["loo_pred_s"], pts["loo_rel_err"] = loo, (loo - y) / y
    rse = _relative_se(x, y, coef)
    model_links = {}
    for j, name in enumerate(links):
        ja, jb = 2 * j, 2 * j + 1
        a_val, a_why = _resolve(x, pred, coef, rse, ja, name, "latency", min_share, max_rel_se)
        b_val, b_why = _resolve(x, pred, coef, rse, jb, name, "bandwidth", min_share, max_rel_se)
        n_pts = int((x[:, ja] > 0).sum())
        model_links[name] = Link(name, a_val, (1.0 / b_val) if b_val else None, float(coef[ja]), float(coef[jb]),
                                 a_why, b_why, float(rse[ja]), float(rse[jb]), n_pts, "fit")
    label = f"{backend}/{device}/{algo}" + (f" (emulated L={lat:g} s, B={bw:g} B/s)" if lat or bw else "")
    model = LinkModel(algo, model_links, backend, 0.0, label)
    return CollFit(key, model, pts, float(np.sqrt(np.mean(rel ** 2))),
                   float(np.sqrt(np.nanmean(((loo - y) / y) ** 2))), float(lat), float(bw))


def _relative_se(x: np.ndarray, y: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """Standard error of each positive coefficient relative to its value (inf where undetermined)."""
    w = 1.0 / np.maximum(y, 1e-300)
    xw = x * w[:, None]
    r = xw @ coef - y * w
    active = coef > 0
    out = np.full(len(coef), np.inf)
    dof = len(y) - int(active.sum())
    if not active.any() or dof <= 0:
        return out
    s2 = float(r @ r) / dof
    xa = xw[:, active]
    try:
        cov = s2 * np.linalg.inv(xa.T @ xa)
    except np.linalg.LinAlgError:
        return out
    out[active] = np.sqrt(np.maximum(np.diag(cov), 0.0)) / coef[active]
    return out


def _resolve(x, pred, coef, rse, j, link, what, min_share, max_rel_se) -> tuple[float | None, str | None]:
    """(value, None) when coefficient ``j`` is resolved, else (None, why)."""
    col = x[:, j]
    where = "single-node" if link == "intra" else "multi-node"
    if not (col > 0).any():
        if what == "bandwidth" and (x[:, j - 1] > 0).any():
            return None, f"this algorithm has no {link} bandwidth term at these placements"
        return None, f"no {where} ({link}) points in the data"
    c = coef[j]
    if c <= 0:
        hint = " (the sizes measured are latency-bound: add larger messages)" if what == "bandwidth" else ""
        return None, f"the fit puts the {link} {what} term at its bound 0: the data do not need it{hint}"
    share = float(np.max(col * c / np.maximum(pred, 1e-300)))
    if share < min_share:
        return None, (f"its term is at most {share:.1%} of any point's time (below {min_share:.0%}): these sizes "
                      f"do not resolve the {link} {what}")
    if not rse[j] <= max_rel_se:
        return None, f"the {link} {what} is uncertain by +-{rse[j]:.0%} of its value (more than {max_rel_se:.0%})"
    return float(c), None


def fit_table(fits: dict[tuple, CollFit]) -> pd.DataFrame:
    """One row per fit x link: the constants (None where unresolved, with the reasons), point counts,
    in-sample and leave-one-out relative RMS errors."""
    rows = []
    for key, f in fits.items():
        for name, link in f.model.links.items():
            rows.append({"backend": key[0], "device": key[1], "algo": key[2], "emulate_latency_s": key[3],
                         "emulate_bandwidth_bytes_per_s": key[4], "link": name, "alpha_s": link.alpha_s,
                         "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s, "alpha_why": link.alpha_why,
                         "bandwidth_why": link.bandwidth_why, "alpha_rel_se": link.alpha_rel_se,
                         "beta_rel_se": link.beta_rel_se, "n_points": link.n_points, "rel_rmse": f.rel_rmse,
                         "loo_rel_rmse": f.loo_rel_rmse})
    return pd.DataFrame(rows)


def fit_points(fits: dict[tuple, CollFit]) -> pd.DataFrame:
    """Every fitted point of every fit, with its leave-one-out error (for the report's table)."""
    parts = []
    for key, f in fits.items():
        p = f.points.copy()
        p["backend"], p["device"], p["algo"] = key[0], key[1], key[2]
        p["emulate_latency_s"], p["emulate_bandwidth_bytes_per_s"] = key[3], key[4]
        parts.append(p)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def recovered_links(fits: dict[tuple, CollFit]) -> pd.DataFrame:
    """What each emulated link added, as the fits see it: the emulated inter-node link's constants
    minus those of the same backend, device and algorithm without emulation (the real link the
    emulation sits on top of), beside what was injected.

    Columns: the key, ``alpha_s`` / ``bandwidth_bytes_per_s`` of the emulated link's fit,
    ``recovered_latency_s = alpha_emulated - alpha_real``, ``recovered_bandwidth_bytes_per_s =
    1 / (beta_emulated - beta_real)`` (None when not positive), their relative errors against the
    injected values, and ``why`` when there is no real-link fit to subtract (the emulated fit is then
    compared as it is).
    """
    rows = []
    for key, f in fits.items():
        backend, device, algo, lat, bw = key
        if not (lat or bw):
            continue
        emu = f.model.links.get("inter+emulated")
        if emu is None:
            continue
        plain = fits.get((backend, device, algo, 0.0, 0.0))
        real = plain.model.links.get("inter") if plain is not None else None
        a0, b0 = (real.raw_alpha_s, real.raw_beta_s_per_byte) if real is not None else (0.0, 0.0)
        # a constant the emulated fit does not resolve is not recovered either (None, never 0)
        rec_a = emu.raw_alpha_s - a0 if emu.alpha_s is not None else None
        rec_beta = emu.raw_beta_s_per_byte - b0
        rec_b = 1.0 / rec_beta if rec_beta > 0 and emu.bandwidth_bytes_per_s is not None else None
        rows.append({"backend": backend, "device": device, "algo": algo, "emulate_latency_s": lat,
                     "emulate_bandwidth_bytes_per_s": bw, "alpha_s": emu.alpha_s,
                     "bandwidth_bytes_per_s": emu.bandwidth_bytes_per_s, "recovered_latency_s": rec_a,
                     "recovered_bandwidth_bytes_per_s": rec_b,
                     "latency_rel_err": (rec_a - lat) / lat if lat and rec_a is not None else math.nan,
                     "bandwidth_rel_err": (rec_b - bw) / bw if bw and rec_b else math.nan,
                     "why": None if real is not None else "no fit of the real inter-node link (run the same "
                                                          "placement without emulation) to subtract"})
    return pd.DataFrame(rows)


def find_fit(fits: dict[tuple, CollFit], backend: str, device: str, algo: str, nnodes: int,
             emulate_latency_s: float = 0.0, emulate_bandwidth_bytes_per_s: float = 0.0) -> CollFit | None:
    """The fit that describes a run's all-reduces: same backend, device and algorithm, and (for a
    multi-node run) the same emulated link; None when there is none."""
    lat, bw = (float(emulate_latency_s or 0), float(emulate_bandwidth_bytes_per_s or 0)) if nnodes > 1 else (0.0, 0.0)
    f = fits.get((backend, device, algo, lat, bw))
    if f is not None or nnodes > 1:
        return f
    same = [f for k, f in fits.items() if k[:3] == (backend, device, algo)]  # any fit has the intra link
    return same[0] if same else None


# -- DDP: buckets and overlap with backward --------------------------------------------------------------
def ddp_buckets(param_bytes_in_registration_order, bucket_cap_mb: float, first_bucket_mb: float | None = None,
                ) -> list[int]:
    """Bytes of DDP's gradient buckets in launch order.

    Parameters are taken in reverse registration order (the order backward produces their gradients);
    a bucket closes once it holds at least its cap (the parameter that crosses the cap is included: a
    parameter is never split). The first bucket's cap is ``first_bucket_mb``; None means torch's rule
    for an explicit ``bucket_cap_mb`` (torch 2.13: the same cap, no smaller first bucket; DDP uses a 1
    MiB first bucket only when ``bucket_cap_mb`` is left unset - pass ``first_bucket_mb=1.0`` for that).
    """
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb: must be positive, got {bucket_cap_mb!r}")
    caps = [int((first_bucket_mb if first_bucket_mb is not None else bucket_cap_mb) * MIB), int(bucket_cap_mb * MIB)]
    out, cur = [], 0
    for b in reversed(list(param_bytes_in_registration_order)):
        if b < 0:
            raise ValueError(f"param_bytes_in_registration_order: negative size {b}")
        cur += int(b)
        if cur >= caps[min(len(out), 1)]:
            out.append(cur)
            cur = 0
    if cur:
        out.append(cur)
    return out


def kan_param_bytes(widths, grid_size: int = 5, spline_order: int = 3, model: str = "kan",
                    bytes_per_param: int = 4) -> list[int]:
    """Bytes of each parameter tensor in registration order (what DDP buckets).

    kan (kanlib.model.KANLinear per layer): base_weight ``(out, in)``, spline_weight ``(out, in, G+k)``,
    spline_scaler ``(out, in)``; mlp (kanlib.model.MLP): weight ``(out, in)``, bias ``(out,)``.
    """
    widths = [int(w) for w in widths]
    if len(widths) < 2 or min(widths) < 1:
        raise ValueError(f"widths: need at least 2 positive entries, got {widths}")
    out = []
    for a, b in zip(widths, widths[1:]):
        if model == "kan":
            out += [b * a, b * a * (grid_size + spline_order), b * a]
        elif model == "mlp":
            out += [b * a, b]
        else:
            raise ValueError(f"model: unknown value {model!r}; choose kan or mlp")
    return [n * bytes_per_param for n in out]


def overlap(bucket_bytes, backward_s: float, transfer_s) -> dict:
    """Overlap of bucket all-reduces with backward.

    bucket_bytes: bytes of each bucket in launch order; backward_s: backward compute time (s);
    transfer_s: seconds of each bucket's all-reduce (same length). Bucket k is ready at
    ``backward_s * (bytes of buckets 0..k) / total``; it starts when ready and the previous one is
    done. Returns ``transfer_s`` (sum), ``in_flight_s`` (union of the intervals), ``end_s`` (last end,
    from the start of backward) and ``exposed_s = max(0, end_s - backward_s)``.
    """
    b = np.asarray(bucket_bytes, dtype=float)
    t = np.asarray(transfer_s, dtype=float)
    if b.shape != t.shape:
        raise ValueError(f"transfer_s: one per bucket, got {t.shape} for {b.shape} buckets")
    if b.size == 0:
        return {"transfer_s": 0.0, "in_flight_s": 0.0, "end_s": 0.0, "exposed_s": 0.0}
    ready = backward_s * np.cumsum(b) / b.sum()
    end, spans = 0.0, []
    for r, dt in zip(ready, t):
        start = max(r, end)
        end = start + dt
        spans.append((start, end))
    in_flight = sum(e - s for s, e in _merge(spans))
    return {"transfer_s": float(t.sum()), "in_flight_s": float(in_flight), "end_s": float(end),
            "exposed_s": float(max(0.0, end - backward_s))}


def _merge(spans):
    out = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


# -- validation on DDP runs ------------------------------------------------------------------------------
_TWIN_KEYS = ("nnodes", "nproc_per_node", "model", "widths", "grid_size", "spline_order", "global_batch",
              "bucket_cap_mb", "nccl_algo", "backend", "device", "kan_impl", "precision", "gradient_as_bucket_view",
              "static_graph", "grad_accum_steps", "task")


def _twins(records: pd.DataFrame) -> list[tuple[dict, pd.DataFrame, pd.DataFrame]]:
    """``(point, timed runs, no-op runs)`` for every configuration with both (the no-op twin of an
    emulated run is the same configuration without emulation)."""
    keys = [k for k in _TWIN_KEYS if k in records]
    d = records.copy()
    for k in keys:
        d[k] = d[k].map(hashable)
    out = []
    for key, g in d.groupby(keys, dropna=False, sort=True):
        noop = g[g["comm_hook"] == "noop"]
        timed = g[g["comm_hook"] == "timed"]
        if noop.empty or timed.empty:
            continue
        emu = [c for c in ("emulate_latency_s", "emulate_bandwidth_bytes_per_s") if c in timed]
        for emu_key, t in (timed.groupby(emu, dropna=False) if emu else [((0.0, 0.0), timed)]):
            emu_key = emu_key if isinstance(emu_key, tuple) else (emu_key,)
            point = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
            point.update(dict(zip(emu, emu_key)))
            out.append((point, t, noop))
    return out


def validate_ddp(records: pd.DataFrame, fits: dict[tuple, CollFit]) -> pd.DataFrame:
    """Predicted against measured step time and exposed communication for every timed DDP run with a
    no-op twin (the parity table).

    Per timed run: measured ``step_time_s`` and ``exposed_s = step_time_s - T_noop`` (T_noop, backward_noop_s:
    medians of the twin's runs); predicted ``pred_exposed_s`` from :func:`overlap` of the run's recorded
    ``bucket_bytes`` with the twin's backward time and the matching collbench fit, and
    ``pred_step_time_s = T_noop + pred_exposed_s``; relative errors ``step_rel_err`` and
    ``exposed_rel_err`` (NaN when the measured exposure is 0), and ``why`` when no fit matches.
    """
    rows = []
    for point, timed, noop in _twins(records):
        t_noop = float(np.median(noop["step_time_s"].to_numpy(float)))
        bwd = float(np.median(noop["backward_s"].to_numpy(float))) if "backward_s" in noop else math.nan
        for _, r in timed.iterrows():
            row = {**{k: point.get(k) for k in point}, "run_key": r.get("run_key"), "placement":
                   f"{int(r['nnodes'])}x{int(r['nproc_per_node'])}", "t_noop_s": t_noop, "backward_noop_s": bwd,
                   "step_time_s": float(r["step_time_s"]), "exposed_s": float(r["step_time_s"]) - t_noop}
            pred = _predict_run(r, fits, bwd)
            row.update(pred)
            row["pred_step_time_s"] = t_noop + pred["pred_exposed_s"]
            row["step_rel_err"] = (row["pred_step_time_s"] - row["step_time_s"]) / row["step_time_s"]
            row["exposed_rel_err"] = ((pred["pred_exposed_s"] - row["exposed_s"]) / row["exposed_s"]
                                      if row["exposed_s"] > 0 else math.nan)
            rows.append(row)
    return pd.DataFrame(rows)


def _predict_run(r, fits, backward_s: float) -> dict:
    """Transfer, in-flight and exposed time the fit predicts for one timed DDP record ``r``."""
    nan = {"pred_transfer_s": math.nan, "pred_in_flight_s": math.nan, "pred_exposed_s": math.nan,
           "fit": None, "why": None}
    buckets = r.get("bucket_bytes")
    if not isinstance(buckets, (list, tuple)) or not buckets:
        return {**nan, "why": "the record has no bucket_bytes"}
    algo = row_algorithm(r.get("backend", ""), r.get("nccl_algo", ""), r.get("nccl_algo_used"))
    nnodes, ppn = int(r["nnodes"]), int(r["nproc_per_node"])
    f = find_fit(fits, r.get("backend", ""), r.get("device", "cpu"), algo, nnodes,
                 r.get("emulate_latency_s", 0.0), r.get("emulate_bandwidth_bytes_per_s", 0.0))
    if f is None:
        return {**nan, "why": f"no collbench fit for {r.get('backend')}/{r.get('device')}/{algo} at "
                              f"{nnodes}x{ppn} with this run's emulated link"}
    try:
        t = f.model.time_s(np.asarray(buckets, float), nnodes, ppn)
    except ValueError as e:
        return {**nan, "fit": f.model.label, "why": str(e)}
    ov = overlap(buckets, backward_s if math.isfinite(backward_s) else 0.0, t)
    return {"pred_transfer_s": ov["transfer_s"], "pred_in_flight_s": ov["in_flight_s"],
            "pred_exposed_s": ov["exposed_s"], "fit": f.model.label, "why": None}


def transfer_waiting(records: pd.DataFrame, fits: dict[tuple, CollFit]) -> pd.DataFrame:
    """Per timed DDP run: the hook's ``comm_total_s`` split into ``transfer_s`` (what the collbench fit
    predicts for the run's recorded buckets, summed) and ``waiting_s = comm_total_s - transfer_s`` (waiting
    for other ranks: skew; negative when the fit over-predicts), with ``placement``."""
    d = records[(records["comm_hook"] == "timed") & records["comm_total_s"].notna()] if "comm_hook" in records \
        else records.iloc[0:0]
    rows = []
    for _, r in d.iterrows():
        pred = _predict_run(r, fits, 0.0)
        rows.append({"run_key": r.get("run_key"), "placement": f"{int(r['nnodes'])}x{int(r['nproc_per_node'])}",
                     "world_size": int(r["world_size"]), "bucket_cap_mb": r.get("bucket_cap_mb"),
                     "n_buckets": r.get("n_buckets"), "comm_total_s": float(r["comm_total_s"]),
                     "transfer_s": pred["pred_transfer_s"],
                     "waiting_s": float(r["comm_total_s"]) - pred["pred_transfer_s"],
                     "emulate_latency_s": float(r.get("emulate_latency_s") or 0.0),
                     "emulate_bandwidth_bytes_per_s": float(r.get("emulate_bandwidth_bytes_per_s") or 0.0),
                     "emulated_s": r.get("emulated_s"), "fit": pred["fit"], "why": pred["why"]})
    return pd.DataFrame(rows)


def transfer_waiting_by_placement(table: pd.DataFrame) -> pd.DataFrame:
    """Medians of :func:`transfer_waiting` per placement, bucket size and emulated link (never pooled), with the
    waiting share of the hook time."""
    if table.empty:
        return table
    keys = [k for k in ("placement", "bucket_cap_mb", "emulate_latency_s", "emulate_bandwidth_bytes_per_s")
            if k in table]
    g = table.groupby(keys, as_index=False, dropna=False).agg(
        n_runs=("comm_total_s", "size"), comm_total_s=("comm_total_s", "median"),
        transfer_s=("transfer_s", "median"), waiting_s=("waiting_s", "median"))
    g["waiting_fraction"] = g["waiting_s"] / g["comm_total_s"]
    return g


# -- stragglers, shared-host contention and leave-one-out parity ------------------------------------------
STEP_MARGIN = 0.10
"""Median |leave-one-out error| of the predicted DDP step time the model must stay within to be used."""
EXPOSED_MARGIN = 0.25
"""Median |leave-one-out error| of the predicted exposed communication the model must stay within."""


def _same_repeat(noop: pd.DataFrame, r) -> pd.DataFrame:
    """The no-op twins run with the same repeat as ``r`` (the same round of the sweep, so the same load on a
    shared machine), else all of them."""
    if "repeat" in noop and r.get("repeat") is not None:
        same = noop[noop["repeat"] == r.get("repeat")]
        if len(same):
            return same
    return noop


def _straggler_terms(point: dict, r, noop: pd.DataFrame, fits: dict, quantile: float) -> dict:
    """The fit-free terms of one timed run: the slowest of W ranks from its no-op twins' per-rank times, the
    transfer backward does not hide, and the measured exposure and waiting."""
    twins = _same_repeat(noop, r)
    placement = f"{int(r['nnodes'])}x{int(r['nproc_per_node'])}"
    w = int(r["nnodes"]) * int(r["nproc_per_node"])
    rt = straggler.rank_times(twins, placement)
    m_w, est = rt.max_step_s(w, quantile)
    e_max, _ = rt.expected_max_s(w)
    t_noop = float(np.median(twins["step_time_s"].to_numpy(float)))
    bwd = float(np.median(twins["backward_s"].to_numpy(float))) if "backward_s" in twins else math.nan
    pred = _predict_run(r, fits, bwd)
    comm = r.get("comm_total_s")
    comm = float(comm) if comm is not None and comm == comm else math.nan
    step = float(r["step_time_s"])
    return {**{k: point.get(k) for k in point}, "run_key": r.get("run_key"), "repeat": r.get("repeat"),
            "placement": placement, "world_size": w, "t_noop_s": t_noop, "backward_noop_s": bwd,
            "slowest_rank_s": m_w, "straggler_lag_s": e_max - float(np.mean(rt.samples)),
            "rank_cv": float(np.std(rt.samples) / np.mean(rt.samples)), "estimator": est,
            "compute_source": f"no-op twin at {placement}: {rt.source}", "step_time_s": step,
            "n_buckets": len(r["bucket_bytes"]) if isinstance(r.get("bucket_bytes"), (list, tuple)) else 0,
            "exposed_s": step - t_noop, "comm_total_s": comm, "pred_transfer_s": pred["pred_transfer_s"],
            "pred_exposed_transfer_s": pred["pred_exposed_s"],
            "waiting_s": comm - pred["pred_transfer_s"], "waiting_share": (comm - pred["pred_transfer_s"]) / comm
            if comm > 0 else math.nan, "fit": pred["fit"], "why": pred["why"]}


def ddp_parity(records: pd.DataFrame, fits: dict[tuple, CollFit], quantile: float = 0.5) -> pd.DataFrame:
    """Leave-one-out parity of the straggler model for every timed DDP run with a no-op twin.

    The model of a synchronous DDP step at W ranks: ``(1 + gamma) * M_W + sync_s + per_bucket_s * n_buckets + X``,
    where

    - ``M_W`` (``slowest_rank_s``) is the median of the slowest of W ranks' compute
      (:func:`kanlib.analysis.straggler.quantile_of_max` of the no-op twins' per-rank step times at the run's
      placement, which already carry the contention of the processes sharing that host; the fitted lognormal
      where the sample does not reach that quantile) - the median, because T is the median over steps;
    - ``X`` (``pred_exposed_transfer_s``) is the transfer backward does not hide (:func:`overlap` of the run's
      buckets with the link fit, as :func:`validate_ddp`);
    - ``gamma`` (``contention``), ``sync_s`` and ``per_bucket_s`` are what a step with real communication costs
      beyond the no-op twin's compute on shared cores (communication threads competing with compute, a rank woken
      late after each wait; per step and per bucket all-reduced), fitted on the *other* timed runs of the same
      backend and device, without the run it predicts: non-negative least squares of
      ``T - X - M_W = gamma M_W + sync_s + per_bucket_s n_buckets`` (all 0 when there is no other run).

    The hook's waiting (``comm_total_s`` minus the benchmark's transfer) is predicted as ``(1 + gamma) * lag + omega``:
    ``lag`` = E[slowest of W] - E[one rank] (``straggler_lag_s``) and ``omega`` the median over the other runs of what
    waiting that leaves. Columns: measured ``step_time_s``, ``exposed_s = T - T_noop``, ``waiting_share``; predicted
    ``pred_step_time_s``, ``pred_exposed_s = pred_step_time_s - T_noop``, ``pred_waiting_share``; ``step_rel_err``,
    ``exposed_rel_err`` (NaN when the measured exposure is not positive), ``waiting_share_err`` (points);
    ``contention``, ``sync_s``, ``per_bucket_s``, ``omega_s``, ``n_fit`` (the runs each prediction was fitted on),
    ``estimator``,
    ``compute_source``, ``why`` when there is no prediction.
    """
    rows = [_straggler_terms(point, r, noop, fits, quantile)
            for point, timed, noop in _twins(records) for _, r in timed.iterrows()]
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    ok = np.isfinite(out["pred_exposed_transfer_s"].to_numpy(float))
    keys = [c for c in ("backend", "device") if c in out]
    group = pd.Series(["/".join(str(r[k]) for k in keys) for _, r in out.iterrows()], index=out.index)
    pred_step, pred_wait, terms, omg, nfit = [], [], [], [], []
    for i in range(len(out)):
        others = ok & (group == group.iloc[i]).to_numpy() & (np.arange(len(out)) != i)
        t = _fit_contention(out, others)
        wj = out["waiting_s"] - (1 + t["contention"]) * out["straggler_lag_s"]
        wj_ok = others & np.isfinite(wj.to_numpy(float))
        o = float(np.median(wj[wj_ok])) if wj_ok.any() else 0.0
        terms.append(t)
        omg.append(o)
        nfit.append(int(others.sum()))
        pred_step.append(_contended(out.iloc[i], t) + out["pred_exposed_transfer_s"].iloc[i])
        pred_wait.append(max(0.0, (1 + t["contention"]) * out["straggler_lag_s"].iloc[i] + o))
    for k in CONTENTION_TERMS:
        out[k] = [t[k] for t in terms]
    out["omega_s"], out["n_fit"] = omg, nfit
    out["pred_step_time_s"] = pred_step
    out["pred_exposed_s"] = out["pred_step_time_s"] - out["t_noop_s"]
    xfer = out["pred_transfer_s"]
    out["pred_waiting_share"] = np.asarray(pred_wait) / (np.asarray(pred_wait) + xfer)
    out["step_rel_err"] = (out["pred_step_time_s"] - out["step_time_s"]) / out["step_time_s"]
    out["exposed_rel_err"] = np.where(out["exposed_s"] > 0, (out["pred_exposed_s"] - out["exposed_s"]) /
                                      out["exposed_s"].where(out["exposed_s"] > 0), np.nan)
    out["waiting_share_err"] = out["pred_waiting_share"] - out["waiting_share"]
    return out


CONTENTION_TERMS = ("contention", "sync_s", "per_bucket_s")
"""The fitted terms of shared-host contention (:func:`ddp_parity`): a fraction of the slowest rank's compute, seconds
per synchronised step, seconds per bucket all-reduced during backward."""


def _contended(row, terms: dict) -> float:
    """The slowest rank's compute of a synchronised step with contention: ``(1 + gamma) M_W + sync_s + per_bucket_s
    * n_buckets``."""
    return ((1 + terms["contention"]) * float(row["slowest_rank_s"]) + terms["sync_s"]
            + terms["per_bucket_s"] * float(row["n_buckets"]))


def _fit_contention(out: pd.DataFrame, use: np.ndarray) -> dict:
    """:data:`CONTENTION_TERMS` fitted on the runs ``use`` by non-negative least squares of what the slowest rank and
    the exposed transfer leave, ``T - X - M_W = gamma M_W + sync_s + per_bucket_s n_buckets`` (all 0 without runs)."""
    if not use.any():
        return dict.fromkeys(CONTENTION_TERMS, 0.0)
    m = out["slowest_rank_s"].to_numpy(float)[use]
    nb = out["n_buckets"].to_numpy(float)[use]
    y = (out["step_time_s"] - out["pred_exposed_transfer_s"] - out["slowest_rank_s"]).to_numpy(float)[use]
    c = nnls(np.stack([m, np.ones_like(m), nb], axis=1), y)
    return dict(zip(CONTENTION_TERMS, (float(v) for v in c)))


def fitted_contention(parity: pd.DataFrame) -> dict:
    """The contention terms (:data:`CONTENTION_TERMS`) :func:`ddp_parity` fits on all its runs (not leaving one out):
    for extrapolating with the links and processes they were measured on. All 0 without runs."""
    if parity is None or parity.empty:
        return dict.fromkeys(CONTENTION_TERMS, 0.0)
    return _fit_contention(parity, np.isfinite(parity["pred_exposed_transfer_s"].to_numpy(float)))


def judge_median(median: float, lo: float, margin: float) -> str:
    """A median error against its margin, judged on its interval as every decision is: ``within`` (the median within
    the margin), ``not beyond`` (the median beyond it, the low end ``lo`` of its 95% interval not) or ``NOT within``
    (the whole interval beyond it, or no number)."""
    if not np.isfinite(median):
        return "NOT within"
    if median <= margin:
        return "within"
    return "not beyond" if np.isfinite(lo) and lo <= margin else "NOT within"


@dataclass(frozen=True)
class ModelValidation:
    """How well the model predicts the DDP runs it was not fitted on (:func:`model_validation`): the median
    |leave-one-out error| of the step time and of the exposed communication with the low end of each median's
    bootstrap 95% interval, and whether each is within its margin. A median is judged as every decision is, on its
    interval: it fails only when the whole interval lies beyond the margin (a median of 11% whose interval reaches
    down to 8% is "not beyond" a 10% margin), so a check does not flip between two runs of one study on noise alone.
    ``ok`` is False without any predicted run (a model never checked is not validated)."""

    n_runs: int
    step_median_abs_err: float
    exposed_median_abs_err: float
    waiting_share_median_abs_err: float
    step_margin: float = STEP_MARGIN
    exposed_margin: float = EXPOSED_MARGIN
    step_max_abs_err: float = math.nan
    """The largest |leave-one-out error| of the step time (the extrapolation's band uses it)."""
    step_median_lo: float = math.nan
    """The low end of the step median's bootstrap 95% interval (NaN: judged on the median alone)."""
    exposed_median_lo: float = math.nan
    """The low end of the exposed median's bootstrap 95% interval (NaN: judged on the median alone)."""
    exposed_median_hi: float = math.nan
    """The high end of the exposed median's bootstrap 95% interval: how far off the model's exposed communication
    may be (the band a predicted world size is decided on, :func:`world_size_band`)."""

    @property
    def step_ok(self) -> bool:
        return self.n_runs > 0 and judge_median(self.step_median_abs_err, self.step_median_lo,
                                               self.step_margin) != "NOT within"

    @property
    def exposed_ok(self) -> bool:
        return self.n_runs > 0 and judge_median(self.exposed_median_abs_err, self.exposed_median_lo,
                                               self.exposed_margin) != "NOT within"

    @property
    def ok(self) -> bool:
        return self.step_ok and self.exposed_ok

    @property
    def sentence(self) -> str:
        if not self.n_runs:
            return "The model is not validated: no timed DDP run with a no-op twin to predict."
        step = judge_median(self.step_median_abs_err, self.step_median_lo, self.step_margin)
        exposed = judge_median(self.exposed_median_abs_err, self.exposed_median_lo, self.exposed_margin)
        return (f"Leave-one-out over {self.n_runs} DDP runs: median |error| of the step time "
                f"{self.step_median_abs_err:.0%} (margin {self.step_margin:.0%}: {step}), "
                f"of the exposed communication {self.exposed_median_abs_err:.0%} (margin {self.exposed_margin:.0%}: "
                f"{exposed}); waiting share off by {self.waiting_share_median_abs_err * 100:.0f} points (median).")

    def as_dict(self) -> dict:
        return {"n_runs": self.n_runs, "step_median_abs_err": self.step_median_abs_err,
                "exposed_median_abs_err": self.exposed_median_abs_err,
                "waiting_share_median_abs_err": self.waiting_share_median_abs_err, "step_margin": self.step_margin,
                "exposed_margin": self.exposed_margin, "step_max_abs_err": self.step_max_abs_err,
                "step_median_lo": self.step_median_lo, "exposed_median_lo": self.exposed_median_lo,
                "exposed_median_hi": self.exposed_median_hi, "step_ok": self.step_ok, "exposed_ok": self.exposed_ok,
                "ok": self.ok}


def model_validation(parity_or_records: pd.DataFrame, fits: dict[tuple, CollFit] | None = None,
                     step_margin: float = STEP_MARGIN, exposed_margin: float = EXPOSED_MARGIN) -> ModelValidation:
    """The leave-one-out validation of the DDP model: pass :func:`ddp_parity`'s table, or the records and the
    link fits to compute it. Guidance and extrapolation use the model only when ``.ok``."""
    par = parity_or_records if fits is None else ddp_parity(parity_or_records, fits)
    if fits is None and len(par) and "pred_step_time_s" not in par:
        raise ValueError("parity_or_records: give ddp_parity's table, or records together with fits")
    d = par[np.isfinite(pd.to_numeric(par.get("pred_step_time_s", pd.Series(dtype=float)), errors="coerce"))] \
        if len(par) else par
    if d.empty:
        return ModelValidation(0, math.nan, math.nan, math.nan, step_margin, exposed_margin)
    ws = d["waiting_share_err"].abs() if "waiting_share_err" in d else pd.Series(dtype=float)
    step, exposed = d["step_rel_err"].abs(), pd.to_numeric(d["exposed_rel_err"], errors="coerce").abs()
    exposed_lo, exposed_hi = bootstrap_ci(exposed.to_numpy(float))
    return ModelValidation(int(len(d)), float(step.median()), float(exposed.median()),
                           float(ws.median()) if ws.notna().any() else math.nan, step_margin, exposed_margin,
                           float(step.max()), bootstrap_ci(step.to_numpy(float))[0], exposed_lo, exposed_hi)


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
