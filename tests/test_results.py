"""Derived quantities, tolerant loading, grouping (nothing pooled), and guidelines computed from
synthetic records with known answers."""

import json
import math
import os

import numpy as np
import pandas as pd
import pytest

from kanlib import guidelines, results


def rec(**kw):
    """A valid schema-2 record of a run (only the fields the analysis reads)."""
    base = {"schema_version": 2, "code_version": "c0", "git_sha": "abc1234", "study": "strong_scaling",
            "model": "kan", "widths": [2, 8, 1], "grid_size": 5, "spline_order": 3, "kan_impl": "fast", "repeat": 0,
            "nnodes": 1, "comm_hook": "default", "bucket_cap_mb": 25.0, "nccl_algo": "", "n_params": 100,
            "peak_mem_bytes": 1000, "model_state_bytes": 400, "comm_total_s": None, "status": "ok",
            "steps": 30, "emulate_latency_s": 0.0, "emulate_bandwidth_bytes_per_s": 0.0,
            "started_at": "2026-01-01T00:00:00+00:00", "finished_at": "2026-01-01T00:01:00+00:00",
            "out_dir": "outputs", "pg_timeout_s": 300.0}
    base.update(kw)
    base["nproc_per_node"] = base.get("nproc_per_node", base["world_size"] // base["nnodes"])
    return base


def write_records(root, recs):
    start = len(results.find_record_files(str(root)))  # several calls add runs, never overwrite
    for i, r in enumerate(recs, start=start):
        d = os.path.join(root, r["study"], f"run{i}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "record.json"), "w") as f:
            json.dump(r, f)


def strong_records(times: dict, repeats=3, batch=512, **kw):
    """Records at placements ``{"1x2": T, ...}`` (or world sizes ``{2: T}``, one node), ``repeats`` each."""
    out = []
    for p, t in times.items():
        nodes, ppn = (int(v) for v in p.split("x")) if isinstance(p, str) else (1, p)
        out += [rec(world_size=nodes * ppn, nnodes=nodes, nproc_per_node=ppn, global_batch=batch,
                    step_time_s=t * (1 + 0.01 * r), repeat=r, **kw) for r in range(repeats)]
    return out


def test_scaling_table_speedup_efficiency_karp_flatt(tmp_path):
    # T(1)=8, T(2)=4.4, T(4)=2.5, T(8)=4/3: efficiency 0.909, 0.8, 0.75 at 2, 4, 8
    write_records(tmp_path, strong_records({1: 8.0, 2: 4.4, 4: 2.5, 8: 8 / 6}))
    t = results.scaling_table(results.load_records(str(tmp_path)))
    assert list(t["world_size"]) == [1, 2, 4, 8]
    assert t["speedup"].tolist() == pytest.approx([1, 8 / 4.4, 3.2, 6.0])
    assert t["efficiency"].tolist() == pytest.approx([1, 8 / 8.8, 0.8, 0.75])
    e8 = (1 / 6 - 1 / 8) / (1 - 1 / 8)
    assert t["karp_flatt"].iloc[-1] == pytest.approx(e8)
    assert np.isnan(t["karp_flatt"].iloc[0])
    assert (t["speedup_lo"] <= t["speedup"] + 1e-12).all() and (t["speedup"] <= t["speedup_hi"] + 1e-12).all()
    assert t["speedup_lo"].iloc[0] == t["speedup_hi"].iloc[0] == 1.0  # the baseline has no spread
    assert t["speedup_hi"].iloc[-1] > t["speedup_lo"].iloc[-1]
    assert (t["n_runs"] == 3).all()
    assert t.attrs["note"] == ""  # one group: nothing to say


def test_amdahl_fit_recovers_the_serial_fraction():
    n = np.array([1, 2, 4, 8, 16])
    assert results.fit_amdahl(n, results.amdahl_speedup(n, 0.07)) == pytest.approx(0.07)


def test_bootstrap_interval_contains_the_median_and_shrinks_with_data():
    rng = np.random.default_rng(1)
    small, big = rng.normal(1, 0.1, 5), rng.normal(1, 0.1, 500)
    lo, hi = results.bootstrap_ci(small)
    assert lo <= np.median(small) <= hi
    lo2, hi2 = results.bootstrap_ci(big)
    assert hi2 - lo2 < hi - lo
    assert results.bootstrap_ci([3.0]) == (3.0, 3.0)


def weak_records(model="kan", xs=None, b=64, **kw):
    xs = xs or {1: 1000, 2: 1600, 4: 3200, 8: 6400}
    return [rec(study="weak_scaling", model=model, world_size=n, global_batch=b * n, step_time_s=b * n / x, **kw)
            for n, x in xs.items()]


def test_weak_scaling_table(tmp_path):
    # per-process batch 64; throughput 1000, 1600, 3200, 6400 -> E_w 1, 0.8, 0.8, 0.8; vs N=2: 1, 1, 1
    write_records(tmp_path, weak_records())
    t = results.weak_scaling_table(results.load_records(str(tmp_path)))
    assert t["weak_efficiency"].tolist() == pytest.approx([1, 0.8, 0.8, 0.8])
    assert t["weak_efficiency_multi"].tolist()[1:] == pytest.approx([1, 1, 1])
    assert t["per_process_throughput"].tolist() == pytest.approx([1000, 800, 800, 800])


def test_weak_scaling_keeps_models_and_placements_apart(tmp_path):
    # KAN and MLP at the same per-process batch are two groups, never one pooled median per N
    recs = weak_records("kan", {1: 1000, 2: 1600}) + weak_records("mlp", {1: 4000, 2: 8000})
    recs.append(rec(study="weak_scaling", model="kan", world_size=2, nnodes=2, global_batch=128,
                    step_time_s=128 / 1200))
    write_records(tmp_path, recs)
    t = results.weak_scaling_table(results.load_records(str(tmp_path)))
    assert t.attrs["group_fields"][:2] == ["model", "local_batch"]
    e = t.set_index(["model", "placement"])["weak_efficiency"]
    assert e[("kan", "1x2")] == pytest.approx(0.8) and e[("mlp", "1x2")] == pytest.approx(1.0)
    assert e[("kan", "2x1")] == pytest.approx(0.6)
    assert len(t) == 5


def comm_records(placement="1x2", caps=None, **kw):
    nodes, ppn = (int(v) for v in placement.split("x"))
    caps = caps or {1.0: (0.012, 0.010, 0.005), 25.0: (0.011, 0.010, 0.004)}
    out = []
    for cap, (ta, tn, ct) in caps.items():
        for r in range(2):
            out.append(rec(study="communication", world_size=nodes * ppn, nnodes=nodes, nproc_per_node=ppn,
                           bucket_cap_mb=cap, comm_hook="timed", step_time_s=ta * (1 + 0.01 * r), comm_total_s=ct,
                           n_buckets=8 if cap == 1.0 else 1, global_batch=64, repeat=r, **kw))
            out.append(rec(study="communication", world_size=nodes * ppn, nnodes=nodes, nproc_per_node=ppn,
                           bucket_cap_mb=cap, comm_hook="noop", step_time_s=tn * (1 + 0.01 * r), global_batch=64,
                           repeat=r, **kw))
    return out


def test_communication_table_exposed_never_exceeds_total(tmp_path):
    recs = comm_records()
    # noise: the no-op run slower than the all-reduce run -> exposed clipped to 0
    recs += comm_records("1x4", {1.0: (0.010, 0.011, 0.003)})
    write_records(tmp_path, recs)
    t = results.communication_table(results.load_records(str(tmp_path))).set_index(["world_size", "bucket_cap_mb"])
    assert t.loc[(2, 1.0), "exposed_s"] == pytest.approx(0.002 * 1.005, rel=1e-6)
    assert t.loc[(2, 1.0), "overhead_fraction"] == pytest.approx(0.002 / 0.012, rel=1e-2)
    assert t.loc[(2, 1.0), "overhead_lo"] <= t.loc[(2, 1.0), "overhead_fraction"] <= t.loc[(2, 1.0), "overhead_hi"]
    assert t.loc[(4, 1.0), "exposed_s"] == 0 and bool(t.loc[(4, 1.0), "exposed_clipped"])
    assert (t["exposed_s"] <= t["comm_total_s"]).all()


def test_communication_table_separates_grid_size_kan_impl_and_placement(tmp_path):
    recs = (comm_records("1x2") + comm_records("2x1", {1.0: (0.020, 0.010, 0.012), 25.0: (0.018, 0.010, 0.01)})
            + comm_records("1x2", grid_size=10) + comm_records("1x2", kan_impl="reference"))
    write_records(tmp_path, recs)
    t = results.communication_table(results.load_records(str(tmp_path)))
    assert {"grid_size", "kan_impl"} <= set(t.attrs["group_fields"])
    # 1x2 in three configs and 2x1 in one, two bucket sizes each
    assert len(t) == 8
    at2 = t[(t["grid_size"] == 5) & (t["kan_impl"] == "fast") & (t["bucket_cap_mb"] == 1.0)].set_index("placement")
    assert at2.loc["2x1", "exposed_s"] > at2.loc["1x2", "exposed_s"]
    assert "several sweeps" in t.attrs["note"] and "grid_size" in t.attrs["note"]


def test_load_records_skips_and_names_bad_files_and_strict_raises(tmp_path):
    write_records(tmp_path, strong_records({1: 1.0}, repeats=2))
    bad = tmp_path / "strong_scaling" / "broken"
    bad.mkdir()
    (bad / "record.json").write_text('{"schema_version": 1, "study": "strong_')
    with pytest.warns(UserWarning, match="skipped 1 unreadable"):
        df = results.load_records(str(tmp_path))
    assert len(df) == 2
    (path, line, reason), = df.attrs["bad"]
    assert path.endswith("broken/record.json") and line == 1
    with pytest.raises(results.RecordError, match="broken/record.json, line 1"):
        results.load_records(str(tmp_path), strict=True)


def test_empty_output_dir_says_no_records(tmp_path):
    from kanlib import report

    with pytest.raises(results.NoRecordsError, match="^no records under "):
        results.load_records(str(tmp_path))
    a = report.analyze(str(tmp_path), "strong_scaling")
    assert a.empty and a.message.startswith("no records of study 'strong_scaling' under")
    g = guidelines.from_out_dir(str(tmp_path))
    assert g.sentences[0].startswith("no records under")


# -- nothing mixed -------------------------------------------------------------------------------
def test_two_sweeps_in_one_folder_are_two_groups_with_their_fields_shown(tmp_path):
    # sweep A: widths [2, 8, 1], batch 512; sweep B: widths [2, 64, 1], batch 4096, 50 steps
    write_records(tmp_path, strong_records({1: 8.0, 2: 6.0}))
    write_records(tmp_path, strong_records({1: 80.0, 2: 42.0}, batch=4096, widths=[2, 64, 1], steps=50))
    df = results.load_records(str(tmp_path))
    t = results.scaling_table(df)
    assert t.attrs["group_fields"] == ["model", "widths", "global_batch", "steps"]
    eff = {(w, b): e for w, b, n, e in zip(t["widths"], t["global_batch"], t["world_size"], t["efficiency"]) if n == 2}
    assert eff[((2, 8, 1), 512)] == pytest.approx(8 / 12) and eff[((2, 64, 1), 4096)] == pytest.approx(80 / 84)
    assert len(t) == 4  # never one pooled median per N
    note = t.attrs["note"]
    assert "2 groups of strong_scaling records differ in widths, global_batch, steps" in note
    assert "several sweeps: no single strong_scaling sweep varies steps" in note
    # guidelines answer per group
    g = guidelines.compute_guidelines(df, target_efficiency=0.9)
    strong = g.table[g.table["question"].str.startswith("placement")]
    assert len(strong) == 2
    by_group = dict(zip(strong["group"], strong["answer"]))
    assert by_group["kan, widths=[2, 64, 1], global_batch=4096, steps=50"].startswith("1x2")
    assert by_group["kan, widths=[2, 8, 1], global_batch=512, steps=30"].startswith("none of 1x2: best 1x2 at 67%")


def test_placements_are_never_merged(tmp_path):
    write_records(tmp_path, strong_records({"1x1": 8.0, "1x2": 4.4, "2x1": 5.0}))
    t = results.scaling_table(results.load_records(str(tmp_path)))
    assert t["placement"].tolist() == ["1x1", "1x2", "2x1"]
    assert t["world_size"].tolist() == [1, 2, 2] and t["inter_node"].tolist() == [False, False, True]
    assert t["efficiency"].tolist() == pytest.approx([1.0, 8 / 8.8, 0.8])


def test_newest_code_version_by_default_and_all_as_separate_groups(tmp_path):
    old = strong_records({1: 2.0, 2: 1.0}, code_version="old", git_sha="1111111",
                         finished_at="2026-01-01T00:00:00+00:00")
    new = strong_records({1: 20.0, 2: 16.0}, code_version="new", git_sha="2222222-dirty",
                         finished_at="2026-02-01T00:00:00+00:00")
    write_records(tmp_path, old + new)
    df = results.load_records(str(tmp_path))
    assert set(df["code_version"]) == {"new"}
    assert df.attrs["left_out"] == [{"study": "strong_scaling", "code_version": "old", "git_sha": "1111111",
                                     "n_records": 6}]
    assert "6 strong_scaling record(s) of code_version old (git 1111111)" in df.attrs["code_note"]
    t = results.scaling_table(df)
    assert t["step_time_s"].iloc[0] == pytest.approx(20.2)  # the median of the new code's runs only
    both = results.scaling_table(results.load_records(str(tmp_path), code="all"))
    assert "code_version" in both.attrs["group_fields"] and len(both) == 4
    assert results.load_records(str(tmp_path), code="old")["step_time_s"].max() < 3
    g = guidelines.from_out_dir(str(tmp_path))
    assert g.sentences[-1].startswith("Left out records of other code")


def test_schema_1_records_are_code_version_unknown(tmp_path):
    v1 = [{k: v for k, v in r.items() if k not in ("code_version",)} | {"schema_version": 1}
          for r in strong_records({1: 2.0}, finished_at="2025-01-01T00:00:00+00:00")]
    write_records(tmp_path, v1 + strong_records({1: 3.0}))
    df = results.load_records(str(tmp_path), code="all")
    assert sorted(set(df["code_version"])) == ["c0", "unknown"]
    assert set(results.load_records(str(tmp_path))["code_version"]) == {"c0"}


# -- NaN never passes a threshold ----------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0, None, "fast"])
def test_meets_refuses_nan_zero_negative_and_non_numbers(bad):
    assert not guidelines.meets(bad, 0.8)
    assert guidelines.meets(0.8, 0.8) and not guidelines.meets(0.79, 0.8)


def test_nan_step_time_never_makes_a_guideline_claim_the_target(tmp_path):
    # A frame built without the loader (which refuses such records): NaN, zero and negative step times
    recs = strong_records({1: 8.0}, repeats=2)
    recs += [rec(world_size=2, nproc_per_node=2, global_batch=512, step_time_s=v, repeat=i)
             for i, v in enumerate([float("nan"), 0.0, -1.0])]
    df = pd.DataFrame([results._flatten(r) for r in recs])
    t = results.scaling_table(df)
    assert t["world_size"].tolist() == [1]  # the N=2 point has no valid time left: no row, no fake speedup
    assert "3 record(s) with a NaN, infinite, zero or negative step_time_s were left out" in t.attrs["note"]
    g = guidelines.compute_guidelines(df)
    text = " ".join(g.sentences)
    assert "keeps" not in text and "nan%" not in text
    assert g.table["answer"].tolist() == ["not measured: no multi-process placement"]
    # a NaN efficiency in a table never qualifies a placement
    fake = pd.DataFrame({"world_size": [1, 2], "nnodes": [1, 1], "efficiency": [1.0, float("nan")]})
    assert guidelines.largest_efficient_world_size(fake, 0.8) == (1, 1.0)
    weak = pd.DataFrame({"world_size": [2, 2], "local_batch": [64, 128], "placement": ["1x2", "1x2"],
                         "weak_efficiency": [float("nan"), -0.5]})
    assert guidelines.smallest_efficient_batch(weak, 0.8)[0] is None


# -- guidelines with placements -------------------------------------------------------------------
def guideline_records():
    # strong: 1x2 at 0.909, 2x1 at 0.8, 2x2 at 0.769 (T(1) = 8)
    recs = strong_records({"1x1": 8.0, "1x2": 4.4, "2x1": 5.0, "2x2": 2.6})
    # a second work size: little work per process, 1x2 at 0.5
    recs += strong_records({"1x1": 0.8, "1x2": 0.8}, batch=64)
    # weak, per-process batches 32, 64, 128 at 1x1 and 1x4 (E_w 0.7, 0.825, 0.975) and 2x2 (0.6, 0.7, 0.9)
    for b, xs in {32: (2800, 2400), 64: (3300, 2800), 128: (3900, 3600)}.items():
        recs.append(rec(study="weak_scaling", world_size=1, global_batch=b, step_time_s=b / 1000))
        recs.append(rec(study="weak_scaling", world_size=4, global_batch=4 * b, step_time_s=4 * b / xs[0]))
        recs.append(rec(study="weak_scaling", world_size=4, nnodes=2, global_batch=4 * b, step_time_s=4 * b / xs[1]))
    # communication at 1x4 and 2x2: 2x2 exposes more; 4 MiB is best on one node
    for p, caps in {"1x4": {1.0: (0.013, 0.010, 0.0045), 4.0: (0.011, 0.010, 0.0042), 25.0: (0.012, 0.010, 0.0041)},
                    "2x2": {1.0: (0.020, 0.010, 0.012), 4.0: (0.018, 0.010, 0.011), 25.0: (0.016, 0.010, 0.010)}}.items():
        recs += comm_records(p, caps)
    # KAN: mem = 1e8 + 16 P bytes, time = 1e-3 + 1e-9 P s
    for p in (1e5, 1e6, 1e7):
        recs.append(rec(study="model_size", world_size=1, global_batch=64, widths=[2, int(p), 1], n_params=int(p),
                        peak_mem_bytes=1e8 + 16 * p, model_state_bytes=16 * p, step_time_s=1e-3 + 1e-9 * p))
    return recs


def answers(g, basis):
    t = g.table[g.table["basis"] == basis]
    return dict(zip(t["question"] + " | " + t["group"], t["answer"]))


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
        "none of 1x2: best 1x2 at 50% [49%, 51%]"
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
    assert c["N=4: placement exposing the least communication | kan"].startswith("1x4: 1 ms exposed (9% [")
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


def test_guideline_without_two_placements_says_why(tmp_path):
    write_records(tmp_path, comm_records("1x2"))
    g = guidelines.from_out_dir(str(tmp_path))
    assert any("measured at one placement only (1x2), so placements cannot be compared" in s for s in g.sentences)
    assert not any(q.startswith("N=") for q in g.table["question"])


def test_guidelines_change_when_records_change(tmp_path):
    write_records(tmp_path, strong_records({1: 8.0, 2: 4.4, 4: 2.5, 8: 8 / 6}))
    before = guidelines.from_out_dir(str(tmp_path)).table["answer"].tolist()
    write_records(tmp_path / "faster", strong_records({1: 8.0, 2: 4.0, 4: 2.0, 8: 1.0}, repeats=9))
    after = guidelines.from_out_dir(str(tmp_path)).table["answer"].tolist()
    assert before[0].startswith("1x4 ") and after[0].startswith("1x8 ")


def test_a_training_rank_imports_no_analysis_code():
    """kanlib.train (what every rank imports) pulls in neither pandas nor the analysis half (kanlib.results)."""
    import subprocess
    import sys

    code = "import sys, kanlib.train; print(sorted(m for m in ('pandas', 'kanlib.results', 'plotly') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


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


def test_a_memory_fit_that_does_not_grow_is_not_extrapolated():
    """A CPU process's resident set, which the framework dominates at small sizes, moves by noise: its fit
    would put the memory limit anywhere (a run here fitted -484 bytes per parameter)."""
    size = pd.DataFrame({"model": "kan", "n_params": [880, 10_000, 42_880],
                         "peak_mem_bytes": [5.02e8, 5.00e8, 5.01e8], "step_time_s": [0.002, 0.004, 0.009]})
    with pytest.raises(ValueError, match=r"peak memory of kan did not grow measurably \(by 5%\)"):
        guidelines.memory_or_time_limit(size, 80 * 2**30, 1.0)
    size["peak_mem_bytes"] = [1e8, 2e8, 5e8]  # grows: the limit is extrapolated
    assert guidelines.memory_or_time_limit(size, 80 * 2**30, 1.0)["limit"] in ("memory", "time")
