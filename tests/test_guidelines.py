"""The guidelines: decisions from records with known answers, answered per group, changing when the records
change, never claiming a target a NaN meets; and two sets of them compared."""

import json
import re

import pandas as pd
import pytest

from synthetic import guideline_records, rec, strong_records, write_records

from kanlib import guidelines
from kanlib.analysis import load
from kanlib.studies import strong_scaling, weak_scaling


def answers(g, basis):
    t = g.table[g.table["basis"] == basis]
    return dict(zip(t["question"] + " | " + t["group"], t["answer"]))


def test_nan_step_time_never_makes_a_guideline_claim_the_target(tmp_path):
    # A frame built without the loader (which refuses such records): NaN, zero and negative step times
    recs = strong_records({1: 8.0}, repeats=2)
    recs += [rec(world_size=2, nproc_per_node=2, global_batch=512, step_time_s=v, repeat=i)
             for i, v in enumerate([float("nan"), 0.0, -1.0])]
    df = pd.DataFrame([load.flatten(r) for r in recs])
    tab = strong_scaling.table(df)
    t = tab.data
    assert t["world_size"].tolist() == [1]  # the N=2 point has no valid time left: no row, no fake speedup
    assert "3 record(s) with a NaN, infinite, zero or negative step_time_s were left out" in tab.note
    g = guidelines.compute_guidelines(df)
    text = " ".join(g.sentences)
    assert "keeps" not in text and "nan%" not in text
    assert g.table["answer"].tolist() == ["not measured: no multi-process placement"]
    # a NaN efficiency in a table never qualifies a placement
    fake = pd.DataFrame({"world_size": [1, 2], "nnodes": [1, 1], "efficiency": [1.0, float("nan")]})
    assert strong_scaling.largest_efficient_world_size(fake, 0.8) == (1, 1.0)
    weak = pd.DataFrame({"world_size": [2, 2], "local_batch": [64, 128], "placement": ["1x2", "1x2"],
                         "weak_efficiency": [float("nan"), -0.5]})
    assert weak_scaling.smallest_efficient_batch(weak, 0.8)[0] is None


def test_guidelines_answer_with_placements_and_numbers(tmp_path):
    write_records(tmp_path, guideline_records())
    g = guidelines.from_out_dir(str(tmp_path), target_efficiency=0.8, memory_budget_bytes=80 * 2**30,
                                step_time_budget_s=1.0)
    s = answers(g, "strong_scaling")
    # work size 512: 1x2 (0.909) and 2x1 (0.8) both meet the target at N=2, so both are named, in placement order
    # (which one measured higher is not the answer); 2x2 (0.769) fails the target
    assert s["placement with efficiency >= 0.8 | kan, global_batch=512"].startswith("1x2, 2x1 (N=2): 1x2 91%")
    assert guidelines.decision(s["placement with efficiency >= 0.8 | kan, global_batch=512"]) == "1x2, 2x1 (N=2)"
    # work size 64: nothing reaches 80%, and the answer gives the best number, not "none"/"1"
    assert s["placement with efficiency >= 0.8 | kan, global_batch=64"] == \
        "none of 1x2: best 1x2 at 50% (3 runs)"  # fewer runs than an interval needs: no bracketed interval
    # the least work per process that reaches 80% at 1x2: the 512 batch (T(1)/2 = 4 s per process)
    assert s["1x2: least work per process with efficiency >= 0.8 | kan"].startswith(
        "widths [2, 8, 1], global batch 512: 4.04e+03 ms per process")
    g75 = guidelines.from_out_dir(str(tmp_path), target_efficiency=0.75)
    assert answers(g75, "strong_scaling")["placement with efficiency >= 0.75 | kan, global_batch=512"] \
        .startswith("2x2 (2 node(s) x 2 processes)")
    w = answers(g, "weak_scaling")
    assert w["1x4: smallest per-process batch with weak efficiency >= 0.8 | kan"].startswith("64 samples per process")
    assert w["2x2: smallest per-process batch with weak efficiency >= 0.8 | kan"].startswith("128 samples per process")
    c = answers(g, "communication")
    assert c["N=4: placement exposing the least communication | kan"].startswith(
        "1x4: 1 ms exposed (9% (2 runs) of the step)")
    assert c["1x4: bucket size minimising exposed communication | kan"].startswith("4 MiB")
    assert c["2x2: bucket size minimising exposed communication | kan"].startswith("25 MiB")
    model = answers(g, "communication model")
    assert sum(q.startswith("1x4: predicted") or q.startswith("2x2: predicted") for q in model) == 2  # per placement
    # no collective-benchmark records here: the hook times are not fitted instead, and the answer says so
    assert all(a == "not predicted: no collective-benchmark records in this folder" for a in model.values())
    size_row = g.table[g.table["basis"] == "model_size"].iloc[0]
    assert size_row["value"] == pytest.approx((1 - 1e-3) / 1e-9, rel=1e-6)
    assert "time limits first" in size_row["answer"]
    g2 = guidelines.from_out_dir(str(tmp_path), memory_budget_bytes=2**30)
    assert g2.table[g2.table["basis"] == "model_size"]["answer"].iloc[0] == f"memory limits first: at {(2**30 - 1e8) / 16:.3g} params"


