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

Stability: every answer names the points it rests on that are unstable (a disturbed run, fewer runs than an
interval needs; :meth:`Context.stability`) in its ``rests_on`` column, and a threshold answer the points it depends on whose interval holds the target ("near the 80%
target"; :func:`kanlib.analysis.stats.reaches` is the rule of every threshold decision), and a ranking answer
a tie its points' intervals could break; ``ranked`` is False where its points have fewer than
:data:`kanlib.analysis.stats.MIN_RUNS` runs: such an answer is shown, never ranked on.
``python -m kanlib.guidelines --summary OUT`` prints one screen: the decisions, their intervals and what they rest
on (``make study`` ends with it).

A NaN, infinite, zero or negative value never meets a target (:func:`kanlib.analysis.stats.meets`). When the
data cannot answer a question, the answer says why (one placement only, too few points, ...), with the best
measured number where there is one.
"""

from __future__ import annotations

import html
import os
import re
import sys
from dataclasses import dataclass, field

import pandas as pd

from kanlib import studies
from kanlib.analysis import groups, load, stats
from kanlib.analysis.context import UNANSWERED, Context, Goals, disturbed_why, unanswered

COLUMNS = ["question", "group", "answer", "value", "basis", "runs", "ranked", "rests_on"]
"""Each answer: the question, the group of records it answers for, the answer (``decision: detail``), its value,
the study it comes from, the fewest runs of any point it rests on, whether that is enough to rank on
(:data:`kanlib.analysis.stats.MIN_RUNS`), and the unstable points it rests on or the points near its target it
depends on ('' when none)."""


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
    records_of: dict = field(default_factory=dict, repr=False, compare=False)
    """(question, group) -> the study whose records (and points, :meth:`Context.stability`) the answer rests on."""

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(s)}</li>" for s in self.sentences)
        return self.table.to_html(index=False) + f"<ul>{items}</ul>"

    def __str__(self) -> str:
        return "\n".join(self.sentences)


_PLACEMENT_Q = re.compile(r"^(\d+x\d+):")


def points_of(row: dict, stability: pd.DataFrame, study: str) -> pd.DataFrame:
    """The measured points (rows of :meth:`Context.stability`) an answer of ``study`` rests on: those of its group
    (every field the group label names has the point's value) and, for a question about one placement, of that
    placement."""
    pts = stability[stability["study"] == study]
    label, keep = str(row.get("group", "")), []
    m = _PLACEMENT_Q.match(str(row.get("question", "")))
    for _, p in pts.iterrows():
        key = p["key"]
        if m and key.get("placement") != m.group(1):
            keep.append(False)
            continue
        ok = True
        for f, v in key.items():
            if f == "placement":
                continue
            if f == "model":
                ok &= label.split(",")[0].strip() == str(v) or not label
            elif f"{f}=" in label:
                ok &= groups.group_label({f: v}) in label
        keep.append(ok)
    return pts[keep] if len(pts) else pts


def rests_on(pts: pd.DataFrame) -> str:
    """What makes the points unstable (a disturbed run, too few runs; a wide spread alone does not:
    :func:`kanlib.analysis.context.point_stability`), counted by reason: ``"2 of 3 points unstable: 1x2 (1
    disturbed run(s) left out ...)"``."""
    bad = pts[pts["unstable"]] if len(pts) else pts
    if not len(bad):
        return ""
    return (f"{len(bad)} of {len(pts)} point(s) unstable: "
            + "; ".join(f"{r['point']} ({r['why']})" for _, r in bad.iterrows()))


def unstable_sentences(stability: pd.DataFrame) -> list[str]:
    """pyperf's warning, per point: every point that had a disturbed run, with why; the points with too few runs are
    counted (each is also in the report's list). A wide spread alone is no warning: a decision it could change says
    so itself (its ``near``)."""
    if stability.empty:
        return []
    bad = stability[stability["unstable"]]
    loud = bad[bad["n_disturbed"] > 0]
    out = [f"Unstable: {r['study']} {r['point']}: {r['why']}." for _, r in loud.iterrows()]
    few = bad[bad["n_runs"] < stats.MIN_RUNS]
    if len(few):
        out.append(f"Unstable: {len(few)} of {len(stability)} measured points have fewer than {stats.MIN_RUNS} runs "
                   f"(too few repeats for an interval).")
    return out


def annotate(rows: list[dict], stability: pd.DataFrame, study: str) -> list[dict]:
    """Each answer of ``study`` with ``runs`` (fewest runs of a point it rests on), ``ranked`` and ``rests_on``: its
    unstable points, and for a threshold decision the points whose 95% intervals hold the target (the answer's
    ``near``, :func:`kanlib.analysis.stats.near_note`): such a decision is near the target whichever way it went."""
    out = []
    for r in rows:
        r = dict(r)
        near = r.pop("near", "")
        pts = points_of(r, stability, study) if len(stability) else stability
        runs = int(pts["n_runs"].min()) if len(pts) else 0
        why = "; ".join(w for w in (rests_on(pts), near) if w)
        out.append({**r, "runs": runs, "ranked": runs >= stats.MIN_RUNS, "rests_on": why})
    return out


def guidelines_of(ctx: Context, goals: Goals) -> Guidelines:
    """Every guideline the records of ``ctx`` allow, study module by study module in run order; each answer says
    what it rests on (:func:`annotate`)."""
    rows, text, records_of = [], [], {}
    have = ctx.studies()
    stability = ctx.stability()
    for m in studies.STUDIES:
        if m.RECORDS in have:
            r, t = m.guideline(ctx, goals)
            rows += annotate(r, stability, m.RECORDS)
            records_of.update({(a["question"], a["group"]): m.RECORDS for a in r})
            text += t
    for study in ctx.studies_left_out():  # measured, every run disturbed: unanswered, not silently absent
        left = ctx.left_out(study)
        answer = unanswered("every run was disturbed", left)
        rows += annotate([{"question": f"{study}: every question", "group": "", "answer": answer,
                           "value": float("nan"), "basis": study}], stability, study)
        text.append(f"{study}: nothing can be answered: {answer.split(': ', 2)[2]} ({disturbed_why(left)}).")
    if not rows and not text:
        text.append(f"No study records to derive guidelines from (have studies: {sorted(have)}).")
    text += unstable_sentences(stability)
    unranked = [r for r in rows if not r["ranked"]]
    if unranked:
        text.append(f"Not ranked: {len(unranked)} of {len(rows)} answers rest on points with fewer than "
                    f"{stats.MIN_RUNS} runs (an interval needs {stats.MIN_RUNS}); they show what was measured and "
                    f"decide nothing.")
    sel = ctx.runs() if have else None
    for note in (sel.disturbed_note, sel.code_note) if sel is not None else ():
        if note:
            text.append(note)
    return Guidelines(pd.DataFrame(rows, columns=COLUMNS), text, ctx, records_of)


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
                 bench_time_col: str = "time_s_p10", val_loss_tolerance: float = 0.01,
                 disturbed: str = "leave_out") -> Guidelines:
    """The guidelines of every record under ``out_dir`` (code versions chosen by ``code``, see
    :meth:`kanlib.analysis.load.Records.select`; disturbed runs left out, or kept apart with
    ``disturbed="keep"``) and the collective-benchmark records there; with no record, a Guidelines whose only
    sentence says "no records under ..."."""
    goals = Goals(target_efficiency, memory_budget_bytes, step_time_budget_s, val_loss_tolerance)
    load.check_disturbed_policy(disturbed)
    ctx = Context(out_dir, code, bench_time_col=bench_time_col, val_loss_tolerance=val_loss_tolerance,
                  disturbed=disturbed)
    try:
        ctx.runs()
    except load.NoRecordsError as e:
        return Guidelines(pd.DataFrame(columns=COLUMNS), [str(e)], ctx)
    return guidelines_of(ctx, goals)


