"""Model-size scaling: KAN beside a matched MLP per size, FSDP against DDP, and the guidelines on where memory
limits and where sharding pays."""

import numpy as np
import pandas as pd
import pytest

from synthetic import fsdp_records, rec, traces_of, write_records

from kanlib import guidelines, report
from kanlib.analysis import load, style
from kanlib.studies import model_size


def test_fsdp_table_and_the_size_where_it_pays(tmp_path):
    write_records(tmp_path, fsdp_records())
    size = model_size.table(load.load_records(str(tmp_path)))
    f = model_size.fsdp_table(size)
    assert f["n_params"].tolist() == [10_000, 100_000, 1_000_000, 10_000_000]
    d = size.data  # the peak memory's interval, which the memory-or-time rule reads
    assert (d["peak_mem_lo"] <= d["peak_mem_bytes"]).all() and (d["peak_mem_bytes"] <= d["peak_mem_hi"]).all()
    assert f["mem_ratio"].iloc[-1] == pytest.approx((1e8 + 8e7) / (1e8 + 1.6e8))
    assert f["step_ratio"].tolist() == pytest.approx([1.3] * 4)
    assert f["state_fsdp_bytes"].tolist() == pytest.approx((f["state_ddp_bytes"] / 2).tolist())
    # 8 B/param saved beats 5% of DDP's peak from ~700k parameters on: 1e6 and 1e7 pay
    assert f["pays"].tolist() == [False, False, True, True]
    assert model_size.fsdp_pays_from(f, "kan") == 1_000_000
    g = guidelines.from_out_dir(str(tmp_path))
    row = g.table[g.table["question"] == "1x2: model size from which FSDP lowers peak memory per process"].iloc[0]
    assert row["value"] == 1_000_000 and row["answer"].startswith("from 1,000,000 parameters: peak memory per process 0.")


def test_fsdp_that_never_pays_is_said_with_numbers(tmp_path):
    write_records(tmp_path, fsdp_records(fsdp_bytes_per_param=16.0))
    size = model_size.table(load.load_records(str(tmp_path)))
    f = model_size.fsdp_table(size)
    assert not f["pays"].any() and model_size.fsdp_pays_from(f, "kan") is None
    g = guidelines.from_out_dir(str(tmp_path))
    s = [x for x in g.sentences if "FSDP" in x]
    assert s and s[0].startswith("kan 1x2: the data show no size where FSDP pays: no measured size: at the largest "
                                 "(10,000,000 parameters) FSDP's peak memory per process is 1.00x DDP's and its step "
                                 "1.30x")
    assert model_size.fsdp_table(size.with_data(size.data.iloc[:0])).empty


def test_a_memory_fit_that_does_not_grow_is_not_extrapolated():
    """A CPU process's resident set, which the framework dominates at small sizes, moves by noise: its fit
    would put the memory limit anywhere (a run here fitted -484 bytes per parameter)."""
    size = pd.DataFrame({"model": "kan", "n_params": [880, 10_000, 42_880],
                         "peak_mem_bytes": [5.02e8, 5.00e8, 5.01e8], "step_time_s": [0.002, 0.004, 0.009]})
    with pytest.raises(ValueError, match=r"peak memory of kan did not grow measurably \(by 5%\)"):
        model_size.memory_or_time_limit(size, 80 * 2**30, 1.0)
    size["peak_mem_bytes"] = [1e8, 2e8, 5e8]  # grows: the limit is extrapolated
    assert model_size.memory_or_time_limit(size, 80 * 2**30, 1.0)["limit"] in ("memory", "time")


