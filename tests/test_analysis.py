"""The shared analysis machinery: reading records once (bad files named, code versions never pooled),
statistics, the checks a guideline makes, and what the analysis imports."""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from synthetic import rec, strong_records, write_records

from kanlib import front, guidelines
from kanlib.analysis import load, stats
from kanlib.studies import strong_scaling


def test_amdahl_fit_recovers_the_serial_fraction():
    n = np.array([1, 2, 4, 8, 16])
    assert stats.fit_amdahl(n, stats.amdahl_speedup(n, 0.07)) == pytest.approx(0.07)


def test_bootstrap_interval_contains_the_median_and_shrinks_with_data():
    rng = np.random.default_rng(1)
    small, big = rng.normal(1, 0.1, 5), rng.normal(1, 0.1, 500)
    lo, hi = stats.bootstrap_ci(small)
    assert lo <= np.median(small) <= hi
    lo2, hi2 = stats.bootstrap_ci(big)
    assert hi2 - lo2 < hi - lo
    assert stats.bootstrap_ci([3.0]) == (3.0, 3.0)


def test_load_records_skips_and_names_bad_files_and_strict_raises(tmp_path):
    write_records(tmp_path, strong_records({1: 1.0}, repeats=2))
    bad = tmp_path / "strong_scaling" / "broken"
    bad.mkdir()
    (bad / "record.json").write_text('{"schema_version": 1, "study": "strong_')
    with pytest.warns(UserWarning, match="skipped 1 unreadable"):
        recs = load.read(str(tmp_path))
    assert len(recs.select().data) == 2
    (path, line, reason), = recs.bad
    assert path.endswith("broken/record.json") and line == 1
    with pytest.raises(load.RecordError, match="broken/record.json, line 1"):
        load.load_records(str(tmp_path), strict=True)


def test_empty_output_dir_says_no_records(tmp_path):
    from kanlib import report

    with pytest.raises(load.NoRecordsError, match="^no records under "):
        load.load_records(str(tmp_path))
    a = report.analyze(str(tmp_path), "strong_scaling")
    assert a.empty and a.message.startswith("no records of study 'strong_scaling' under")
    g = guidelines.from_out_dir(str(tmp_path))
    assert g.sentences[0].startswith("no records under")


def test_newest_code_version_by_default_and_all_as_separate_groups(tmp_path):
    old = strong_records({1: 2.0, 2: 1.0}, code_version="old", git_sha="1111111",
                         finished_at="2026-01-01T00:00:00+00:00")
    new = strong_records({1: 20.0, 2: 16.0}, code_version="new", git_sha="2222222-dirty",
                         finished_at="2026-02-01T00:00:00+00:00")
    write_records(tmp_path, old + new)
    sel = load.read(str(tmp_path)).select()
    df = sel.data
    assert set(df["code_version"]) == {"new"}
    assert sel.left_out == [{"study": "strong_scaling", "code_version": "old", "git_sha": "1111111",
                             "n_records": 6}]
    assert "6 strong_scaling record(s) of code_version old (git 1111111)" in sel.code_note
    t = strong_scaling.table(df)
    assert t.data["step_time_s"].iloc[0] == pytest.approx(20.2)  # the median of the new code's runs only
    both = strong_scaling.table(load.load_records(str(tmp_path), code="all"))
    assert "code_version" in both.groups and len(both) == 4
    assert load.load_records(str(tmp_path), code="old")["step_time_s"].max() < 3
    g = guidelines.from_out_dir(str(tmp_path))
    assert g.sentences[-1].startswith("Left out records of other code")


def test_schema_1_records_are_code_version_unknown(tmp_path):
    v1 = [{k: v for k, v in r.items() if k not in ("code_version",)} | {"schema_version": 1}
          for r in strong_records({1: 2.0}, finished_at="2025-01-01T00:00:00+00:00")]
    write_records(tmp_path, v1 + strong_records({1: 3.0}))
    df = load.load_records(str(tmp_path), code="all")
    assert sorted(set(df["code_version"])) == ["c0", "unknown"]
    assert set(load.load_records(str(tmp_path))["code_version"]) == {"c0"}


# -- NaN never passes a threshold ----------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0, None, "fast"])
def test_meets_refuses_nan_zero_negative_and_non_numbers(bad):
    assert not stats.meets(bad, 0.8)
    assert stats.meets(0.8, 0.8) and not stats.meets(0.79, 0.8)


