"""Deployment guidelines computed from records (never written by hand): a loop over the study modules
(kanlib.studies), each answering its questions per group of records (records that differ in configuration are
never pooled), over one :class:`kanlib.analysis.context.Context` (records read once, the link model fitted once).

Given a target parallel efficiency and a per-process memory and step-time budget (:class:`Goals`), the studies
answer: the placement (nodes x processes per node) with the most processes that keeps the target, and the least
work per process that does (strong scaling); the smallest per-process batch (weak scaling); the placement and
bucket size exposing the least communication, and the largest world size the link model calibrated on the
collective benchmark predicts at the target (communication); the fastest data-parallel option that keeps the
validation loss within a tolerance of plain DDP (options); the size beyond which memory rather than step time
limits a process, and the size from which FSDP pays (model size); the placement that reaches the target
validation loss soonest (time to accuracy); the fastest kernel x placement (compounding).

A NaN, infinite, zero or negative value never meets a target (:func:`kanlib.analysis.stats.meets`). When the
data cannot answer a question, the answer says why (one placement only, too few points, ...), with the best
measured number where there is one.
"""

from __future__ import annotations

import html
import os
import sys
from dataclasses import dataclass, field

import pandas as pd

from kanlib import studies
from kanlib.analysis import load
from kanlib.analysis.context import Context, Goals

COLUMNS = ["question", "group", "answer", "value", "basis"]


def decision(answer: str) -> str:
    """The decision an answer makes, without its measured numbers: every answer reads ``decision: detail``
    (``"1x2 (1 node(s) x 2 processes): 92% [90%, 94%]"`` decides ``1x2 (1 node(s) x 2 processes)``), so two runs
    of a study agree when their decisions do, while their measured numbers move within their intervals."""
    return str(answer).split(": ", 1)[0]


@dataclass
class Guidelines:
    """The answers as a table (question, group, answer, value, basis) and as generated sentences; ``context``:
    what they were computed on (a report of the same folder reuses it instead of reading the records again)."""

    table: pd.DataFrame
    sentences: list[str] = field(default_factory=list)
    context: Context | None = field(default=None, repr=False, compare=False)

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(s)}</li>" for s in self.sentences)
        return self.table.to_html(index=False) + f"<ul>{items}</ul>"

    def __str__(self) -> str:
        return "\n".join(self.sentences)


def guidelines_of(ctx: Context, goals: Goals) -> Guidelines:
    """Every guideline the records of ``ctx`` allow, study module by study module in run order."""
    rows, text = [], []
    have = ctx.studies()
    for m in studies.STUDIES:
        if m.RECORDS in have:
            r, t = m.guideline(ctx, goals)
            rows += r
            text += t
    if not rows and not text:
        text.append(f"No study records to derive guidelines from (have studies: {sorted(have)}).")
    note = ctx.runs().code_note if have else ""
    if note:
        text.append(note)
    return Guidelines(pd.DataFrame(rows, columns=COLUMNS), text, ctx)


def compute_guidelines(df: pd.DataFrame, target_efficiency: float = 0.8,
                       memory_budget_bytes: float = 80 * 2**30, step_time_budget_s: float = 1.0,
                       bench: pd.DataFrame | None = None, bench_time_col: str = "time_s_p10",
                       val_loss_tolerance: float = 0.01) -> Guidelines:
    """All guidelines that the records in ``df`` (any mix of studies, as from
    :func:`kanlib.analysis.load.load_records`) allow, one answer per group of records.

    bench: collective-benchmark rows (kanlib.analysis.load.load_bench) of the same folder; the communication
    model is fitted on them (``bench_time_col``: the per-size time fitted, see
    :func:`kanlib.analysis.commmodel.fit_collbench`), and without them the guidelines say it is not fitted.
    val_loss_tolerance: the relative increase of the validation loss over plain DDP beyond which a
    data-parallel option counts as harming convergence."""
    goals = Goals(target_efficiency, memory_budget_bytes, step_time_budget_s, val_loss_tolerance)
    ctx = Context.from_frame(df, bench, bench_time_col=bench_time_col, val_loss_tolerance=val_loss_tolerance)
    return guidelines_of(ctx, goals)


def from_out_dir(out_dir: str, code: str = "newest", target_efficiency: float = 0.8,
                 memory_budget_bytes: float = 80 * 2**30, step_time_budget_s: float = 1.0,
                 bench_time_col: str = "time_s_p10", val_loss_tolerance: float = 0.01) -> Guidelines:
    """The guidelines of every record under ``out_dir`` (code versions chosen by ``code``, see
    :meth:`kanlib.analysis.load.Records.select`) and the collective-benchmark records there; with no
    record, a Guidelines whose only sentence says "no records under ..."."""
    goals = Goals(target_efficiency, memory_budget_bytes, step_time_budget_s, val_loss_tolerance)
    ctx = Context(out_dir, code, bench_time_col=bench_time_col, val_loss_tolerance=val_loss_tolerance)
    try:
        ctx.runs()
    except load.NoRecordsError as e:
        return Guidelines(pd.DataFrame(columns=COLUMNS), [str(e)], ctx)
    return guidelines_of(ctx, goals)


def compare(a: Guidelines, b: Guidelines) -> pd.DataFrame:
    """The answers of two sets of guidelines side by side (e.g. two runs of the same study): one row per
    (question, group) of either, with ``answer_a``, ``answer_b`` and ``same`` (the same :func:`decision`). A
    study says the same thing twice when every row is ``same``; a question only one of them answers is not."""
    keys = ["question", "group"]
    left = a.table[keys + ["answer"]].rename(columns={"answer": "answer_a"})
    right = b.table[keys + ["answer"]].rename(columns={"answer": "answer_b"})
    both = left.merge(right, on=keys, how="outer")
    decided = [both[c].map(lambda v: decision(v) if isinstance(v, str) else None) for c in ("answer_a", "answer_b")]
    both["same"] = decided[0].notna() & (decided[0] == decided[1])
    return both.reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m kanlib.guidelines OUT [OUT2]``: the guidelines of the records under OUT; with OUT2, both
    side by side and whether they agree (exit status 1 when any answer differs)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kanlib.guidelines", description=main.__doc__)
    ap.add_argument("out_dir", help="a study's output folder (records under <out_dir>/<study>/)")
    ap.add_argument("other", nargs="?", help="a second output folder to compare with")
    ap.add_argument("--target-efficiency", type=float, default=0.8)
    args = ap.parse_args(argv)
    if not 0 < args.target_efficiency <= 1:
        ap.error(f"--target-efficiency: a parallel efficiency in (0, 1], e.g. 0.8; got {args.target_efficiency!r}")
    found = []
    for folder in [args.out_dir] + ([args.other] if args.other is not None else []):
        if not os.path.isdir(folder):
            ap.error(f"{folder}: no such folder")
        g = from_out_dir(folder, target_efficiency=args.target_efficiency)
        if g.table.empty:  # no records, only failed runs, or no study's records: nothing to answer or compare
            print(f"kanlib.guidelines: {folder}: no guidelines: {' '.join(g.sentences)}", file=sys.stderr)
            return 2
        found.append(g)
    first = found[0]
    if args.other is None:
        print(first)
        return 0
    table = compare(first, found[1])
    with pd.option_context("display.max_rows", None, "display.max_colwidth", 60, "display.width", 200):
        print(table.to_string(index=False))
    differ = int((~table["same"]).sum())
    print(f"{len(table) - differ} of {len(table)} answers the same" + (f"; {differ} differ" if differ else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
