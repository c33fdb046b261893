"""Derived quantities, tolerant loading, and guidelines computed from synthetic records with known answers."""

import json
import re
import os

import numpy as np
import pandas as pd
import pytest

from kanlib import guidelines, plots, report, results


def rec(**kw):
    base = {"schema_version": 1, "study": "strong_scaling", "model": "kan", "widths": [2, 8, 1], "grid_size": 5,
            "spline_order": 3, "repeat": 0, "nnodes": 1, "comm_hook": "default", "bucket_cap_mb": 25.0,
            "nccl_algo": "", "n_params": 100, "peak_mem_bytes": 1000, "model_state_bytes": 400,
            "comm_total_s": None, "status": "ok"}
    base.update(kw)
    base["nproc_per_node"] = base.get("nproc_per_node", base["world_size"])
    return base


def write_records(root, recs):
    for i, r in enumerate(recs):
        d = os.path.join(root, r["study"], f"run{i}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "record.json"), "w") as f:
            json.dump(r, f)


def strong_records(times: dict[int, float], repeats=3, batch=512):
    return [rec(world_size=n, global_batch=batch, step_time_s=t * (1 + 0.01 * r), repeat=r)
            for n, t in times.items() for r in range(repeats)]


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


def test_weak_scaling_table(tmp_path):
    # per-process batch 64; throughput 1000, 1600, 3200, 6400 -> E_w 1, 0.8, 0.8, 0.8; vs N=2: 1, 1, 1
    recs = [rec(study="weak_scaling", world_size=n, global_batch=64 * n, step_time_s=64 * n / x)
            for n, x in {1: 1000, 2: 1600, 4: 3200, 8: 6400}.items()]
    write_records(tmp_path, recs)
    t = results.weak_scaling_table(results.load_records(str(tmp_path)))
    assert t["weak_efficiency"].tolist() == pytest.approx([1, 0.8, 0.8, 0.8])
    assert t["weak_efficiency_multi"].tolist()[1:] == pytest.approx([1, 1, 1])
    assert t["per_process_throughput"].tolist() == pytest.approx([1000, 800, 800, 800])


def test_communication_table_exposed_never_exceeds_total(tmp_path):
    recs = []
    for cap, (ta, tn, ct) in {1.0: (0.012, 0.010, 0.005), 25.0: (0.011, 0.010, 0.004)}.items():
        recs.append(rec(study="communication", world_size=2, bucket_cap_mb=cap, comm_hook="timed", step_time_s=ta,
                        comm_total_s=ct, global_batch=64))
        recs.append(rec(study="communication", world_size=2, bucket_cap_mb=cap, comm_hook="noop", step_time_s=tn,
                        global_batch=64))
    # noise: the no-op run slower than the all-reduce run -> exposed clipped to 0
    recs.append(rec(study="communication", world_size=4, bucket_cap_mb=1.0, comm_hook="timed", step_time_s=0.010,
                    comm_total_s=0.003, global_batch=64))
    recs.append(rec(study="communication", world_size=4, bucket_cap_mb=1.0, comm_hook="noop", step_time_s=0.011,
                    global_batch=64))
    write_records(tmp_path, recs)
    t = results.communication_table(results.load_records(str(tmp_path))).set_index(["world_size", "bucket_cap_mb"])
    assert t.loc[(2, 1.0), "exposed_s"] == pytest.approx(0.002)
    assert t.loc[(2, 1.0), "overlap_s"] == pytest.approx(0.003)
    assert t.loc[(2, 1.0), "overhead_fraction"] == pytest.approx(0.002 / 0.012)
    assert t.loc[(4, 1.0), "exposed_s"] == 0 and bool(t.loc[(4, 1.0), "exposed_clipped"])
    assert (t["exposed_s"] <= t["comm_total_s"]).all()


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
    with pytest.raises(results.NoRecordsError, match="^no records under "):
        results.load_records(str(tmp_path))
    a = report.analyze(str(tmp_path), "strong_scaling")
    assert a.empty and a.message.startswith("no records of study 'strong_scaling' under")
    g = guidelines.from_out_dir(str(tmp_path))
    assert g.sentences[0].startswith("no records under")


def guideline_records():
    recs = strong_records({1: 8.0, 2: 4.4, 4: 2.5, 8: 8 / 6})  # efficiency 0.909, 0.8, 0.75
    for b, xs in {32: {1: 1000, 4: 2800}, 64: {1: 1000, 4: 3300}, 128: {1: 1000, 4: 3900}}.items():
        recs += [rec(study="weak_scaling", world_size=n, global_batch=b * n, step_time_s=b * n / x)
                 for n, x in xs.items()]
    for (cap, ta), buckets in zip({1.0: 0.013, 4.0: 0.011, 25.0: 0.012}.items(), (8, 2, 1)):
        recs.append(rec(study="communication", world_size=4, bucket_cap_mb=cap, comm_hook="timed", step_time_s=ta,
                        comm_total_s=0.004 + 0.001 * buckets / 8, n_buckets=buckets, global_batch=64))
        recs.append(rec(study="communication", world_size=4, bucket_cap_mb=cap, comm_hook="noop", step_time_s=0.010,
                        global_batch=64))
    # KAN: mem = 1e8 + 16 P bytes, time = 1e-3 + 1e-9 P s
    for p in (1e5, 1e6, 1e7):
        recs.append(rec(study="model_size", world_size=1, global_batch=64, widths=[2, int(p), 1], n_params=int(p),
                        peak_mem_bytes=1e8 + 16 * p, model_state_bytes=16 * p, step_time_s=1e-3 + 1e-9 * p))
    return recs


def test_guidelines_from_synthetic_records_with_known_answers(tmp_path):
    write_records(tmp_path, guideline_records())
    g = guidelines.from_out_dir(str(tmp_path), target_efficiency=0.8, memory_budget_bytes=80 * 2**30,
                                step_time_budget_s=1.0)
    ans = dict(zip(g.table["basis"], g.table["answer"]))
    assert ans["strong_scaling"] == "4"  # 0.8 at 4 processes, 0.75 at 8
    assert ans["weak_scaling"] == "64"  # E_w at N=4: 0.7, 0.825, 0.975
    assert ans["communication"].startswith("4 MiB")
    # memory allows (80 GiB - 1e8) / 16 = 5.36e9 params, time (1 - 1e-3) / 1e-9 = 9.99e8: time limits first
    size_row = g.table[g.table["basis"] == "model_size"].iloc[0]
    assert size_row["value"] == pytest.approx((1 - 1e-3) / 1e-9, rel=1e-6)
    assert "time limits first" in size_row["answer"]
    # a target of 0.75 moves the strong-scaling answer to 8; a small memory budget makes memory the limit
    g2 = guidelines.from_out_dir(str(tmp_path), target_efficiency=0.75, memory_budget_bytes=2**30)
    ans2 = dict(zip(g2.table["basis"], g2.table["answer"]))
    assert ans2["strong_scaling"] == "8"
    assert ans2["model_size"] == f"{(2**30 - 1e8) / 16:.3g} params"
    assert any("N=8" in s for s in g2.sentences)
    assert any(s.startswith("The alpha-beta model fitted to 3 timed runs") for s in g.sentences)


def test_guidelines_change_when_records_change(tmp_path):
    recs = [r for r in guideline_records() if r["study"] == "strong_scaling"]
    write_records(tmp_path, recs)
    before = guidelines.from_out_dir(str(tmp_path)).table["answer"].tolist()
    write_records(tmp_path / "faster", strong_records({1: 8.0, 2: 4.0, 4: 2.0, 8: 1.0}, repeats=9))
    after = guidelines.from_out_dir(str(tmp_path)).table["answer"].tolist()
    assert before == ["4"] and after == ["8"]


def test_report_and_figures_are_offline_html(tmp_path):
    write_records(tmp_path, guideline_records())
    g = guidelines.from_out_dir(str(tmp_path))
    path = report.build_report(str(tmp_path), guidelines=g)
    text = open(path).read()
    assert not re.search(r"<script[^>]+src=", text)  # nothing loaded from the network
    assert "Plotly.newPlot" in text and "Deployment guidelines" in text and "Model-size scaling" in text
    a = report.analyze(str(tmp_path), "strong_scaling")
    (fig_path,) = a.save(str(tmp_path / "figures"))
    fig_html = open(fig_path).read()
    assert len(fig_html) > 1_000_000 and not re.search(r"<script[^>]+src=", fig_html)
    fig = a.figures["speedup_efficiency"]
    names = [t.name for t in fig.data]
    assert "ideal" in names and any(n.startswith("speedup") for n in names)


def test_tables_separate_intra_and_inter_node_points(tmp_path):
    recs = [rec(world_size=n, nnodes=nodes, nproc_per_node=n // nodes, global_batch=512, step_time_s=8 / n)
            for n, nodes in ((1, 1), (2, 1), (4, 2), (8, 4))]
    write_records(tmp_path, recs)
    t = results.scaling_table(results.load_records(str(tmp_path)))
    assert t["topology"].tolist() == ["1x1", "1x2", "2x2", "4x2"]
    assert t["inter_node"].tolist() == [False, False, True, True]
    fig = plots.strong_scaling_figure(t)
    speed = [tr for tr in fig.data if tr.name.startswith("speedup")][0]
    assert list(speed.marker.symbol) == ["circle", "circle", "diamond", "diamond"]