def test_guidelines_change_when_records_change(tmp_path):
    write_records(tmp_path, strong_records({1: 8.0, 2: 4.4, 4: 2.5, 8: 8 / 6}))
    before = guidelines.from_out_dir(str(tmp_path)).table["answer"].tolist()
    write_records(tmp_path / "faster", strong_records({1: 8.0, 2: 4.0, 4: 2.0, 8: 1.0}, repeats=9))
    after = guidelines.from_out_dir(str(tmp_path)).table["answer"].tolist()
    assert before[0].startswith("1x4 ") and after[0].startswith("1x8 ")


def test_compare_guidelines_names_every_answer_that_differs():
    a = guidelines.Guidelines(pd.DataFrame([
        {"question": "q1", "group": "g", "answer": "1x2 (1 node(s) x 2 processes): 90% [88%, 92%]", "value": 0.9,
         "basis": ""},
        {"question": "q2", "group": "g", "answer": "4 MiB (default): 1.2 ms", "value": 1.0, "basis": ""}]))
    b = guidelines.Guidelines(pd.DataFrame([
        {"question": "q1", "group": "g", "answer": "1x2 (1 node(s) x 2 processes): 91% [89%, 93%]", "value": 0.91,
         "basis": ""},
        {"question": "q2", "group": "g", "answer": "25 MiB (default): 1.2 ms", "value": 1.0, "basis": ""},
        {"question": "q3", "group": "g", "answer": "none", "value": 0.0, "basis": ""}]))
    t = guidelines.compare(a, b).set_index("question")
    assert t["same"].to_dict() == {"q1": True, "q2": False, "q3": False}  # the numbers may move, the decision not
    assert t.loc["q2", "answer_b"] == "25 MiB (default): 1.2 ms" and pd.isna(t.loc["q3", "answer_a"])


def test_fewer_runs_than_an_interval_needs_show_the_runs_and_rank_nothing(tmp_path):
    """Issue 22.3: two runs per point make a bootstrap "interval" that is their min and max; the table shows the
    runs themselves and "2 runs", and the guideline that rests on them is not ranked. Five runs give intervals."""
    from kanlib.studies import strong_scaling

    two = strong_records({"1x1": 0.212, "1x2": 0.12}, repeats=2)
    t = strong_scaling.table(pd.DataFrame(two))
    shown = strong_scaling.display_table(t)
    assert list(shown["step time (ms)"]) == ["213 (2 runs: 212, 214)", "121 (2 runs: 120, 121)"]
    assert not any("[" in v for v in shown["efficiency"])
    write_records(tmp_path / "two", two)
    g = guidelines.from_out_dir(str(tmp_path / "two"))
    row = g.table.iloc[0]
    assert row["runs"] == 2 and not row["ranked"] and "too few repeats" in row["rests_on"]
    assert any(s.startswith("Not ranked: 1 of 1 answers") for s in g.sentences)
    assert "(2 runs)" in row["answer"]
    five = strong_records({"1x1": 0.212, "1x2": 0.12}, repeats=5)
    write_records(tmp_path / "five", five)
    g5 = guidelines.from_out_dir(str(tmp_path / "five"))
    assert g5.table.iloc[0]["ranked"] and g5.table.iloc[0]["runs"] == 5
    assert re.search(r"\d+% \[\d+%, \d+%\]", g5.table.iloc[0]["answer"])
    assert "[" in strong_scaling.display_table(strong_scaling.table(pd.DataFrame(five)))["step time (ms)"].iloc[0]


