"""One analysis build over one folder: its records and collective benchmark read once, the link model fitted
once per benchmark time, every derived table computed once, and the parameters the analyses share.

A report (kanlib.report) and the guidelines (kanlib.guidelines) are loops over the study modules
(kanlib.studies), each of which asks the :class:`Context` for what it needs; nothing is read or fitted twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from kanlib.analysis import commmodel, load

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


PARAMS = ("bench_time_col", "val_loss_tolerance", "calibration_tolerance")
"""The parameters of the analyses (a :class:`Context`'s fields a caller may set)."""


@dataclass
class Context:
    """The records under ``out_dir`` (code versions chosen by ``code``, see :meth:`kanlib.analysis.load.Records.select`)
    and what is derived from them, each made once and kept. Parameters: ``bench_time_col`` (the collective-benchmark
    time the links are fitted on: ``time_s_p10``, the lower decile, for a machine shared with other work; ``time_s``
    is the median), ``val_loss_tolerance`` (relative; an option whose validation loss rises more harms convergence)
    and ``calibration_tolerance`` (of the known-signal check)."""

    out_dir: str
    code: str = "newest"
    bench_time_col: str = "time_s_p10"
    val_loss_tolerance: float = 0.01
    calibration_tolerance: float = 0.2
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
            return load.Selection(df, [], self.code)
        return self.cached(("runs", study), lambda: self.records.select(study, self.code))

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
        """The link model fitted on the benchmark's ``time_col`` (default ``bench_time_col``), once."""
        time_col = time_col or self.bench_time_col
        return self.cached(("link_fit", time_col), lambda: self._fit(time_col))

    def _fit(self, time_col: str) -> LinkFit:
        bench = self.bench()
        if bench.empty:
            return LinkFit(bench, None, time_col)
        try:
            return LinkFit(bench, commmodel.fit_collbench(bench, time_col=time_col), time_col)
        except ValueError as e:  # e.g. only single-process benchmark runs
            return LinkFit(bench, None, time_col, str(e))
