"""Where a study's run time goes: measured steps against the sweeps that ran them, and launches per placement.

``python -m benchmarks.launch_share OUT [OUT ...]`` reads a study output folder (what ``make study`` writes):
every training record's measured steps (``n_measured_steps x step_time_s``), every sweep's duration
(``<study>/sweeps.jsonl``: start to end of ``runners.sweep.run_sweep``, waits and reruns included) and every
launch (``<study>/launches.jsonl``: worker groups, their parts and waits). It prints, per study and in all, the
share of the sweeps' time spent in measured steps, the launches against placements x rounds, and the start-up of
each launch (its start to its first run's ``begin`` event), and writes the same to
``OUT/benchmarks/launch_share-<UTC>.json`` (``--write DIR``: all the folders' results in one file under DIR). The
sweeps' time is the wall time some sweep was running (:func:`busy_s`, the union of their intervals): sweeps that
overlap (two at once on one OUT; one sweep over two study folders, logged in each) are not added up. Issue 20's
targets: measured steps at least 50% of the sweeps' time; launches at most placements x rounds.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import glob
import json
import os
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kanlib import manifest, records  # noqa: E402


def _jsonl(path: str) -> list[dict]:
    return manifest.read_jsonl(path) if os.path.exists(path) else []


def busy_s(sweeps: list[dict]) -> float:
    """The wall time (s) during which at least one of ``sweeps`` (rows of ``sweeps.jsonl``: ``started_at``,
    ``duration_s``) was running: the length of the union of their intervals, so overlapping sweeps count once. A
    row without a readable ``started_at`` cannot be placed and adds its own duration."""
    spans, unplaced = [], 0.0
    for r in sweeps:
        d = float(r.get("duration_s") or 0.0)
        try:
            t0 = _dt.datetime.fromisoformat(r["started_at"]).timestamp()
        except (KeyError, TypeError, ValueError):
            unplaced += d
            continue
        spans.append((t0, t0 + d))
    total, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total, end = total + (b - a), b
        elif b > end:
            total, end = total + (b - end), b
    return total + unplaced


def study_share(study_dir: str) -> dict:
    """The numbers of one study folder (``OUT/<study>``)."""
    measured, n_runs, placements, rounds = 0.0, 0, set(), set()
    for path in glob.glob(os.path.join(glob.escape(study_dir), "*", records.RECORD_NAME)):
        with open(path) as f:
            rec = json.load(f)
        if rec.get("n_measured_steps") and rec.get("step_time_s"):
            measured += rec["n_measured_steps"] * rec["step_time_s"]
            n_runs += 1
            placements.add((rec.get("nnodes"), rec.get("nproc_per_node")))
            rounds.add(rec.get("repeat", 0))
    sweeps = _jsonl(os.path.join(study_dir, records.SWEEPS_NAME))
    launches = _jsonl(os.path.join(study_dir, records.LAUNCHES_NAME))
    startup = []
    for row in launches:
        events = _jsonl(os.path.join(study_dir, "launches", row["launch_id"], "events.jsonl"))
        begins = [e["at"] for e in events if e.get("event") == "begin"]
        if begins and row.get("started_at"):
            startup.append(min(begins) - _dt.datetime.fromisoformat(row["started_at"]).timestamp())
    sweep_s = busy_s(sweeps)
    return {"study": os.path.basename(os.path.normpath(study_dir)), "train_records": n_runs,
            "measured_steps_s": round(measured, 3), "sweeps": len(sweeps), "sweeps_s": round(sweep_s, 3),
            "measured_share": round(measured / sweep_s, 4) if sweep_s else None,
            "launches": len(launches), "launch_s": round(sum(r.get("duration_s", 0.0) for r in launches), 3),
            "launch_waiting_s": round(sum(r.get("waiting_s", 0.0) for r in launches), 3),
            "placements": len(placements), "rounds": len(rounds),
            "launches_at_most_placements_x_rounds": len(launches) <= max(1, len(placements)) * max(1, len(rounds)),
            "startup_s_median": round(statistics.median(startup), 3) if startup else None}


def share(out: str) -> dict:
    studies = [study_share(d) for d in sorted(glob.glob(os.path.join(glob.escape(out), "*", "")))
               if os.path.exists(os.path.join(d, records.SWEEPS_NAME))]
    measured = sum(s["measured_steps_s"] for s in studies)
    # one sweep over two study folders (notebook 03: communication and collbench) logs a line in each, and sweeps
    # of different studies may run at once: the wall time some sweep ran, each moment once
    sweep_s = busy_s([r for d in sorted(glob.glob(os.path.join(glob.escape(out), "*", records.SWEEPS_NAME)))
                      for r in _jsonl(d)])
    return {"out": os.path.abspath(out), "studies": studies, "measured_steps_s": round(measured, 3),
            "sweeps_s": round(sweep_s, 3), "measured_share": round(measured / sweep_s, 4) if sweep_s else None,
            "launches": sum(s["launches"] for s in studies),
            "train_records": sum(s["train_records"] for s in studies)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outs", nargs="+", help="study output folders (make study's OUT)")
    ap.add_argument("--write", default=None, help="one folder for every OUT's result (default: OUT/benchmarks/ each)")
    args = ap.parse_args(argv)
    results = []
    for out in args.outs:
        if not os.path.isdir(out):
            ap.error(f"{out}: no such folder")
        res = share(out)
        if not res["studies"]:
            ap.error(f"{out}: no <study>/{records.SWEEPS_NAME} (not a study output, or made before sweeps logged)")
        results.append(res)
        print(f"{out}: {res['train_records']} training runs, {res['launches']} launches; measured steps "
              f"{res['measured_steps_s']:.1f} s of {res['sweeps_s']:.1f} s in sweeps = "
              f"{100 * res['measured_share']:.0f}%")
        for s in res["studies"]:
            share_txt = "-" if s["measured_share"] is None else f"{100 * s['measured_share']:.0f}%"
            print(f"  {s['study']:24s} runs {s['train_records']:3d}  launches {s['launches']:2d} "
                  f"(placements x rounds {s['placements']} x {s['rounds']})  start-up median "
                  f"{s['startup_s_median']} s  measured {s['measured_steps_s']:7.1f} s of {s['sweeps_s']:7.1f} s "
                  f"= {share_txt}")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    groups = [(args.write, results)] if args.write else [(os.path.join(out, "benchmarks"), [res])
                                                         for out, res in zip(args.outs, results)]
    for folder, rows in groups:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"launch_share-{stamp}.json")
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