UNANSWERED_DECISIONS = (UNANSWERED, "not measured")
"""Decisions that answer nothing (:func:`is_unanswered`): the runs were disturbed and left out, or never made."""


def is_unanswered(answer) -> bool:
    """Whether an answer leaves its question unanswered (:data:`UNANSWERED_DECISIONS`; a missing answer too)."""
    return not isinstance(answer, str) or decision(answer) in UNANSWERED_DECISIONS


def compare(a: Guidelines, b: Guidelines) -> pd.DataFrame:
    """The answers of two sets of guidelines side by side (e.g. two runs of the same study): one row per
    (question, group) of either, with ``answer_a``, ``answer_b`` and ``same`` (the same :func:`decision`). A
    study says the same thing twice when every row is ``same``; a question only one of them answers is not, and
    neither is one both leave unanswered (``unanswered``: ``"a"``, ``"b"``, ``"both"`` or '', :func:`is_unanswered`:
    two studies whose disturbed runs were left out agree on nothing).
    ``unstable``: for a decision that differs, what it rests on in either run (:func:`_why_differs`);
    ``near_both``: it differs and both runs name it as near the target (neither run settles it)."""
    keys = ["question", "group"]
    cols = ["answer", "rests_on", "runs"]

    def side(g, tag):
        t = g.table.reindex(columns=keys + cols)
        return t.rename(columns={c: f"{c}_{tag}" for c in cols})

    both = side(a, "a").merge(side(b, "b"), on=keys, how="outer")
    decided = [both[c].map(lambda v: decision(v) if isinstance(v, str) else None) for c in ("answer_a", "answer_b")]
    open_a, open_b = (both[c].map(is_unanswered) for c in ("answer_a", "answer_b"))
    both["unanswered"] = [{(True, True): "both", (True, False): "a", (False, True): "b"}.get((x, y), "")
                          for x, y in zip(open_a, open_b)]
    both["same"] = decided[0].notna() & (decided[0] == decided[1]) & ~open_a & ~open_b
    records_of = {**b.records_of, **a.records_of}  # which study's points an answer rests on, from either side
    for tag, g in (("a", a), ("b", b)):  # a question one side did not answer: what its points say there
        missing = both[f"answer_{tag}"].isna()
        if missing.any() and g.context is not None:
            stability = g.context.stability()
            both[f"rests_on_{tag}"] = both[f"rests_on_{tag}"].astype(object)
            both.loc[missing, f"rests_on_{tag}"] = [
                _unanswered(r, stability, records_of.get((r["question"], r["group"])))
                for _, r in both[missing].iterrows()]
    both["unstable"] = [_why_differs(r) for _, r in both.iterrows()]
    both["near_both"] = [not r["same"] and all(NEAR in str(r.get(f"rests_on_{t}") or "") for t in ("a", "b"))
                         for _, r in both.iterrows()]
    return both.reset_index(drop=True)


