"""The link model: per-link latency and bandwidth, the all-reduce formulas over them, and their fit on the collective
benchmark (kanlib.collbench). What changes here is how one all-reduce is modelled and fitted; how DDP buckets and
overlaps them is kanlib.analysis.commmodel.ddp.

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

pandas and numpy only: no torch import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

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

