"""Strong scaling: speedup, efficiency and Karp-Flatt per placement and work size, nothing pooled; its figures,
display table and guideline."""

import re

import numpy as np
import pytest

from synthetic import is_key, strong_records, traces_of, write_records

from kanlib import guidelines, report
from kanlib.analysis import load
from kanlib.studies import strong_scaling


def test_scaling_table_speedup_efficiency_karp_flatt(tmp_path):
    # T(1)=8, T(2)=4.4, T(4)=2.5, T(8)=4/3: efficiency 0.909, 0.8, 0.75 at 2, 4, 8
    write_records(tmp_path, strong_records({1: 8.0, 2: 4.4, 4: 2.5, 8: 8 / 6}))
    tab = strong_scaling.table(load.load_records(str(tmp_path)))
    t = tab.data
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
    assert tab.note == ""  # one group: nothing to say


# -- nothing mixed -------------------------------------------------------------------------------
def test_two_sweeps_in_one_folder_are_two_groups_with_their_fields_shown(tmp_path):
    # sweep A: widths [2, 8, 1], batch 512; sweep B: widths [2, 64, 1], batch 4096, 50 steps
    write_records(tmp_path, strong_records({1: 8.0, 2: 6.0}))
    write_records(tmp_path, strong_records({1: 80.0, 2: 42.0}, batch=4096, widths=[2, 64, 1], steps=50))
    df = load.load_records(str(tmp_path))
    tab = strong_scaling.table(df)
    t = tab.data
    assert tab.groups == ["model", "widths", "global_batch", "steps"]
    eff = {(w, b): e for w, b, n, e in zip(t["widths"], t["global_batch"], t["world_size"], t["efficiency"]) if n == 2}
    assert eff[((2, 8, 1), 512)] == pytest.approx(8 / 12) and eff[((2, 64, 1), 4096)] == pytest.approx(80 / 84)
    assert len(t) == 4  # never one pooled median per N
    note = tab.note
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
    t = strong_scaling.table(load.load_records(str(tmp_path))).data
    assert t["placement"].tolist() == ["1x1", "1x2", "2x1"]
    assert t["world_size"].tolist() == [1, 2, 2] and t["inter_node"].tolist() == [False, False, True]
    assert t["efficiency"].tolist() == pytest.approx([1.0, 8 / 8.8, 0.8])


def test_strong_scaling_groups_get_their_own_subplots_and_a_work_figure(study_dir):
    a = report.analyze(str(study_dir), "strong_scaling")
    titles = [ann.text for ann in a.figures["speedup_efficiency"].layout.annotations]
    assert "Speedup T(1)/T(N)<br><sup>global_batch=64</sup>" in titles
    assert "Efficiency S/N<br><sup>global_batch=512</sup>" in titles
    work = a.figures["work"]
    (line,) = traces_of(work)  # 1x2 at two work sizes; 2x1 has one and is not a line
    assert list(line.x) == pytest.approx([0.404e3, 4.04e3]) and list(line.y) == pytest.approx([0.5, 8.08 / 4.4 / 2],
                                                                                             rel=1e-2)
    assert a.captions["work"].endswith("at 1x2 it rises, from 50% at 404 ms to 91% at 4.04e+03 ms.")


def test_figure_draws_no_marker_it_does_not_promise(tmp_path):
    write_records(tmp_path, strong_records({1: 8.0, 2: 4.4}))
    fig = report.analyze(str(tmp_path), "strong_scaling").figures["speedup_efficiency"]
    keys = [t.name for t in fig.data if is_key(t)]
    assert keys == ["model kan", "placement 1x1 (nodes x procs)", "placement 1x2 (nodes x procs)", "line: one node",
                    "long dashes: target efficiency 80% (guidelines)"]


def test_display_table_formats_units_and_intervals(study_dir):
    a = report.analyze(str(study_dir), "strong_scaling")
    t = a.summary()
    assert list(t.columns) == ["model", "global_batch", "placement", "runs", "step time (ms)", "speedup",
                               "efficiency", "Karp-Flatt serial fraction"]
    row = t[(t["global_batch"] == "512") & (t["placement"] == "1x2")].iloc[0]
    # three runs per point: fewer than an interval needs, so the runs themselves and "3 runs", no bracket
    assert row["step time (ms)"] == "4.44e+03 (3 runs: 4.4e+03, 4.44e+03, 4.49e+03)"
    assert row["speedup"] == "1.82x (3 runs)" and row["efficiency"] == "91% (3 runs)"
