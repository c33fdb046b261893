"""The extrapolation to thousands of GPUs, from measured links or a preset, and the parameters notebook 06
keeps for the report."""

import json

import pytest

from kanlib import report


@pytest.mark.slow  # 8 s at a load of 8 on this 2-core machine
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


def test_extrapolation_waits_for_the_slowest_rank_with_a_band(calibrated):
    """Per-rank steps of the no-op runs drawn with CV 20%: the extrapolation takes that spread, waits for the
    slowest of N ranks (below the optimistic bound, more so as N grows), and carries a band around it."""
    import os

    import numpy as np
    from synthetic import write_steps

    from kanlib.analysis import load, straggler

    runs = load.read(str(calibrated)).select("communication").data
    sigma = straggler.LogNormal.from_cv(1.0, 0.2).sigma
    g = np.random.default_rng(0)
    for path in runs.loc[runs["comm_hook"] == "noop", "record_path"]:
        x = 0.006 * np.exp(sigma * g.standard_normal(300))
        write_steps(os.path.dirname(path), [{"step": i, "measured": 1, "step_time_s": v} for i, v in enumerate(x)])
    a = report.extrapolation(str(calibrated), bench_time_col="time_s", kan_sizes=[[64, 256, 256, 1]],
                             bucket_caps_mb=(25.0,), max_world_size=1024, at_world_size=256, algos=("ring",))
    line = next(s for s in a.lines if s.startswith("Stragglers: per-rank spread from 4 no-op-hook runs at 2 processes"))
    cv = float(line.split("CV ")[1].split("%")[0]) / 100
    assert cv == pytest.approx(0.2, abs=0.03)
    assert a.extra["validation"].ok  # the synthetic DDP runs follow the model: validated, no warning
    # the per-process compute measured at the shared placements is used, and said so
    host = next(s for s in a.lines if s.startswith("Per-process compute at 1x2, 2x1 (no-op runs, 4): "))
    assert float(host.split(": ")[1].split("x")[0]) == pytest.approx(a.extra["stragglers"]["host_factor"], rel=0.01)
    assert "FAILED" not in a.message
    t = a.extra["table"].set_index("world_size")
    gap = t["efficiency_bound"] - t["efficiency"]
    assert gap.loc[1] == 0 and 0 < gap.loc[4] < gap.loc[64] and gap.loc[1024] > 0  # the slowest of N keeps rising
    assert (t["efficiency_lo"] <= t["efficiency"] + 1e-12).all() and (t["efficiency"] <= t["efficiency_hi"] + 1e-12).all()
    assert (t.loc[2:, "efficiency_hi"] > t.loc[2:, "efficiency_lo"]).all()  # the spread's interval gives a band
    assert "band" in a.tables["above"] and "optimistic bound" in a.tables["above"]
    fig = a.figures["efficiency"]
    assert any("band" in (tr.name or "") for tr in fig.data) and any("optimistic bound" in (tr.name or "")
                                                                      for tr in fig.data)
    assert "thin lines: the optimistic bound" in a.captions["efficiency"]


def test_without_multi_process_runs_the_compute_is_extrapolated_from_one_process_and_it_is_said(tmp_path):
    from synthetic import links, rec, write_bench, write_records

    write_bench(tmp_path, "1x2", links())
    write_bench(tmp_path, "2x1", links())
    write_records(tmp_path, [rec(world_size=1, global_batch=512, n_params=1_000, step_time_s=0.010 * (1 + 0.01 * r),
                                 step_time_s_p90=0.012, repeat=r) for r in range(3)])
    a = report.extrapolation(str(tmp_path), bench_time_col="time_s", kan_sizes=[[2, 8, 1]], bucket_caps_mb=(25.0,),
                             max_world_size=16, at_world_size=8, algos=("ring",))
    assert any(s.startswith("Per-process compute: extrapolated from one-process runs alone (N=1)") for s in a.lines)
    assert any("3 one-process runs (extrapolated from N=1 alone" in s for s in a.lines)
    assert "Contention: no DDP run with a no-op twin to fit it on (0)." in a.lines
    assert not a.extra["validation"].ok and "FAILED" in a.message  # never checked: not validated
