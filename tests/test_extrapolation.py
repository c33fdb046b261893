"""The extrapolation to thousands of GPUs, from measured links or a preset, and the parameters notebook 06
keeps for the report."""

import json

import pytest

from kanlib import report


def test_extrapolation_from_measured_links_or_a_preset(calibrated, tmp_path):
    a = report.extrapolation(str(calibrated), bench_time_col="time_s", kan_sizes=[[2, 8, 1], [64, 256, 256, 1]],
                             bucket_caps_mb=(25.0,), max_world_size=64, at_world_size=16)
    assert a.message.startswith("Extrapolation from measured links")
    assert "tree: not measured by the benchmark; its formula on the measured links" in a.lines
    assert a.extra["gpus_per_node"] == 2  # the most the benchmark ran on one node
    table = a.extra["table"]
    assert set(table["kan"]) == {"[2, 8, 1]", "[64, 256, 256, 1]"} and table["world_size"].max() == 64
    above = a.tables["above"]
    assert len(above) == 4 and set(above[">= 80%"]) <= {"yes", "no"}
    assert "crossover" in a.tables
    m = a.tables["measured"]
    assert list(m["placement"]) == ["1x2"] and m["measured efficiency"].iloc[0] == "89.3%"
    pre = report.extrapolation(str(tmp_path / "none"), source="auto", kan_sizes=[[64, 256, 256, 1]], max_world_size=64,
                               at_world_size=16)
    assert pre.message.startswith("Extrapolation from preset h100-ndr") and "measured" not in pre.tables
    with pytest.raises(ValueError, match="^source: 'measured' needs collective-benchmark records"):
        report.extrapolation(str(tmp_path / "none"), source="measured")
    with pytest.raises(ValueError, match="^algos: unknown value"):
        report.extrapolation(str(calibrated), algos=("mesh",))
    report.extrapolation(str(calibrated), kan_sizes=[[2, 16, 1]], max_world_size=32, at_world_size=8, remember=True)
    saved = json.load(open(calibrated / "extrapolation.json"))
    assert saved["kan_sizes"] == [[2, 16, 1]] and saved["max_world_size"] == 32
    assert report.analyses(str(calibrated))["extrapolation"].extra["table"]["world_size"].max() == 32