def test_unstable_points_are_named_with_the_reason_and_the_summary_fits_a_screen(tmp_path, capsys):
    """Issue 27.3: a point whose repeats spread wider than the decision margin is unstable 'spread ...', one with a
    disturbed run says so; the summary is one screen and marks the decisions that rest on them; comparing two
    studies names, for every decision that differs, what it rests on."""
    quiet = strong_records({"1x1": 0.2, "1x2": 0.11}, repeats=5)
    noisy = [dict(r) for r in quiet]
    for r, f in zip(noisy[5:], (1.0, 1.0, 1.3, 1.35, 1.4)):  # 1x2 spreads 31%: efficiency falls below 80%
        r["step_time_s"] = 0.11 * f
    noisy.append(dict(noisy[0], repeat=9, foreign_cpu_frac=0.5, interference_window_s=4.0))
    write_records(tmp_path / "a", quiet)
    write_records(tmp_path / "b", noisy)
    gb = guidelines.from_out_dir(str(tmp_path / "b"))
    st = gb.context.stability()
    p12 = st[st["placement"] == "1x2"].iloc[0]
    # a wide spread is named, but it is no flag of its own (issue 36.3): the decision is flagged because it could
    # change within its interval (the interval holds the 80% target) and because 1x1 lost a disturbed run
    assert not p12["unstable"] and p12["wide"] and p12["why"].startswith("spread 31% of the median > the 10% decision")
    p11 = st[st["placement"] == "1x1"].iloc[0]
    assert p11["unstable"] and p11["why"] == "1 disturbed run(s) left out" and p11["n_runs"] == 5
    rests = gb.table.iloc[0]["rests_on"]
    assert "1 of 2 point(s) unstable: 1x1 (1 disturbed run(s) left out)" in rests and "near the 80% target" in rests
    assert "spread" not in rests
    assert not any("spread" in s for s in gb.sentences)
    assert "Unstable: strong_scaling 1x1: 1 disturbed run(s) left out." in gb.sentences
    text = guidelines.summary(gb)
    assert len(text.splitlines()) <= 25 and text.splitlines()[1].startswith("! placement with efficiency")
    assert "1 decisions; 1 flagged (could change within their intervals" in text
    assert "2 measured points: 1 unstable (1 disturbed run(s) left out, 0 with fewer than 5 runs); 1 wide" in text
    # the same decision on quiet points of the same spread-free runs is not flagged
    ga = guidelines.from_out_dir(str(tmp_path / "a"))
    assert ga.table.iloc[0]["rests_on"] == "" and guidelines.summary(ga).splitlines()[1].startswith("  placement")
    assert guidelines.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert "differs: placement with efficiency >= 0.8 [kan]: rests on b: 1 of 2 point(s) unstable" in out
    assert guidelines.main([str(tmp_path / "b"), "--summary"]) == 0


