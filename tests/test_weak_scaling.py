"""Weak scaling: throughput and weak-scaling efficiency at a fixed per-process batch, models and placements
never pooled."""

import pytest

from synthetic import rec, weak_records, write_records

from kanlib.analysis import load
from kanlib.studies import weak_scaling


def test_weak_scaling_table(tmp_path):
    # per-process batch 64; throughput 1000, 1600, 3200, 6400 -> E_w 1, 0.8, 0.8, 0.8; vs N=2: 1, 1, 1
    write_records(tmp_path, weak_records())
    t = weak_scaling.table(load.load_records(str(tmp_path))).data
    assert t["weak_efficiency"].tolist() == pytest.approx([1, 0.8, 0.8, 0.8])
    assert t["weak_efficiency_multi"].tolist()[1:] == pytest.approx([1, 1, 1])
    assert t["per_process_throughput"].tolist() == pytest.approx([1000, 800, 800, 800])


def test_weak_scaling_keeps_models_and_placements_apart(tmp_path):
    # KAN and MLP at the same per-process batch are two groups, never one pooled median per N
    recs = weak_records("kan", {1: 1000, 2: 1600}) + weak_records("mlp", {1: 4000, 2: 8000})
    recs.append(rec(study="weak_scaling", model="kan", world_size=2, nnodes=2, global_batch=128,
                    step_time_s=128 / 1200))
    write_records(tmp_path, recs)
    tab = weak_scaling.table(load.load_records(str(tmp_path)))
    t = tab.data
    assert tab.groups[:2] == ["model", "local_batch"]
    e = t.set_index(["model", "placement"])["weak_efficiency"]
    assert e[("kan", "1x2")] == pytest.approx(0.8) and e[("mlp", "1x2")] == pytest.approx(1.0)
    assert e[("kan", "2x1")] == pytest.approx(0.6)
    assert len(t) == 5