NEAR = "near the "
"""How a ``rests_on`` names a threshold decision near its target (:func:`kanlib.analysis.stats.near_note`)."""


def _unanswered(row, stability: pd.DataFrame, study) -> str:
    """Why a run did not answer a question the other did, as far as its points tell: 'not answered; ' and what
    makes them unstable (all their runs disturbed and left out, too few runs), or 'not answered' alone."""
    pts = points_of(row, stability, study) if len(stability) and isinstance(study, str) else stability.iloc[0:0]
    why = rests_on(pts)
    return f"not answered; {why}" if why else "not answered"


NOT_NAMED = "NOT on unstable or disturbed points or near the target"
"""What :func:`compare` says of a decision that differs although neither run named it."""


def _why_differs(r) -> str:
    """For a decision that differs: whether it rests on unstable or disturbed points (in either study), or on
    points with too few runs; '' for one that does not, or does not differ."""
    if r["same"]:
        return ""
    why = [f"{tag}: {r[f'rests_on_{tag}']}" for tag in ("a", "b")
           if isinstance(r.get(f"rests_on_{tag}"), str) and r[f"rests_on_{tag}"] not in ("", "not answered")]
    return " | ".join(why) or NOT_NAMED


def summary(g: Guidelines, width: int = 110) -> str:
    """One screen: each decision with its interval, the flagged ones marked ``!`` (they could change within their
    intervals, or rest on disturbed points or too few runs), and the counts; every line wrapped at ``width``, never
    cut (a cut line lost the number at its end)."""
    import textwrap

    def wrap(text: str, first: str = "", rest: str = "    ") -> list[str]:
        return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_long_words=False,
                             break_on_hyphens=False)

    t = g.table
    lines = ["Decisions (python -m kanlib.guidelines OUT for every sentence):"]
    for _, r in t.iterrows():
        mark = "  " if r.get("ranked") and not r.get("rests_on") else "! "
        lines += wrap(f"{r['question']} [{r['group']}]: {r['answer']}", mark, "      ")
    flagged = t[t["rests_on"].fillna("") != ""] if "rests_on" in t else t.iloc[0:0]
    unranked = t[~t["ranked"].astype(bool)] if "ranked" in t else t.iloc[0:0]
    ctx = g.context
    n_open = int(t["answer"].map(is_unanswered).sum()) if len(t) else 0
    notes = [f"{len(t)} decisions" + (f" ({n_open} unanswered: their runs disturbed and left out, or not made)"
                                      if n_open else "")
             + f"; {len(flagged)} flagged (could change within their intervals, or rest on disturbed points or "
               f"too few runs); {len(unranked)} rest on points with fewer than {stats.MIN_RUNS} runs (not ranked)"]
    if ctx is not None:
        st = ctx.stability()
        if len(st):
            n_dist = int(st["n_disturbed"].sum())
            kept = "kept" if ctx.disturbed == "keep" else "left out"
            notes.append(f"{len(st)} measured points: {int(st['unstable'].sum())} unstable ({n_dist} disturbed run(s) "
                         f"{kept}, {int((st['n_runs'] < stats.MIN_RUNS).sum())} with fewer than {stats.MIN_RUNS} "
                         f"runs); {int(st['wide'].sum())} wide (runs spread > {stats.MARGIN:.0%}: their intervals "
                         f"are wide, which flags a decision only where it could change it)")
        mc = ctx.model_check()
        notes.append(mc.describe()[0].upper() + mc.describe()[1:] + ".")
    notes.append("! = could change within its intervals (near its target, or a tie its intervals could break), or "
                 "rests on disturbed points or too few runs (report.html lists them).")
    return "\n".join(lines + [w for n in notes for w in wrap(n)])


