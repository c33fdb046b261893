"""One analysis build over one folder: its records and collective benchmark read once, the link model fitted
once per benchmark time, every derived table computed once, and the parameters the analyses share.

A report (kanlib.report) and the guidelines (kanlib.guidelines) are loops over the study modules
(kanlib.studies), each of which asks the :class:`Context` for what it needs; nothing is read or fitted twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

import numpy as np

from kanlib.analysis import commmodel, groups, load, stats

UNANSWERED = "not answered"
"""How an answer begins that the records could not give because the runs it needed were measured but disturbed and
left out (:func:`unanswered`): a question unanswered in two studies is no agreement between them
(kanlib.guidelines.compare counts it apart)."""

BENCH_TIME_COLS = ("time_s", "time_s_p10", "time_s_p90")
"""The collective-benchmark times a link model can be fitted on."""


@dataclass
class LinkFit:
    """The link model fitted on the folder's collective benchmark: its rows (``bench``), the fits
    (:func:`kanlib.analysis.commmodel.fit_collbench`; None without benchmark records or when the fit failed),
    ``error`` (why it failed) and ``sentence`` (what was fitted, on which time, or why not)."""

    bench: pd.DataFrame
    fits: dict | None
    time_col: str
    error: str | None = None

    @property
    def sentence(self) -> str:
        if self.bench.empty:
            return ("No collective-benchmark records under this folder: the link model is not fitted (the DDP hook "
                    "times mix transfer and waiting for other ranks, so they are not fitted instead); run the "
                    "collective-benchmark section of 03_communication_overhead.")
        if self.error is not None:
            return f"The collective benchmark could not be fitted: {self.error}."
        what = {"time_s_p10": "lower decile", "time_s_p90": "upper decile"}.get(self.time_col, "median")
        return (f"{self.bench['record_path'].nunique()} collective-benchmark runs, {len(self.bench)} sizes in all; "
                f"the link model is fitted on each size's {what} over iterations ({self.time_col}).")


@dataclass
class Goals:
    """What the guidelines answer for: a target parallel efficiency, a per-process memory and step-time budget,
    and the relative validation-loss increase over plain DDP beyond which an option harms convergence."""

    target_efficiency: float = 0.8
    memory_budget_bytes: float = 80 * 2**30
    step_time_budget_s: float = 1.0
    val_loss_tolerance: float = 0.01

    def __post_init__(self) -> None:
        if not 0 < self.target_efficiency <= 1:
            raise ValueError(f"target_efficiency: must be in (0, 1], got {self.target_efficiency}")
        if not self.memory_budget_bytes > 0 or not self.step_time_budget_s > 0:
            raise ValueError(f"memory_budget_bytes and step_time_budget_s: must be positive, got "
                             f"{self.memory_budget_bytes!r} and {self.step_time_budget_s!r}")


PARAMS = ("bench_time_col", "val_loss_tolerance", "calibration_tolerance", "disturbed")
"""The parameters of the analyses (a :class:`Context`'s fields a caller may set)."""


@dataclass
class Context:
    """The records under ``out_dir`` (code versions chosen by ``code``, see :meth:`kanlib.analysis.load.Records.select`)
    and what is derived from them, each made once and kept. Parameters: ``bench_time_col`` (the collective-benchmark
    time the links are fitted on: ``time_s_p10``, the lower decile, for a machine shared with other work; ``time_s``
    is the median), ``val_loss_tolerance`` (relative; an option whose validation loss rises more harms convergence)
    and ``calibration_tolerance`` (of the known-signal check and the link model's leave-one-out error);
    ``disturbed``: ``"leave_out"`` (default) or ``"keep"`` the runs whose machine was busy
    (:func:`kanlib.analysis.load.split_disturbed`)."""

    out_dir: str
    code: str = "newest"
    bench_time_col: str = "time_s_p10"
    val_loss_tolerance: float = 0.01
    calibration_tolerance: float = 0.2
    disturbed: str = "leave_out"
    frame: pd.DataFrame | None = None
    """Records given as a frame instead of read from ``out_dir`` (:meth:`from_frame`)."""
    bench_frame: pd.DataFrame | None = None
    _records: load.Records | None = field(default=None, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_frame(cls, df: pd.DataFrame, bench: pd.DataFrame | None = None, **params) -> "Context":
        """A context over records already loaded (one row per run, any mix of studies) and, optionally, the
        collective-benchmark rows of the same folder."""
        return cls("", frame=df, bench_frame=bench if bench is not None else pd.DataFrame(), **params)

    @property
    def records(self) -> load.Records:
        """Every record under ``out_dir``, read once (:func:`kanlib.analysis.load.read`)."""
        if self._records is None:
            self._records = load.read(self.out_dir)
        return self._records

    def cached(self, key, make):
        """``make()``, computed the first time ``key`` is asked for and kept."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def runs(self, study: str | None = None) -> load.Selection:
        """The training records of ``study`` (every study when None) that the code policy keeps; raises
        :class:`kanlib.analysis.load.NoRecordsError` when there is none."""
        if self.frame is not None:
            df = self.frame if study is None else self.frame[self.frame["study"] == study]
            df, flagged = load.split_disturbed(df, self.disturbed)
            return load.Selection(df, [], self.code, flagged, self.disturbed)
        return self.cached(("runs", study), lambda: self.records.select(study, self.code, self.disturbed))

    def left_out(self, study: str) -> pd.DataFrame:
        """The disturbed runs of ``study`` that the policy left out, one row each with ``placement`` and
        ``disturbed_why`` (empty when the policy keeps them, or there is none), once."""
        def make():
            try:
                if self.frame is not None:
                    df = load.mark_disturbed(self.frame[self.frame["study"] == study])
                else:
                    df = self.records.select(study, self.code, "keep").data
            except load.NoRecordsError:
                return pd.DataFrame()
            df = df[df["disturbed"]]
            return groups.with_placement(df) if len(df) else pd.DataFrame()

        return pd.DataFrame() if self.disturbed == "keep" else self.cached(("left_out", study), make)

    def studies_left_out(self) -> list[str]:
        """The studies whose every run (of the code kept) was disturbed and left out: they answer nothing."""
        if self.disturbed == "keep":
            return []
        try:
            every = self.frame if self.frame is not None else self.records.select(None, self.code, "keep").data
        except load.NoRecordsError:
            return []
        return sorted(set(every["study"]) - self.studies()) if "study" in every else []

    def studies(self) -> set[str]:
        """The studies that have records here (empty when none)."""
        try:
            return set(self.runs().data["study"].unique())
        except load.NoRecordsError:
            return set()

    def bench(self) -> pd.DataFrame:
        """The collective-benchmark rows of the folder (empty without)."""
        if self.bench_frame is not None:
            return self.bench_frame
        return self.cached("bench", self.records.bench)

    def link_fit(self, time_col: str | None = None) -> LinkFit:
        """The link model fitted on the benchmark's ``time_col`` (default ``bench_time_col``), once; a time the
        benchmark does not have is refused."""
        time_col = time_col or self.bench_time_col
        bench = self.bench()
        if not bench.empty and time_col not in bench:
            raise ValueError(f"bench_time_col: {time_col!r} is not a collbench column ({', '.join(BENCH_TIME_COLS)})")
        return self.cached(("link_fit", time_col), lambda: self._fit(time_col))

    def comm_records(self) -> pd.DataFrame:
        """The communication study's records with placements, and the emulated link's fields filled (0 = none),
        once (kanlib.studies.communication and .calibration read them, and the model's own check)."""
        def make():
            recs = groups.with_placement(self.runs("communication").data)
            for c in ("emulate_latency_s", "emulate_bandwidth_bytes_per_s"):
                recs[c] = recs[c].fillna(0.0) if c in recs else 0.0
            return recs

        return self.cached(("communication", "records"), make)

    def ddp_parity(self) -> pd.DataFrame:
        """:func:`kanlib.analysis.commmodel.ddp_parity` of the communication study's runs with the link fit
        (empty without benchmark fits or communication records), once."""
        def make():
            fits = self.link_fit().fits
            try:
                recs = self.comm_records()
            except load.NoRecordsError:
                return pd.DataFrame()
            return commmodel.ddp_parity(recs, fits) if fits else pd.DataFrame()

        return self.cached(("calibration", "ddp_parity", self.bench_time_col), make)

    def _fit(self, time_col: str) -> LinkFit:
        bench = self.bench()
        if bench.empty:
            return LinkFit(bench, None, time_col)
        try:
            return LinkFit(bench, commmodel.fit_collbench(bench, time_col=time_col), time_col)
        except ValueError as e:  # e.g. only single-process benchmark runs
            return LinkFit(bench, None, time_col, str(e))

    # -- stability and the model's own check: one place each -------------------------------------------
    def stability(self, metric: str = "step_time_s") -> pd.DataFrame:
        """Every measured point of every study (:func:`point_stability`), with the disturbed runs counted
        whatever the policy; empty without records."""
        def make():
            try:
                if self.frame is not None:
                    df = load.mark_disturbed(self.frame)
                else:
                    df = self.records.select(None, self.code, "keep").data
            except load.NoRecordsError:
                return pd.DataFrame(columns=STABILITY_COLUMNS)
            return point_stability(df, metric, keep_disturbed=self.disturbed == "keep")
        return self.cached(("stability", metric), make)

    def first_run_effect(self, metric: str = "step_time_s") -> dict:
        """:func:`first_run_effect` over every study's records, once."""
        def make():
            try:
                df = self.frame if self.frame is not None else self.records.select(None, self.code, "keep").data
            except load.NoRecordsError:
                return first_run_effect(pd.DataFrame(), metric)
            return first_run_effect(df, metric)
        return self.cached(("first_run_effect", metric), make)

    def model_check(self) -> "ModelCheck":
        """Whether the link model passed its own validation (:func:`check_model`), once."""
        return self.cached("model_check", lambda: check_model(self))


def unanswered(what: str, left: pd.DataFrame) -> str:
    """The answer to a question that disturbed runs took away: ``"not answered: <what>: 3 disturbed run(s) left out
    at 1x2, 2x1"`` (:data:`UNANSWERED`; ``left``: those runs, :meth:`Context.left_out`, with ``placement``)."""
    places = ", ".join(sorted(set(left["placement"]), key=groups.placement_key)) if "placement" in left else ""
    return f"{UNANSWERED}: {what}: {len(left)} disturbed run(s) left out" + (f" at {places}" if places else "")


def disturbed_why(left: pd.DataFrame) -> str:
    """The distinct reasons of the disturbed runs ``left``, ``"; "``-joined, and how to see them."""
    whys = sorted({str(w) for w in left.get("disturbed_why", pd.Series(dtype=str)) if w})
    return "; ".join(whys + ["disturbed='keep' shows them apart, never pooled with clean runs"])


STABILITY_COLUMNS = ["study", "point", "placement", "n_runs", "n_disturbed", "median", "spread", "unstable", "wide",
                     "why", "key"]


def point_stability(df: pd.DataFrame, metric: str = "step_time_s", margin: float = stats.MARGIN,
                    min_runs: int = stats.MIN_RUNS, keep_disturbed: bool = False) -> pd.DataFrame:
    """Per study and point (records equal in every configuration field, record group field and placement, the
    repeats of one configuration): the runs of ``metric`` the analyses use, how many were disturbed, the median and
    the spread ``(max - min) / median`` of the runs. A point is **unstable** when a decision resting on it cannot be
    trusted whatever its numbers say: any of its runs was disturbed, or it has fewer runs than an interval needs
    (``min_runs``); ``why`` says which. A point whose runs spread wider than the decision ``margin`` is **wide**
    (``wide``, named in ``why`` too) but not unstable: its interval is wide, and a decision resting on it is flagged
    only when it could change within that interval (a threshold the interval holds, a ranking whose tie the
    intervals could break: the decision's ``near``), which is what separates a decision that can flip from one
    that cannot (with 5 runs on a shared 2-core machine most points spread wider than 10%, and flagging all of them
    flagged every decision). ``key``: the point's field values (for matching a guideline's group)."""
    df = groups.with_placement(load.mark_disturbed(df))
    rows = []
    for study, ds in df.groupby("study", sort=True) if "study" in df else [("", df)]:
        d = groups.design(ds, study, axes=("placement", *groups.PLACEMENT_AXES))
        keys = [f for f in d.groups if f != "disturbed"] + ["placement"]
        for key, g in groups.groupby(ds, keys):
            bad = g[g["disturbed"]]
            used = g if keep_disturbed else g[~g["disturbed"]]
            v = groups.numbers(used, metric)
            v = v[np.isfinite(v) & (v > 0)]
            med = float(np.median(v)) if v.size else float("nan")
            spread = float((v.max() - v.min()) / med) if v.size >= 2 and med > 0 else float("nan")
            why, wide = [], bool(v.size >= 2 and spread > margin)
            if len(bad):
                why.append(f"{len(bad)} disturbed run(s) {'kept' if keep_disturbed else 'left out'}")
            if v.size < min_runs:
                why.append(f"too few repeats ({v.size} run(s); an interval needs {min_runs})")
            unstable = bool(why)
            if wide:
                why.append(f"spread {spread:.0%} of the median > the {margin:.0%} decision margin")
            label = groups.group_label({k: key[k] for k in keys if k != "placement" and groups.varies(ds[k])})
            rows.append({"study": study, "point": f"{key['placement']}" + (f", {label}" if label else ""),
                         "placement": key["placement"], "n_runs": int(v.size), "n_disturbed": int(len(bad)),
                         "median": med, "spread": spread, "unstable": unstable, "wide": wide,
                         "why": "; ".join(why),
                         "key": {k: key[k] for k in keys}})
    return pd.DataFrame(rows, columns=STABILITY_COLUMNS)


def first_run_effect(df: pd.DataFrame, metric: str = "step_time_s") -> dict:
    """Whether a worker group's first run differs from its later runs (many runs per launch: the first run of a
    launch pays the process's start, its first compiles, cold caches): for every launch's first run
    (``runs_before_in_launch == 0``, not disturbed) whose point (as :func:`point_stability` groups) also has later
    runs of a launch, ``metric`` of that run over the median of those later runs. Returns ``n`` (such first runs),
    and the ``median``, ``min`` and ``max`` of the ratios (NaN when n is 0)."""
    ratios: list[float] = []
    if "runs_before_in_launch" in df and len(df):
        df = groups.with_placement(load.mark_disturbed(df))
        df = df[~df["disturbed"]]
        for study, ds in df.groupby("study", sort=True) if "study" in df else [("", df)]:
            d = groups.design(ds, study, axes=("placement", *groups.PLACEMENT_AXES))
            keys = [f for f in d.groups if f != "disturbed"] + ["placement"]
            for _, g in groups.groupby(ds, keys):
                before = pd.to_numeric(g["runs_before_in_launch"], errors="coerce")
                first, later = groups.numbers(g[before == 0], metric), groups.numbers(g[before > 0], metric)
                later = later[np.isfinite(later) & (later > 0)]
                if not later.size:
                    continue
                ratios += [float(v / np.median(later)) for v in first if np.isfinite(v) and v > 0]
    r = np.array(ratios)
    nan = float("nan")
    return {"n": int(r.size), "median": float(np.median(r)) if r.size else nan,
            "min": float(r.min()) if r.size else nan, "max": float(r.max()) if r.size else nan}


@dataclass
class ModelCheck:
    """The link model's own validation: ``status`` passed / failed / not checked, ``why`` (each check's number),
    and ``band`` (relative error that travels with any prediction: the largest leave-one-out step error of the
    parity, else the benchmark's leave-one-out median; NaN when unknown); ``exposed_band``: how far off the model's
    exposed communication may be, the high end of the 95% interval of the parity's median leave-one-out |error| of
    the exposed communication (else ``band``): what a predicted world size is decided on, since it scales the
    exposed communication. Decided on the interval as every answer is: the largest step error (a maximum over
    about 30 runs) was 12-18% and the exposed median itself 12-28% over seven runs of the default study, and with
    either the answer at 2x1 and 1x2 went between "4" and "2-4" (N=4 sits at 82-83% at the point prediction)."""

    status: str
    why: str
    band: float = float("nan")
    exposed_band: float = float("nan")

    def __post_init__(self):
        if not np.isfinite(self.exposed_band):
            self.exposed_band = self.band

    @property
    def usable(self) -> bool:
        """Whether guidance or extrapolation may use the model: only when it passed its own check."""
        return self.status == "passed"

    def describe(self) -> str:
        """One sentence for a guideline, a report or a summary."""
        if self.status == "passed":
            return (f"the link model passed its own check ({self.why}); predictions carry a ±{self.band:.0%} band "
                    f"(±{self.exposed_band:.0%} on exposed communication)")
        if self.status == "failed":
            return (f"the link model FAILED its own check ({self.why}): it is not used for guidance or "
                    f"extrapolation")
        return f"the link model is not checked ({self.why}): it is not used for guidance or extrapolation"


def check_model(ctx: Context) -> ModelCheck:
    """The one rule: the link model fitted on the collective benchmark is used for guidance or extrapolation only
    when its own validation passes: the known signal (each injected emulated constant recovered within
    ``calibration_tolerance``), the leave-one-out error of the benchmark points (median within
    ``calibration_tolerance``) and leave-one-out parity against the study's DDP runs (the model with stragglers
    and contention, :func:`kanlib.analysis.commmodel.model_validation`: median |error| of the step within 10%, of
    the exposed communication within 25%); the band that travels with a prediction is the largest leave-one-out
    step error. Each median is judged on its bootstrap 95% interval, as every decision is: it fails the check only
    when its whole interval lies beyond the tolerance (the benchmark's leave-one-out median moved between 13% and 22%
    over four runs of the default study, so a bare 20% cut decided the check by chance). A check the data do
    not allow is named, not passed."""
    fit = ctx.link_fit()
    if fit.fits is None:
        return ModelCheck("not checked", fit.error or "no collective-benchmark records")
    tol, why, failed = ctx.calibration_tolerance, [], False
    rec = commmodel.recovered_links(fit.fits)
    for _, r in rec.iterrows():
        for what, inj, err in (("latency", r["emulate_latency_s"], r["latency_rel_err"]),
                               ("bandwidth", r["emulate_bandwidth_bytes_per_s"], r["bandwidth_rel_err"])):
            if not inj:
                continue
            ok = err is not None and np.isfinite(err) and abs(err) <= tol
            failed |= not ok
            why.append(f"known {what} recovered " + (f"{err:+.0%}" if err is not None and np.isfinite(err)
                                                      else "not at all") + f" (tolerance {tol:.0%})")
    if rec.empty:
        why.append("no known signal (no emulated link)")
    pts = commmodel.fit_points(fit.fits)
    errs = pts["loo_rel_err"].abs().to_numpy(float) if len(pts) else np.array([])
    errs = errs[np.isfinite(errs)]  # a point without a leave-one-out error does not make the median unknown
    loo, lo, hi = stats.median_ci(errs) if errs.size else (float("nan"),) * 3
    if np.isfinite(loo):  # judged on its interval, as every decision is: beyond only when all of it is
        verdict = commmodel.judge_median(loo, lo, tol)
        failed |= verdict == "NOT within"
        said = {"within": "", "not beyond": " (not beyond the tolerance)"}.get(verdict, " (beyond the tolerance)")
        why.append(f"leave-one-out median error {loo:.0%} [{lo:.0%}, {hi:.0%}]{said}")
    band = loo
    try:
        val = commmodel.model_validation(ctx.ddp_parity())  # leave-one-out parity (stragglers, contention)
    except (load.NoRecordsError, KeyError, ValueError):
        val = None
    if val is not None and val.n_runs:
        failed |= not val.ok
        why.append(f"DDP parity, leave-one-out over {val.n_runs} runs: median |error| of the step "
                   f"{commmodel.margin_phrase(val.step_median_abs_err, val.step_median_lo, val.step_margin)}, of "
                   f"the exposed communication "
                   f"{commmodel.margin_phrase(val.exposed_median_abs_err, val.exposed_median_lo, val.exposed_margin)}"
                   f", the largest error of a point's median step {val.far_text}")
        band = max(val.step_median_abs_err, val.step_max_abs_err if np.isfinite(val.step_max_abs_err) else 0.0)
        exposed_band = val.exposed_median_hi if np.isfinite(val.exposed_median_hi) else val.exposed_median_abs_err
    else:
        why.append("no DDP run to check parity on")
        exposed_band = float("nan")
    return ModelCheck("failed" if failed else "passed", "; ".join(why), band, exposed_band)
