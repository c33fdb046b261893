"""The published setup (8 GPUs = 4 nodes x 2) through the model, in the scenarios a folder supports."""

import re

from kanlib import report


def test_published_setup_in_three_scenarios(calibrated, tmp_path):
    a = report.published_setup(str(calibrated), bench_time_col="time_s")
    c = a.tables["comparison"]
    assert list(c["published"]) == ["5.97x", "74.7%", "1.3%-6.1%"]
    assert list(c.columns[2:]) == ["preset a100-hdr (compute and links; a preset, not a measurement)",
                                   "compute measured here, links of preset a100-hdr",
                                   "compute and links measured here (collective-benchmark fit)"]
    assert all(re.fullmatch(r"\d+\.\d\dx", v) for v in c.iloc[0, 2:])
    assert a.lines[0].startswith("Measured compute profile: ") and "3 single-process kan runs of strong_scaling" in a.lines[0]
    assert set(a.tables["drivers"]["scenario"]) == set(c.columns[2:])
    empty = report.published_setup(str(tmp_path / "nothing"))
    assert list(empty.tables["comparison"].columns) == ["quantity", "published", "preset a100-hdr (compute and links; "
                                                                               "a preset, not a measurement)"]
