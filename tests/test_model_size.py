"""Model-size scaling: KAN beside a matched MLP per size, FSDP against DDP, and the guidelines on where memory
limits and where sharding pays."""

import numpy as np
import pandas as pd
import pytest

from synthetic import fsdp_records, rec, size_records, traces_of, write_records

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


CPU = {"on_gpu": False, "max_n": 2, "real_nodes": False}  # kanlib.front.machine's facts of a 2-core CPU host
NOT_HERE = "CPU, not GPUs; N <= 2 (paper: 8)"


def _judged(root, recs):
    write_records(root, recs)
    a = report.analyze(str(root), "model_size")
    return a, model_size.judge_memory(a, CPU, NOT_HERE), model_size.judge(a, CPU, NOT_HERE)


def test_parameters_per_byte_of_tensor_memory_are_decided_on_any_machine_the_step_time_is_not(tmp_path):
    """Issue 36, 2(b): on CPU peak memory was the process's resident set, flat with the size, so the whole model-size
    claim read "not comparable here". Parameters per byte of the tensor memory of a step (tensor_peak_bytes) are
    judged on their own, on any machine, along each line of four or more sizes (DDP and FSDP apart); the step time
    stays the hardware-dependent part."""
    sizes = (1_000, 10_000, 100_000, 1_000_000)
    fixed = size_records(sizes, tensor=lambda p: 2e5 + 16 * p, parallelism="ddp")  # a fixed cost amortised
    fsdp = size_records(sizes[:2], tensor=lambda p: 1e5 + 8 * p, parallelism="fsdp")  # two sizes: not judged
    a, memory, time = _judged(tmp_path / "rise", fixed + fsdp)
    assert memory["verdict"] == "confirmed"
    assert memory["number"].startswith(f"kan 1x1, parallelism=ddp: {1_000 / (2e5 + 16e3):.3g} to "
                                       f"{1e6 / (2e5 + 16e6):.3g} parameters per byte over 4 sizes")
    assert memory["why"].startswith("decides: whether parameters per byte of tensor memory rise with model size")
    assert "line(s) with fewer than 4 sizes not judged: kan 1x1, parallelism=fsdp, mlp 1x1, parallelism=fsdp" \
        in memory["why"]
    assert time["verdict"] == "not comparable here" and time["why"].startswith("decides: how the step time grows")
    d = a.table.data.set_index(["model", "parallelism", "n_params"])
    assert d.loc[("kan", "ddp", 1_000), "params_per_byte"] == pytest.approx(1_000 / (2e5 + 16e3))  # not the RSS
    assert set(d["per_byte_of"]) == {"tensor memory"}
    c = {c.title: c for c in model_size.CLAIMS}
    assert c["Model-size scaling: parameters per byte of tensor memory"].test_with == ""  # any machine decides it
    assert c["Model-size scaling: step time"].test_with  # the paper's cluster does

    # one size whose bytes grow faster than its parameters: parameters per byte fall there, on the KAN's line only
    falls = [dict(r, tensor_peak_bytes=3e7) if r["model"] == "kan" and r["n_params"] == 100_000 else r for r in fixed]
    _, memory, _ = _judged(tmp_path / "fall", falls)
    assert memory["verdict"] == "contradicted"
    assert "they fall between two sizes on kan 1x1" in memory["why"] and "mlp 1x1" not in memory["why"]


def test_without_four_sizes_or_tensor_memory_the_claim_is_untested_and_the_resident_set_is_named(tmp_path):
    a, memory, _ = _judged(tmp_path / "three", size_records(tensor=lambda p: 2e5 + 16 * p))
    assert memory["verdict"] == "untested" and memory["number"] == "tensor memory at 3 size(s) per line"
    assert "needs tensor memory (tensor_peak_bytes) at 4 or more sizes along a line of sizes" in memory["why"]
    old = size_records((1_000, 10_000, 100_000, 1_000_000), peak_mem_kind="cpu_peak_rss")  # before it was measured
    a, memory, _ = _judged(tmp_path / "old", old)
    assert memory["verdict"] == "untested" and memory["number"] == "no tensor memory recorded"
    assert set(a.table.data["per_byte_of"]) == {"resident set"}  # the fallback, named
    ours = model_size.finding(a)[0]["ours"]
    assert "parameters per byte of resident set" in ours and "per byte of the resident set is an artefact" in ours
    assert "(of the resident set)" in model_size.display_table(a.table)["params per byte"].iloc[0]