def test_a_link_model_that_fails_its_own_check_gives_no_guidance(calibrated):
    """Issue 22.5: the rule in one place (Context.model_check): a model whose DDP parity fails is not used for a
    prediction, and the report says it over the what-ifs; one that passes carries its error as a band."""
    from kanlib import report

    g = guidelines.from_out_dir(str(calibrated))
    pred = g.table[g.table["question"].str.contains("predicted largest world size")]
    assert len(pred) and all("model error band" in a for a in pred["answer"])
    check = g.context.model_check()
    assert check.status == "passed"
    # the band a world size is decided on: the model's error on exposed communication (what it scales), at the
    # high end of its median's interval
    from kanlib.analysis import commmodel
    val = commmodel.model_validation(g.context.ddp_parity())
    assert check.exposed_band == pytest.approx(val.exposed_median_hi) and val.exposed_median_hi >= \
        val.exposed_median_abs_err
    assert all(f"±{check.exposed_band:.0%} on exposed communication" in a for a in pred["answer"])
    timed = 0
    for path in sorted(load.find_record_files(str(calibrated))):
        rec = load.read_json(path)
        if rec.get("comm_hook") == "timed":  # every other run 20 ms slower than the model (fitted without it) says
            timed += 1
            rec["step_time_s"] += 0.020 * (timed % 2)
            with open(path, "w") as f:
                json.dump(rec, f)
    bad = guidelines.from_out_dir(str(calibrated))
    pred = bad.table[bad.table["question"].str.contains("predicted largest world size")]
    assert len(pred) and set(pred["answer"]) == {"not used: the link model failed its own check"}
    check = bad.context.model_check()
    assert check.status == "failed" and "DDP parity" in check.why
    body = open(report.build_report(str(calibrated), guidelines=bad)).read()
    assert body.count("FAILED its own check") >= 3  # the front page and both what-ifs


def _cli(*args):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-m", "kanlib.guidelines", *map(str, args)], capture_output=True,
                          text=True, cwd=root, env={**os.environ, "PYTHONPATH": root}, timeout=120)


def test_the_cli_refuses_missing_empty_and_failed_only_folders_and_a_zero_target(tmp_path):
    """Issue 23: ``python -m kanlib.guidelines /nope1 /nope2`` said "0 of 0 answers the same" and exited 0; an
    empty or only-failed folder exited 0 too; ``--target-efficiency 0`` ended in a traceback."""
    out = _cli(tmp_path / "nope1", tmp_path / "nope2")
    assert out.returncode == 2 and "nope1: no such folder" in out.stderr and "answers the same" not in out.stdout
    (tmp_path / "empty").mkdir()
    out = _cli(tmp_path / "empty")
    assert out.returncode == 2 and "no guidelines: no records under" in out.stderr
    failed = tmp_path / "failed" / "strong_scaling" / "run0"  # a failed run leaves no record.json
    failed.mkdir(parents=True)
    (failed / "config.json").write_text("{}")
    (failed.parent / "manifest.jsonl").write_text('{"status": "failed", "run_key": "run0"}\n')
    out = _cli(tmp_path / "failed")
    assert out.returncode == 2 and "no guidelines" in out.stderr
    write_records(tmp_path / "ok", strong_records({1: 8.0, 2: 4.4}))
    out = _cli(tmp_path / "ok", "--target-efficiency", "0")
    assert out.returncode == 2 and "--target-efficiency: a parallel efficiency in (0, 1]" in out.stderr
    assert "Traceback" not in out.stderr
    assert _cli(tmp_path / "ok").returncode == 0
    out = _cli(tmp_path / "ok", tmp_path / "empty")
    assert out.returncode == 2 and "empty: no guidelines" in out.stderr


def test_the_prediction_extrapolates_plain_ddp_not_the_gradient_accumulation_twins(calibrated):
    """The predicted world size extrapolates the plain-DDP point's measured compute: runs of the same placement and
    bucket size with gradient accumulation (here their no-op runs: 16 micro-steps, 16 times the step) are another
    point, and adding them changes nothing (they had been pooled into the median compute, and moved the interval it
    travels with)."""
    def predicted(g):
        t = g.table[g.table["question"].str.contains("predicted largest world size")]
        return dict(zip(t["group"] + " " + t["question"], t["answer"]))

    before = predicted(guidelines.from_out_dir(str(calibrated)))
    extra = []
    for path in sorted(load.find_record_files(str(calibrated))):
        rec = load.read_json(path)
        if rec.get("study") == "communication" and rec.get("comm_hook") == "noop":
            extra.append({**rec, "grad_accum_steps": 16, "step_time_s": 16 * rec["step_time_s"],
                          "run_key": f"{rec.get('run_key', '')}-accum"})
    assert extra
    write_records(calibrated, extra)
    after = predicted(guidelines.from_out_dir(str(calibrated)))
    assert before and after == before