def test_with_repeats_a_growth_inside_the_runs_noise_is_not_extrapolated():
    """Three default studies, one run per size: the KAN's resident set (its state grows by under 1 MB from 880 to
    42,880 parameters) "grew" 5% in one of them and a limit was extrapolated from it. With five runs per size the
    growth must also clear the runs: the largest size's interval above the smallest's."""
    size = pd.DataFrame({"model": "kan", "n_params": [880, 42_880], "n_runs": [5, 5],
                         "peak_mem_bytes": [4.70e8, 4.95e8], "peak_mem_lo": [4.60e8, 4.75e8],
                         "peak_mem_hi": [4.90e8, 5.20e8], "step_time_s": [0.002, 0.009],
                         "step_time_lo": [0.0019, 0.0085], "step_time_hi": [0.0021, 0.0095]})
    with pytest.raises(ValueError, match=r"peak memory of kan did not grow measurably \(by 5%\) with the parameter "
                                         r"count over the measured sizes \(880 to 42,880 parameters, beyond the 95% "
                                         r"intervals of their runs\)"):
        model_size.memory_or_time_limit(size, 80 * 2**30, 1.0)
    clear = size.assign(peak_mem_lo=[4.60e8, 4.91e8])  # the same medians, the intervals apart: it grew
    assert model_size.memory_or_time_limit(clear, 80 * 2**30, 1.0)["limit"] in ("memory", "time")
    one_run = size.assign(n_runs=[1, 1])  # no interval: decided on the medians, as before
    assert model_size.memory_or_time_limit(one_run, 80 * 2**30, 1.0)["limit"] in ("memory", "time")
    slow = clear.assign(step_time_lo=[0.0019, 0.0015], step_time_hi=[0.0021, 0.0095])  # step time within noise
    with pytest.raises(ValueError, match=r"^step time of kan did not grow measurably"):
        model_size.memory_or_time_limit(slow, 80 * 2**30, 1.0)


def test_model_size_figure_colours_match_in_all_four_panels(study_dir):
    fig = report.analyze(str(study_dir), "model_size").figures["memory_time"]
    by_panel = {}
    for t in traces_of(fig):
        by_panel.setdefault(t.xaxis, {})[t.legendgroup] = t.line.color
    assert len(by_panel) == 4
    assert all(p == {"kan": style.MODEL_COLORS["kan"], "mlp": style.MODEL_COLORS["mlp"]} for p in by_panel.values())
    widths = {t.legendgroup: t.line.width for t in traces_of(fig)}
    assert widths["kan"] > widths["mlp"]  # coinciding lines both stay visible


def test_model_size_findings_never_draw_one_line_through_ddp_and_fsdp(tmp_path):
    """Issue 34.6: the findings grouped by model and placement only, so "kan 1x2: 3.57 to 23.6 ms" ran from DDP at
    880 parameters to FSDP at 42,880, and the front page's step-time slope came from that mix; FSDP's answer was
    per model, pooling every placement and batch."""
    mixed = [rec(study="model_size", parallelism=par, world_size=2, nproc_per_node=2, global_batch=64,
                 widths=[2, p // 20, 1], n_params=p, peak_mem_bytes=1e8 + 16 * p, model_state_bytes=16 * p,
                 step_time_s=t, repeat=r)
             for par, pts in (("ddp", {880: 3.57e-3, 5_000: 4.0e-3}), ("fsdp", {10_000: 20e-3, 42_880: 23.6e-3}))
             for p, t in pts.items() for r in range(3)]
    write_records(tmp_path / "mixed", mixed)
    a = report.analyze(str(tmp_path / "mixed"), "model_size")
    [mem, time] = model_size.finding(a)[:2]
    assert "880 to 42,880" not in time["ours"] and "880 to 42,880" not in mem["ours"]
    assert "kan 1x2, parallelism=ddp: 3.57 to 4 ms from 880 to 5,000 parameters" in time["ours"]
    assert "kan 1x2, parallelism=fsdp: 20 to 23.6 ms from 10,000 to 42,880 parameters" in time["ours"]
    slopes = [np.log(4.0 / 3.57) / np.log(5_000 / 880), np.log(23.6 / 20) / np.log(42_880 / 10_000)]
    assert model_size.time_slope(a.table) == pytest.approx(np.median(slopes), rel=1e-3)
    # FSDP against DDP at two global batches: one answer per line of sizes, never pooled across batches
    two = fsdp_records() + [dict(r, global_batch=128) for r in fsdp_records(fsdp_bytes_per_param=16.0)]
    write_records(tmp_path / "two", two)
    g = guidelines.from_out_dir(str(tmp_path / "two"))
    rows = g.table[g.table["question"] == "1x2: model size from which FSDP lowers peak memory per process"]
    assert dict(zip(rows["group"], rows["value"].fillna(0))) == {"kan, global_batch=64": 1_000_000,
                                                                 "kan, global_batch=128": 0}
    fsdp = model_size.finding(report.analyze(str(tmp_path / "two"), "model_size"))[2]["ours"]
    assert "kan 1x2, global_batch=128: no measured size where FSDP pays" in fsdp
    assert "kan 1x2, global_batch=64: FSDP pays from 1,000,000 parameters" in fsdp
