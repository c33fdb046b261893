"""The straggler model of a synchronous DDP step and its leave-one-out check on the study's DDP runs.

**Stragglers, contention, leave-one-out** (:func:`ddp_parity`, :func:`model_validation`,
:class:`ModelValidation`, :func:`fitted_contention`, :data:`STEP_MARGIN`, :data:`EXPOSED_MARGIN`): a DDP step at W
ranks is ``(1 + gamma) M_W + sync_s + per_bucket_s n_buckets + X`` - the median of the slowest of W ranks' compute
(kanlib.analysis.straggler, from the no-op twins' per-rank step times at the run's placement), slowed by the
contention that real communication adds on shared cores (:data:`CONTENTION_TERMS`), plus the transfer backward does
not hide (kanlib.analysis.commmodel.ddp); the contention is fitted on the other runs, so every run is predicted by a
model fitted without it. ``model_validation(ddp_parity(records, fits))`` (or ``model_validation(records, fits)``)
returns the median |leave-one-out error| of step and exposed communication and ``.ok`` unless a median's whole
bootstrap interval lies beyond 10% / 25%; guidance and extrapolation use the model only then.

pandas and numpy only: no torch import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kanlib.analysis import straggler
from kanlib.analysis.commmodel.ddp import predict_run, twins
from kanlib.analysis.commmodel.links import CollFit, nnls
from kanlib.analysis.stats import bootstrap_ci


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
    pred = predict_run(r, fits, bwd)
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
            for point, timed, noop in twins(records) for _, r in timed.iterrows()]
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


FAR_OFF = 0.25
"""The largest |leave-one-out error| of one point's step (the median over its runs) a validated model may have: a
model whose median is within its margin but that predicts one point far outside what was measured (an efficiency of
119% where 76% was measured) fails its check. Judged per point, not per run: one run of five off by 29% (the first
run of a worker group) is what a point's median is there to absorb."""

POINT_KEYS = ("placement", "nnodes", "nproc_per_node", "model", "widths", "grid_size", "spline_order", "global_batch",
              "bucket_cap_mb", "nccl_algo", "backend", "device", "kan_impl", "precision", "gradient_as_bucket_view",
              "static_graph", "grad_accum_steps", "task", "emulate_latency_s", "emulate_bandwidth_bytes_per_s")
"""What makes the runs of :func:`ddp_parity` one point (every configuration field it carries but the repeat)."""


def point_max_abs_err(parity: pd.DataFrame) -> float:
    """The largest |relative error| of a point's median predicted step against its median measured step, over the
    points of ``parity`` (:data:`POINT_KEYS`); NaN without any."""
    keys = [k for k in POINT_KEYS if k in parity]
    if parity.empty or not keys:
        return math.nan
    d = parity.assign(**{k: parity[k].map(str) for k in keys})
    g = d.groupby(keys, dropna=False)[["step_time_s", "pred_step_time_s"]].median()
    err = (g["pred_step_time_s"] / g["step_time_s"] - 1).abs()
    err = err[np.isfinite(err.to_numpy(float))]
    return float(err.max()) if len(err) else math.nan


def margin_phrase(median: float, lo: float, margin: float) -> str:
    """The one wording of a median error against its margin (:func:`judge_median`), wherever it is said:
    ``"12% (margin 10%: not beyond it, its interval reaches down to 8%)"``."""
    verdict = judge_median(median, lo, margin)
    if not np.isfinite(median):
        return f"unknown (margin {margin:.0%})"
    said = {"within": "within it", "not beyond": f"not beyond it, its interval reaches down to {lo:.0%}"}.get(
        verdict, "beyond it")
    return f"{median:.0%} (margin {margin:.0%}: {said})"


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
    point_max_abs_err: float = math.nan
    """The largest |error| of a point's median step (:func:`point_max_abs_err`), judged against :data:`FAR_OFF`."""
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
    def far_ok(self) -> bool:
        """No point's median step predicted beyond :data:`FAR_OFF` of its measurement (unknown counts as none)."""
        return not (np.isfinite(self.point_max_abs_err) and self.point_max_abs_err > FAR_OFF)

    @property
    def ok(self) -> bool:
        return self.step_ok and self.exposed_ok and self.far_ok

    @property
    def sentence(self) -> str:
        if not self.n_runs:
            return "The model is not validated: no timed DDP run with a no-op twin to predict."
        return (f"Leave-one-out over {self.n_runs} DDP runs: median |error| of the step time "
                f"{margin_phrase(self.step_median_abs_err, self.step_median_lo, self.step_margin)}, of the exposed "
                f"communication {margin_phrase(self.exposed_median_abs_err, self.exposed_median_lo, self.exposed_margin)}"
                f"; the largest error of a point's median step {self.far_text}; waiting share off by "
                f"{self.waiting_share_median_abs_err * 100:.0f} points (median).")

    @property
    def far_text(self) -> str:
        """The largest error of a point's median step against :data:`FAR_OFF`."""
        if not np.isfinite(self.point_max_abs_err):
            return "unknown"
        return f"{self.point_max_abs_err:.0%} (limit {FAR_OFF:.0%}: {'within it' if self.far_ok else 'beyond it'})"

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
                           float(step.max()), point_max_abs_err(d), bootstrap_ci(step.to_numpy(float))[0], exposed_lo,
                           exposed_hi)