def test_time_to_accuracy_and_compounding_name_candidates_within_the_margin_together():
    """A single run cannot tell apart times within 10%: the guideline names them together, so a rerun that swaps
    their order gives the same decision; a clear winner is still named alone."""
    t = pd.Series([4.19, 4.44, 7.05])
    assert stats.within_margin(t).tolist() == [True, True, False]
    assert stats.within_margin(pd.Series([4.44, 4.19, 7.05])).tolist() == [True, True, False]
    assert stats.within_margin(pd.Series([5.0, 6.4])).tolist() == [True, False]


def test_a_training_rank_imports_no_analysis_code():
    """kanlib.train (what every rank imports) pulls in neither pandas nor the analysis half (kanlib.analysis,
    kanlib.studies)."""
    code = ("import sys, kanlib.train; print(sorted(m for m in ('pandas', 'kanlib.analysis', 'kanlib.studies', "
            "'plotly') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_analysis_imports_no_torch():
    """The report, the guidelines and every study module need no torch (a report builds on a machine without it)."""
    code = ("import sys, kanlib.report, kanlib.guidelines, kanlib.studies, kanlib.analysis.explorer; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_analysis_code_leaves_run_keys_alone_and_runtime_code_changes_them(tmp_path):
    """code_version hashes the runtime sources: an edit of an analysis module or package (kanlib.analysis,
    kanlib.studies, report, guidelines) keeps every run key; an edit of a runtime module changes them."""
    import shutil

    from kanlib import runkey

    pkg = tmp_path / "kanlib"
    shutil.copytree(os.path.dirname(runkey.__file__), pkg, ignore=shutil.ignore_patterns("__pycache__"))
    before = runkey.runtime_sources(str(pkg))
    assert "train.py" in before and "errors.py" in before
    assert not [p for p in before if p.split(os.sep)[0] in ("analysis", "studies", "report.py", "guidelines.py")]
    (pkg / "analysis" / "new_helper.py").write_text("x = 1\n")
    assert runkey.runtime_sources(str(pkg)) == before
    (pkg / "worker_extra").mkdir()
    (pkg / "worker_extra" / "part.py").write_text("x = 1\n")  # a runtime subpackage counts
    assert os.path.join("worker_extra", "part.py") in runkey.runtime_sources(str(pkg))


def test_disturbed_runs_are_left_out_by_default_named_and_kept_apart_on_request(tmp_path):
    """Issue 27.2: a run whose machine was busy (kanlib.disturbance.disturbance) leaves every analysis by default, and
    the selection says how many and which; disturbed='keep' keeps it as a group of its own, never pooled."""
    from kanlib.analysis.context import Context

    recs = strong_records({"1x1": 0.2, "1x2": 0.11}, repeats=3)
    recs.append(dict(recs[-1], repeat=5, step_time_s=0.3, foreign_cpu_frac=0.45, interference_window_s=3.0))
    recs.append(dict(recs[0], repeat=6, step_time_s=0.5, runqueue_wait_frac=0.3))
    write_records(tmp_path, recs)
    sel = load.read(str(tmp_path)).select()
    assert len(sel.data) == 6 and sel.data["step_time_s"].max() < 0.25
    assert [d["why"] for d in sel.disturbed] == ["other processes took 45% of its CPUs",
                                                 "a training thread waited for a CPU 30% of the time"]
    assert sel.disturbed_note.startswith("2 disturbed run(s) left out (disturbed='keep' keeps them, shown apart): "
                                         "strong_scaling/run")
    t = strong_scaling.table(sel.data)
    assert list(t.data["n_runs"]) == [3, 3] and "disturbed" not in t.groups
    kept = Context(str(tmp_path), disturbed="keep").runs("strong_scaling")
    tk = strong_scaling.table(kept.data)
    assert "disturbed" in tk.groups and len(tk) == 4  # the two disturbed runs are rows of their own
    assert tk.data[tk.data["disturbed"]]["n_runs"].tolist() == [1, 1]
    with pytest.raises(ValueError, match="disturbed: expected one of leave_out, keep, got 'drop'"):
        load.read(str(tmp_path)).select(disturbed="drop")
    from kanlib import report
    assert "2 disturbed run(s) left out" in report.analyze(str(tmp_path), "strong_scaling").message


def test_first_run_of_a_launch_against_its_later_runs():
    """Records say which launch ran them; the analysis compares a worker group's first run with the later runs of
    the same point (the report says the ratio), and says when no point allows it."""
    from kanlib.analysis import context as context_mod

    recs = strong_records({"1x1": 0.100, "1x2": 0.060}, repeats=5, batch=512)
    for r in recs:
        r["runs_before_in_launch"] = r["repeat"]  # repeat 0 ran first in its group
        if r["repeat"] == 0:
            r["step_time_s"] *= 1.5  # a slow first run
    e = context_mod.first_run_effect(pd.DataFrame(recs))
    assert e["n"] == 2 and 1.45 < e["min"] <= e["max"] < 1.5
    for r in recs:
        r["runs_before_in_launch"] = 0  # every run in a launch of its own: nothing to compare
    assert context_mod.first_run_effect(pd.DataFrame(recs))["n"] == 0
    assert "not checked" in front.first_run_sentence(context_mod.first_run_effect(pd.DataFrame(recs)))


@pytest.mark.parametrize("field, a, b", [("torch_version", "2.13.0+cpu", "2.14.0+cpu"),
                                         ("hostname", "nodeA", "nodeB")])
def test_records_of_another_torch_version_or_host_are_a_group_of_their_own(tmp_path, field, a, b):
    """Issue 23: records of another torch version and host pooled into one group."""
    write_records(tmp_path, strong_records({1: 2.0, 2: 1.0}, **{field: a})
                  + strong_records({1: 4.0, 2: 3.0}, **{field: b}))
    t = strong_scaling.table(load.load_records(str(tmp_path)))
    assert field in t.groups and len(t) == 4
    assert sorted(t.data.loc[t.data[field] == a, "step_time_s"]) == pytest.approx([1.01, 2.02])


def test_a_copy_of_a_study_folder_inside_out_is_counted_once(tmp_path):
    """Issue 23: after ``cp -r OUT/strong_scaling OUT/strong_scaling.bak`` n_runs doubled with no warning."""
    import shutil

    write_records(tmp_path, [dict(r, run_id=f"id{i}") for i, r in enumerate(strong_records({1: 2.0, 2: 1.0}))])
    shutil.copytree(tmp_path / "strong_scaling", tmp_path / "strong_scaling.bak")
    with pytest.warns(UserWarning, match="6 record\\(s\\) are copies of another with the same run id") as w:
        df = load.load_records(str(tmp_path))
    assert len(df) == 6 and df["record_path"].str.contains("/strong_scaling/run").all()
    text = str(w[0].message)
    assert f"{tmp_path}/strong_scaling.bak/run0/record.json copies {tmp_path}/strong_scaling/run0/record.json" in text
    assert strong_scaling.table(df).data["n_runs"].tolist() == [3, 3]


def test_runs_of_another_host_allocator_are_never_pooled_and_rerun_under_their_own_key(tmp_path, monkeypatch):
    """Issue 34.5: ``host_malloc`` was recorded but neither a group field nor in the run key: a study resumed under
    ``KANLIB_HOST_MALLOC=system`` reused the steady runs as done and pooled both settings into one 1x1 point."""
    from kanlib.config import RunConfig

    monkeypatch.delenv("KANLIB_HOST_MALLOC", raising=False)
    default = RunConfig().run_key()
    monkeypatch.setenv("KANLIB_HOST_MALLOC", "steady")
    assert RunConfig().run_key() == default  # the default setting keeps existing folders' keys
    monkeypatch.setenv("KANLIB_HOST_MALLOC", " System ")
    assert RunConfig().run_key() != default  # another setting reruns into its own folder, never reuses
    write_records(tmp_path, strong_records({"1x1": 0.129, "1x2": 0.07}, host_malloc="steady")
                  + strong_records({"1x1": 0.200}, host_malloc="system"))
    t = strong_scaling.table(load.load_records(str(tmp_path)))
    assert "host_malloc" in t.groups and "host_malloc" in t.note
    one = t.data[t.data["placement"] == "1x1"]
    assert sorted(one["n_runs"]) == [3, 3]  # two 1x1 points of three runs, not one of six
    assert one.set_index("host_malloc")["step_time_s"].to_dict() == pytest.approx({"steady": 0.13029,
                                                                                     "system": 0.202})
    g = guidelines.from_out_dir(str(tmp_path))
    assert sorted(g.table["group"]) == ["kan, host_malloc=steady", "kan, host_malloc=system"]
    st = g.context.stability()
    assert sorted(st.loc[st["placement"] == "1x1", "point"]) == ["1x1, host_malloc=steady",
                                                                 "1x1, host_malloc=system"]


def test_newest_code_is_this_checkouts_not_a_copied_in_record_that_finished_last(tmp_path, monkeypatch):
    """Issue 34.12: the "newest" code version was the one whose last run finished latest, so one record copied in
    from another checkout, finished later, replaced this checkout's whole study."""
    from kanlib.records import git_sha

    ours = strong_records({1: 2.0, 2: 1.0}, code_version="ours", git_sha="0" * 40,
                          finished_at="2026-01-01T00:00:00+00:00")
    copied = [dict(ours[0], code_version="theirs", git_sha="f" * 40, step_time_s=9.0,
                   finished_at="2026-03-01T00:00:00+00:00")]
    write_records(tmp_path, ours + copied)
    monkeypatch.setenv("KANLIB_CODE_VERSION", "ours")  # what a run from this checkout would record
    sel = load.read(str(tmp_path)).select()
    assert set(sel.data["code_version"]) == {"ours"} and len(sel.data) == 6
    assert sel.left_out[0]["code_version"] == "theirs" and sel.left_out[0]["n_records"] == 1
    # not this checkout's code (an edit since): this checkout's commit decides, edited or not
    monkeypatch.setenv("KANLIB_CODE_VERSION", "edited-since")
    head = git_sha().removesuffix("-dirty")
    assert head != "unknown"
    two = tmp_path / "two"
    write_records(two, [dict(r, git_sha=head + "-dirty") for r in strong_records({1: 2.0}, code_version="ours",
                                                                                  repeats=2)]
                  + strong_records({1: 3.0, 2: 2.0}, code_version="theirs", git_sha="f" * 40,
                                   finished_at="2026-03-01T00:00:00+00:00"))
    assert set(load.load_records(str(two))["code_version"]) == {"ours"}
    # neither: the version with the most records, the latest finish only between equals
    assert set(load.load_records(str(tmp_path))["code_version"]) == {"ours"}
    assert load.newest_code(pd.DataFrame(ours[:1] + copied)) == "theirs"


def test_a_run_whose_rerun_was_killed_keeps_its_set_aside_record_in_the_analysis(tmp_path):
    # a sweep SIGKILLed while it reran a disturbed run: the rerun's start removed record.json and no sweep has put
    # the set-aside copy back yet; the run's only complete record must still be read (once), and once the rerun's
    # own record stands, the copy is an earlier attempt and is not read
    from kanlib import manifest

    write_records(tmp_path, [rec(world_size=1, run_id=f"r{r}", step_time_s=0.01, repeat=r, global_batch=64) for r in range(2)])
    run_dir = os.path.join(tmp_path, "strong_scaling", "run0")
    assert manifest.set_aside(run_dir)
    os.remove(os.path.join(run_dir, "record.json"))  # what the rerun's start does
    found = load.find_record_files(str(tmp_path))
    assert os.path.join(run_dir, "attempts", "r0.json") in found and len(found) == 2
    assert len(load.read(str(tmp_path)).runs) == 2
    with open(os.path.join(run_dir, "record.json"), "w") as f:  # the rerun completed
        json.dump(rec(world_size=1, run_id="second", step_time_s=0.01, global_batch=64), f)
    found = load.find_record_files(str(tmp_path))
    assert os.path.join(run_dir, "record.json") in found and len(found) == 2


def test_a_printed_interval_never_rounds_a_rejected_low_end_up_to_the_bound():
    # issue 36.4: 85% [71.9%, 95%] printed "85% [72%, 95%]" beside a guideline that rejected it for a low end below
    # the 72% the 80% target's margin needs; bounds round outward, the median to nearest
    from kanlib.analysis import fmt

    assert fmt.ci_text(0.85, 0.719, 0.951, fmt.pct) == "85% [71%, 96%]"
    assert fmt.pct_ci({"efficiency": 0.85, "efficiency_lo": 0.719, "efficiency_hi": 0.95, "n_runs": 5},
                      "efficiency") == "85% [71%, 95%]"
    assert fmt.ci_text(0.85, 0.72, 0.95, fmt.pct) == "85% [72%, 95%]"  # exact bounds stay
    assert fmt.ci_text(0.0615, 0.0612, 0.0634, fmt.pct1) == "6.2% [6.1%, 6.4%]"
    assert stats.reaches(0.85, 0.719, 0.95, 0.8, 5) != "yes"  # the rule it must agree with


def test_a_ranking_whose_medians_and_intervals_place_a_point_apart_is_near_the_tie():
    # two quiet studies: 1x1 soonest to target (A), then 1x1 and 1x2 tied (C) by a wider 1x1 interval; C names the
    # decision as near the tie, A (medians and intervals agree) does not
    a = stats.tie_unsettled([0.1869, 0.2275], [0.1855, 0.2153], [0.1897, 0.2348])
    c = stats.tie_unsettled([0.1922, 0.2548], [0.1830, 0.2314], [0.2151, 0.2696])
    assert a.tolist() == [False, False] and c.tolist() == [False, True]
    assert stats.tie_unsettled([0.1, 0.2], [np.nan, np.nan], [np.nan, np.nan]).tolist() == [False, False]
    assert stats.near_tie_note(["1x2 0.255 s"]).startswith("near the tie with the best")
