"""The calibrated model in the analysis, from synthetic collective-benchmark and DDP records that follow a
known link model exactly: the fitted constants and their leave-one-out errors, the known-signal check, the
parity of every DDP run, transfer against waiting, the guidelines' extrapolation (and what they say
without benchmark records), the published setup, the extrapolation of notebook 06 and the report."""

import json
import os
import re
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_results import rec, write_records  # noqa: E402

from kanlib import commmodel as cm  # noqa: E402
from kanlib import guidelines, report  # noqa: E402

SIZES = [8 * 4 ** k for k in range(12)]  # 8 B .. 32 MiB
INTRA = (30e-6, 1e9)
INTER = (100e-6, 2e8)
INJECTED = 0.005


def links(extra_latency=0.0):
    return cm.LinkModel("ring", {"intra": cm.Link.given("intra", *INTRA),
                                 "inter": cm.Link.given("inter", INTER[0] + extra_latency, INTER[1])})


def write_bench(root, placement, model, sizes=SIZES, emulate_latency_s=0.0, name=None):
    n, p = (int(v) for v in placement.split("x"))
    w = n * p
    rows = []
    for s in sizes:
        t = float(model.time_s(s, n, p))
        rows.append({"size_bytes": s, "count": s // 4, "dtype": "float32", "n_iters": 10, "time_s": t,
                     "time_s_p10": t, "time_s_p90": 1.1 * t, "emulated_s": 0.0, "algbw_bytes_per_s": s / t,
                     "busbw_bytes_per_s": s / t * 2 * (w - 1) / w, "nccl_algo_used": None, "nccl_proto_used": None})
    name = name or f"coll-{placement}-{emulate_latency_s:g}"
    d = os.path.join(root, "collbench", name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "record.json"), "w") as f:
        json.dump({"schema_version": 2, "record_kind": "collbench", "status": "ok", "study": "collbench", "nnodes": n,
                   "nproc_per_node": p, "world_size": w, "placement": placement, "backend": "gloo", "device": "cpu",
                   "nccl_algo": "", "nccl_proto": "", "emulate_latency_s": emulate_latency_s,
                   "emulate_bandwidth_bytes_per_s": 0.0, "run_key": name, "repeat": 0, "rows": rows}, f)


def ddp_records(backward_s=0.004, compute_s=0.006, waiting_s=0.001):
    """Timed DDP runs and their no-op twins at 1x2 and 2x1, and 2x1 through the emulated link; exposed
    communication as the overlap model gives it for their buckets, hook times with ``waiting_s`` added."""
    out = []
    buckets = [400_000, 800_000, 800_000]
    for (nn, pp), lat in (((1, 2), 0.0), ((2, 1), 0.0), ((2, 1), INJECTED)):
        t = links(lat).time_s(np.asarray(buckets, float), nn, pp)
        ov = cm.overlap(buckets, backward_s, t)
        for r in range(2):
            common = dict(study="communication", world_size=nn * pp, nnodes=nn, nproc_per_node=pp, global_batch=64,
                          bucket_cap_mb=0.5, n_params=500_000, backend="gloo", device="cpu", repeat=r,
                          widths=[2, 8, 1], grid_size=3, final_val_loss=0.1)
            out.append(rec(comm_hook="timed", step_time_s=compute_s + ov["exposed_s"], emulate_latency_s=lat,
                           backward_s=backward_s + ov["exposed_s"], comm_total_s=ov["transfer_s"] + waiting_s,
                           bucket_bytes=buckets, n_buckets=3, run_key=f"timed{nn}{pp}{lat}{r}",
                           emulated_s=3 * 2 * lat if lat else None, **common))
            if not lat:
                out.append(rec(comm_hook="noop", step_time_s=compute_s, backward_s=backward_s,
                               run_key=f"noop{nn}{pp}{r}", **common))
    return out