def test_compare_finds_the_points_of_an_answer_whose_basis_is_not_its_study():
    """A question one run did not answer is explained from that run's points; the predicted world size's basis is
    'communication model' while its points are the communication study's (records_of says which), so looking them up
    by basis found none and the difference read "NOT on unstable or disturbed points"."""
    from kanlib.analysis.context import STABILITY_COLUMNS

    class Ctx:
        def __init__(self, st):
            self.st = st

        def stability(self):
            return self.st

    q = "1x2: predicted largest world size with efficiency >= 0.8"
    st = pd.DataFrame([{"study": "communication", "point": "1x2, comm_hook=timed", "placement": "1x2", "n_runs": 0,
                        "n_disturbed": 5, "median": float("nan"), "spread": float("nan"), "unstable": True,
                        "why": "5 disturbed run(s) left out", "key": {"placement": "1x2"}}], columns=STABILITY_COLUMNS)
    a = guidelines.Guidelines(pd.DataFrame([{"question": q, "group": "kan", "answer": "2 processes: calibrated model",
                                             "value": 2.0, "basis": "communication model", "runs": 5, "ranked": True,
                                             "rests_on": ""}], columns=guidelines.COLUMNS),
                              context=Ctx(st.iloc[0:0]), records_of={(q, "kan"): "communication"})
    b = guidelines.Guidelines(pd.DataFrame(columns=guidelines.COLUMNS), context=Ctx(st))
    [row] = guidelines.compare(a, b).to_dict("records")
    assert not row["same"]
    assert row["unstable"] == "b: not answered; 1 of 1 point(s) unstable: 1x2, comm_hook=timed (5 disturbed run(s) " \
                              "left out)"
    b.context = None  # nothing to look at: the difference is not named
    assert guidelines.compare(a, b).loc[0, "unstable"] == guidelines.NOT_NAMED


def test_every_multi_process_run_disturbed_is_unanswered_never_an_agreement(tmp_path):
    """Issue 34.8: with every multi-process run measured but disturbed (and left out), strong scaling said "not
    measured", weak scaling, communication and model size said nothing or "not resolved", and comparing two such
    folders said "1 of 1 answers the same" and exited 0. Each says how many disturbed runs were left out, counts as
    unanswered, and a comparison names it and exits 1."""
    from synthetic import comm_records, disturbed, size_records, weak_records

    def study(root):
        recs = strong_records({"1x1": 0.2}) + disturbed(strong_records({"1x2": 0.11, "2x1": 0.12}))
        recs += weak_records("kan", {1: 1000}) + disturbed(weak_records("kan", {2: 1600}))
        recs += comm_records("2x1") + disturbed(comm_records("1x2"))
        sizes = size_records()  # kan and mlp at three sizes; the kan's two larger sizes disturbed
        recs += [r for r in sizes if r["model"] != "kan" or r["n_params"] == 1_000]
        recs += disturbed([r for r in sizes if r["model"] == "kan" and r["n_params"] > 1_000])
        write_records(root, recs)
        return root

    g = guidelines.from_out_dir(str(study(tmp_path / "a")))
    answers = dict(zip(g.table["question"] + " [" + g.table["group"] + "]", g.table["answer"]))
    assert answers["placement with efficiency >= 0.8 [kan]"] == \
        "not answered: every multi-process run was disturbed: 6 disturbed run(s) left out at 1x2, 2x1"
    assert answers["1x2: smallest per-process batch with weak efficiency >= 0.8 [kan]"] == \
        "not answered: every run at 1x2 was disturbed: 1 disturbed run(s) left out at 1x2"
    assert answers["1x2: bucket size minimising exposed communication [kan]"] == \
        "not answered: every run at 1x2 was disturbed: 8 disturbed run(s) left out at 1x2"
    assert answers["model size beyond which memory, not time, limits [kan]"] == \
        "not answered: every run of 2 size(s) was disturbed: 2 disturbed run(s) left out at 1x1"
    said = ("kan: no placement can be recommended: 6 disturbed run(s) left out at 1x2, 2x1, every multi-process run "
            "measured (other processes took 85% of its CPUs; disturbed='keep' shows them apart")
    assert any(s.startswith(said) for s in g.sentences)
    text = guidelines.summary(g)
    assert "decisions (4 unanswered: their runs disturbed and left out, or not made)" in text
    study(tmp_path / "b")
    out = _cli(tmp_path / "a", tmp_path / "b")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "answers the same; 4 unanswered in both (not an agreement)" in out.stdout
    assert "unanswered in both: placement with efficiency >= 0.8 [kan]: a: not answered: every multi-process run " \
           "was disturbed: 6 disturbed run(s) left out" in out.stdout
    t = guidelines.compare(g, guidelines.from_out_dir(str(tmp_path / "b")))
    assert (t.loc[t["answer_a"].str.startswith("not answered"), "unanswered"] == "both").all()
    assert not t.loc[t["answer_a"].str.startswith("not answered"), "same"].any()