def main(argv: list[str] | None = None) -> int:
    """``python -m kanlib.guidelines OUT [OUT2]``: the guidelines of the records under OUT; with OUT2, both
    side by side and whether they agree (exit status 1 when any answer differs or both leave it unanswered)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kanlib.guidelines", description=main.__doc__)
    ap.add_argument("out_dir", help="a study's output folder (records under <out_dir>/<study>/)")
    ap.add_argument("other", nargs="?", help="a second output folder to compare with")
    ap.add_argument("--target-efficiency", type=float, default=0.8)
    ap.add_argument("--summary", action="store_true", help="one screen: decisions, intervals, what they rest on")
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
        print(summary(first) if args.summary else first)
        return 0
    table = compare(first, found[1])
    with pd.option_context("display.max_rows", None, "display.max_colwidth", 60, "display.width", 200):
        print(table[["question", "group", "answer_a", "answer_b", "same"]].to_string(index=False))
    both_open = table["unanswered"] == "both"
    differ = int((~table["same"] & ~both_open).sum())
    for _, r in table[~table["same"] & ~both_open].iterrows():
        print(f"differs: {r['question']} [{r['group']}]: rests on {r['unstable']}")
    for _, r in table[both_open].iterrows():
        print(f"unanswered in both: {r['question']} [{r['group']}]: a: {r['answer_a']} | b: {r['answer_b']}")
    near = int(table["near_both"].sum())
    n_open = int(both_open.sum())
    print(f"{int(table['same'].sum())} of {len(table)} answers the same"
          + (f"; {n_open} unanswered in both (not an agreement)" if n_open else "")
          + (f"; {differ} differ" if differ else "")
          + (f", {int((table['unstable'] == NOT_NAMED).sum())} of them not on unstable or disturbed points or near "
             f"the target" if differ else "")
          + (f"; {near} of them near the target in both runs (each run's interval holds it: neither settles it)"
             if near else ""))
    return 1 if differ or n_open else 0


if __name__ == "__main__":
    raise SystemExit(main())