@pytest.fixture
def calibrated(tmp_path):
    write_bench(tmp_path, "1x2", links())
    write_bench(tmp_path, "2x1", links())
    write_bench(tmp_path, "2x1", links(INJECTED), emulate_latency_s=INJECTED)
    recs = ddp_records()
    # single-process and 2-process strong-scaling runs: a compute profile and measured points to overlay
    for w, t in ((1, 0.010), (2, 0.0056)):
        recs += [rec(world_size=w, nproc_per_node=w, global_batch=512, n_params=1_000, widths=[2, 8, 1], grid_size=5,
                     step_time_s=t * (1 + 0.01 * r), backward_s=0.6 * t, repeat=r) for r in range(3)]
    write_records(tmp_path, recs)
    return tmp_path


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
    pr = guidelines.calibrated_prediction(
        *[d[(d["placement"] == "1x2") & (d["comm_hook"] == h)] for d in [_records(calibrated)] for h in ("timed", "noop")],
        cm.fit_collbench(cm_bench(calibrated)), 0.8)
    assert pr["prediction"]["efficiency"].iloc[0] == pytest.approx(1.0) and pr["n_buckets"] == 3
    # the prediction at the measured placement is the measured point (the records follow the model)
    at2 = pr["prediction"].set_index("world_size").loc[2]
    assert at2["step_time_s"] == pytest.approx(0.006 + cm.overlap([400_000, 800_000, 800_000], 0.004, links().time_s(
        np.array([400_000, 800_000, 800_000], float), 1, 2))["exposed_s"], rel=1e-6)


def _records(root):
    from kanlib import results

    return results._placement_cols(results.load_records(str(root), study="communication"))


def cm_bench(root):
    from kanlib import collbench

    return collbench.load_bench(str(root))


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


def test_report_has_the_calibration_published_setup_and_extrapolation(calibrated):
    g = guidelines.from_out_dir(str(calibrated))
    path = report.build_report(str(calibrated), guidelines=g, bench_time_col="time_s")
    body = open(path).read()
    body = body[body.index("<body>"):]
    assert "Calibration: the link model on a known signal" in body
    assert re.search(r"injected latency 5 ms, recovered 5 ms \([+-]0\.00%, within 20%: yes\)", body)
    for title in report.EXTRA_TITLES.values():
        assert f"<h2>{title}</h2>" in body
    assert "5.97x / 74.7% / 1.3-6.1% measured on the published cluster" in body
    n_figures = sum(len(a.figures) for a in report.analyses(str(calibrated), bench_time_col="time_s").values())
    assert body.count("Plotly.newPlot") == n_figures
    assert "collbench: 3 records" in body  # the benchmark's raw records are linked too
    assert str(calibrated) not in body


def test_analysis_parameters_are_checked(calibrated):
    with pytest.raises(ValueError, match="^bench_time_cols: not a parameter of the analyses; known: bench_time_col"):
        report.analyze(str(calibrated), "communication", bench_time_cols="time_s")
    with pytest.raises(ValueError, match="^bench_time_col: 'time_s_p50' is not a collbench column"):
        report.analyze(str(calibrated), "communication", bench_time_col="time_s_p50")


def test_figures_draw_what_their_captions_promise(calibrated, tmp_path):
    from kanlib import plots

    a = report.analyze(str(calibrated), "communication", bench_time_col="time_s")
    bench = a.figures["collbench"]
    fits = [t for t in bench.data if (t.name or "").startswith("fit ")]
    assert len(fits) == 3  # a dotted fitted line per multi-process series
    emulated = [t for t in plots.data_traces(bench) if "emulated" in (t.name or "") and not t.name.startswith("fit ")]
    assert emulated and all(t.line.color == plots.LINK_COLORS["emulated"] for t in emulated)
    keys = {t.name for t in bench.data if t.x is not None and len(t.x) == 1 and t.x[0] is None}
    assert {"colour: emulated", "colour: no emulation", "dotted: the fitted model"} <= keys
    parity = a.figures["parity"]
    pts = [t for t in plots.data_traces(parity) if t.mode == "markers"]
    assert sum(len(t.x) for t in pts) == 2 * 6  # six runs, in both panels
    for t in pts:  # on the diagonal: the records follow the model
        assert list(t.x) == pytest.approx(list(t.y), rel=1e-6)
    # an option that harms convergence gets the red outline, the others none
    from test_study_tables import options_records

    write_records(tmp_path, options_records())
    fig = report.analyze(str(tmp_path), "communication").figures["options"]
    (t, *_), = [[t for t in plots.data_traces(fig) if t.xaxis == "x3"]]
    harm = {o: w for o, w in zip(t.x, t.marker.line.width)}
    assert harm["powersgd rank 1"] == 3 and harm["bf16"] == 0