def test_a_study_whose_every_run_was_disturbed_is_unanswered_not_absent(tmp_path):
    """Issue 34.8: a study measured with every run disturbed left no answer at all, so two such folders compared
    equal on the other studies alone."""
    from synthetic import disturbed, weak_records

    for side in ("a", "b"):
        write_records(tmp_path / side, strong_records({"1x1": 0.2, "1x2": 0.11}, repeats=5)
                      + disturbed(weak_records("kan", {1: 1000, 2: 1600})))
    g = guidelines.from_out_dir(str(tmp_path / "a"))
    row = g.table[g.table["basis"] == "weak_scaling"].iloc[0]
    assert row["question"] == "weak_scaling: every question"
    assert row["answer"] == "not answered: every run was disturbed: 2 disturbed run(s) left out at 1x1, 1x2"
    assert guidelines.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 1


def test_the_summary_wraps_a_long_answer_and_never_cuts_a_number(tmp_path):
    # issue 36.6: --summary cut lines at 110 characters, before the number
    write_records(tmp_path, strong_records({"1x1": 0.2, "1x2": 0.11}, repeats=5))
    g = guidelines.from_out_dir(str(tmp_path))
    g.table.loc[0, "answer"] = "none of 1x2, 2x1: " + "a long explanation " * 8 + "best 2x1 at 85% [72%, 95%]"
    text = guidelines.summary(g, width=60)
    assert all(len(line) <= 60 for line in text.splitlines()[1:])
    assert "best 2x1 at 85% [72%, 95%]" in " ".join(line.strip() for line in text.splitlines())
    assert "..." not in text.split("decisions")[0]


def without_plotly_env(tmp_path) -> dict:
    """The environment of a process in which ``import plotly`` fails, as after ``pip install kanlib`` (plotly is in
    the notebooks extra only): a sitecustomize that blocks it, this checkout first on the path."""
    import os

    site = tmp_path / "no_plotly"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['plotly'] = None  # import plotly fails\n")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), repo])}


def test_the_guidelines_cli_runs_without_plotly(tmp_path):
    """Issue 34.10: python -m kanlib.guidelines died with ModuleNotFoundError: No module named 'plotly' on the core
    dependencies (every study module imported plotly when loaded); figures now import it when one is made."""
    import subprocess
    import sys

    from synthetic import write_new_studies, write_study

    out = write_new_studies(write_study(tmp_path / "out"))
    env = without_plotly_env(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import plotly"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr  # the block holds
    for args in (["--summary", str(out)], [str(out)], [str(out), str(out)]):
        run = subprocess.run([sys.executable, "-m", "kanlib.guidelines", *args], env=env, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        assert "plotly" not in run.stderr
    assert run.stdout.strip().splitlines()[-1].endswith("answers the same")
    # a figure still says what it needs
    code = ("from kanlib.studies import strong_scaling\nfrom kanlib.analysis import style\n"
            "try:\n    style.go.Figure()\nexcept ModuleNotFoundError as e:\n    print(e)\n")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "making a figure needs plotly, which kanlib's notebooks extra installs" in run.stdout, run.stderr
