"""The calibrated link model in the analysis, from synthetic collective-benchmark and DDP records that follow a
known link model exactly: the fitted constants and their leave-one-out errors, the known-signal check, the
parity of every DDP run, transfer against waiting, the guidelines' extrapolation (and what they say without
benchmark records)."""

import re

import numpy as np
import pytest

from synthetic import SIZES, ddp_records, links, options_records, write_bench, write_records

from kanlib import guidelines, report
from kanlib.analysis import commmodel as cm
from kanlib.analysis import groups, load, style
from kanlib.studies import calibration, communication


def test_communication_analysis_fits_the_benchmark_and_checks_the_known_signal(calibrated):
    a = report.analyze(str(calibrated), "communication", bench_time_col="time_s")
    assert {"overhead", "collbench", "parity", "transfer_waiting"} <= set(a.figures)
    assert set(a.captions) == set(a.figures)
    lk = a.tables["links"].set_index(["emulated link", "link"])
    assert lk.loc[("none", "intra"), "latency (us)"].startswith("30 (+-")
    assert lk.loc[("none", "inter"), "latency (us)"].startswith("100 (+-")
    assert lk.loc[("none", "inter"), "bandwidth (GB/s)"].startswith("0.2 (+-")
    assert lk.loc[("5000 us", "inter+emulated"), "latency (us)"].startswith("5.1e+03")
    # every benchmark point has its leave-one-out error, in both fits
    assert len(a.tables["points"]) == 4 * len(SIZES) and (a.tables["points"]["leave-one-out error"] != "n/a").all()
    cal = a.tables["calibration"].iloc[0]
    assert (cal["constant"], cal["injected"], cal["recovered"], cal["within 20%"]) == ("latency", "5 ms", "5 ms", "yes")
    assert any(s.startswith("Known-signal check (gloo, ring): injected latency 5 ms, recovered 5 ms") for s in a.lines)
    parity = a.extra["parity"]
    assert sorted(parity["placement"]) == ["1x2", "1x2", "2x1", "2x1", "2x1", "2x1"]
    assert parity["step_rel_err"].abs().max() < 1e-6  # the records follow the model exactly
    tw = a.extra["transfer_waiting"].set_index("placement")
    assert tw["waiting_s"].to_numpy() == pytest.approx([0.001] * 3)
    assert list(tw.index) == ["1x2, 0.5 MiB", "2x1, 0.5 MiB", "2x1, 0.5 MiB, emulated 5000 us"]  # never pooled
    grow = a.tables["emulation"].iloc[0]
    assert grow["placement"] == "2x1" and grow["injected (ms)"] == "30"


def test_unresolved_constants_are_named_never_zero(tmp_path):
    write_bench(tmp_path, "1x2", links(), sizes=[8, 16, 32, 64])  # latency-bound: no bandwidth in these sizes
    write_records(tmp_path, ddp_records())
    a = report.analyze(str(tmp_path), "communication", bench_time_col="time_s")
    bw = a.tables["links"]["bandwidth (GB/s)"].iloc[0]
    assert bw.startswith("not resolved: ") and not re.search(r"(^|\s)0(\.0+)?( |$)", bw)
    parity = a.extra["parity"].set_index("placement")
    assert "no 'inter' link" in parity.loc["2x1", "why"].iloc[0]  # measured no 2x1: said, not guessed


def test_without_benchmark_records_nothing_is_fitted_and_it_is_said(tmp_path):
    write_records(tmp_path, ddp_records())
    a = report.analyze(str(tmp_path), "communication")
    assert "collbench" not in a.figures and "links" not in a.tables
    assert a.lines[0].startswith("No collective-benchmark records under this folder: the link model is not fitted")
    g = guidelines.from_out_dir(str(tmp_path))
    model_rows = g.table[g.table["basis"] == "communication model"]
    assert len(model_rows) == 3 and model_rows["answer"].str.startswith("not predicted: no collective-benchmark").all()
    assert sum("the calibrated model is not fitted" in s for s in g.sentences) == 1


def test_guidelines_extrapolate_with_the_calibrated_model(calibrated):
    g = guidelines.from_out_dir(str(calibrated), bench_time_col="time_s")
    rows = g.table[g.table["basis"] == "communication model"].set_index("question")["answer"]
    assert set(rows.index) == {"1x2: predicted largest world size with efficiency >= 0.8",
                               "2x1: predicted largest world size with efficiency >= 0.8"}
    assert all("calibrated model; intra 30 us, 1 GB/s; inter 100 us, 0.2 GB/s" in v for v in rows
               if "emulated" not in v)
    pr = cm.calibrated_prediction(
        *[d[(d["placement"] == "1x2") & (d["comm_hook"] == h)] for d in [_records(calibrated)] for h in ("timed", "noop")],
        cm.fit_collbench(cm_bench(calibrated)), 0.8)
    assert pr["prediction"]["efficiency"].iloc[0] == pytest.approx(1.0) and pr["n_buckets"] == 3
    # the prediction at the measured placement is the measured point (the records follow the model)
    at2 = pr["prediction"].set_index("world_size").loc[2]
    assert at2["step_time_s"] == pytest.approx(0.006 + cm.overlap([400_000, 800_000, 800_000], 0.004, links().time_s(
        np.array([400_000, 800_000, 800_000], float), 1, 2))["exposed_s"], rel=1e-6)


def _records(root):
    return groups.with_placement(load.load_records(str(root), study="communication"))


def cm_bench(root):
    return load.load_bench(str(root))


def test_analysis_parameters_are_checked(calibrated):
    with pytest.raises(ValueError, match="^bench_time_cols: not a parameter of the analyses; known: bench_time_col"):
        report.analyze(str(calibrated), "communication", bench_time_cols="time_s")
    with pytest.raises(ValueError, match="^bench_time_col: 'time_s_p50' is not a collbench column"):
        report.analyze(str(calibrated), "communication", bench_time_col="time_s_p50")


def test_figures_draw_what_their_captions_promise(calibrated, tmp_path):
    a = report.analyze(str(calibrated), "communication", bench_time_col="time_s")
    bench = a.figures["collbench"]
    fits = [t for t in bench.data if (t.name or "").startswith("fit ")]
    assert len(fits) == 3  # a dotted fitted line per multi-process series
    emulated = [t for t in style.data_traces(bench) if "emulated" in (t.name or "") and not t.name.startswith("fit ")]
    assert emulated and all(t.line.color == calibration.LINK_COLORS["emulated"] for t in emulated)
    keys = {t.name for t in bench.data if t.x is not None and len(t.x) == 1 and t.x[0] is None}
    assert {"colour: emulated", "colour: no emulation", "dotted: the fitted model"} <= keys
    parity = a.figures["parity"]
    pts = [t for t in style.data_traces(parity) if t.mode == "markers"]
    loo = [t for t in pts if t.name != "link model alone"]
    assert sum(len(t.x) for t in loo) == 2 * 6  # six runs, in both panels, each predicted by a fit without it
    assert sum(len(t.x) for t in pts if t.name == "link model alone") == 2 * 6  # beside the link model alone
    for t in pts:  # on the diagonal: the records follow the model
        assert list(t.x) == pytest.approx(list(t.y), rel=1e-6)
    # an option that harms convergence gets the red outline, the others none
    write_records(tmp_path, options_records())
    fig = report.analyze(str(tmp_path), "communication").figures["options"]
    (t, *_), = [[t for t in style.data_traces(fig) if t.xaxis == "x3"]]
    harm = {o: w for o, w in zip(t.x, t.marker.line.width)}
    assert harm["powersgd rank 1"] == 3 and harm["bf16"] == 0
