"""Figures (one visual language, no lone points, no empty promises), the explorer, and the report
(findings first beside the published numbers, offline, relative links, readable tables)."""

import os
import re
import sys

import plotly.graph_objects as go
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_results import comm_records, guideline_records, rec, strong_records, weak_records, write_records  # noqa: E402

from kanlib import guidelines, plots, report, results  # noqa: E402


def size_records():
    out = []
    for model, k in (("kan", 1.0), ("mlp", 0.4)):
        for p in (1_000, 10_000, 100_000):
            out.append(rec(study="model_size", model=model, world_size=1, global_batch=64, widths=[2, p // 10, 1],
                           n_params=p, peak_mem_bytes=4e8 + 20 * p, model_state_bytes=16 * p,
                           step_time_s=k * (1e-3 + 1e-8 * p)))
    return out


def write_study(root):
    """Records of the four original studies (strong, weak, communication, model size) under ``root``."""
    recs = strong_records({"1x1": 8.0, "1x2": 4.4, "2x1": 5.0}) + strong_records({"1x1": 0.8, "1x2": 0.8}, batch=64)
    recs += weak_records("kan", {1: 1000, 2: 1600}) + weak_records("mlp", {1: 4000, 2: 7000})
    recs += comm_records("1x2") + comm_records("2x1", {1.0: (0.020, 0.010, 0.012), 25.0: (0.018, 0.010, 0.01)})
    recs += size_records()
    write_records(root, recs)
    return root


def write_new_studies(root):
    """The newer studies under ``root``: time to accuracy, compounding, FSDP, data-parallel options, and a
    collective benchmark with an emulated link and DDP runs that follow it."""
    from test_calibration_report import INJECTED, ddp_records, links, write_bench
    from test_study_tables import comp_rec, fsdp_records, options_records, tta_records

    recs = tta_records() + fsdp_records() + options_records("1x4")
    recs += [comp_rec(k, p, t, repeat=r) for k, ts in {"reference": {"1x1": 10.0, "1x2": 5.5},
                                                      "fast": {"1x1": 4.0, "1x2": 2.5}}.items()
             for p, t in ts.items() for r in range(2)]
    recs += ddp_records()
    write_records(root, recs)
    write_bench(root, "1x2", links())
    write_bench(root, "2x1", links())
    write_bench(root, "2x1", links(INJECTED), emulate_latency_s=INJECTED)
    return root


@pytest.fixture
def study_dir(tmp_path):
    return write_study(tmp_path)


@pytest.fixture
def full_study_dir(study_dir):
    """``study_dir`` plus the newer studies (:func:`write_new_studies`)."""
    return write_new_studies(study_dir)


def is_key(t):
    """A legend-key entry: one point at None (draws nothing)."""
    return t.x is not None and len(t.x) == 1 and t.x[0] is None


def without_scripts(text):
    return re.sub(r"<script[^>]*>.*?</script>", "", text, flags=re.S)


def traces_of(fig):
    return plots.data_traces(fig)


def n_points(t):
    return sum(v is not None for v in t.x)


def line_traces_have_two_points(fig):
    return all(n_points(t) >= 2 for t in traces_of(fig) if isinstance(t, go.Scatter) and "lines" in (t.mode or ""))


def model_colours(fig):
    """{model: {colours its data traces use}} from the legend group each data trace belongs to."""
    out = {}
    for t in traces_of(fig):
        c = t.line.color if isinstance(t, go.Scatter) and "lines" in (t.mode or "") else t.marker.color
        if isinstance(t, go.Scatter) and t.marker is not None and t.marker.line is not None and t.marker.line.color:
            c = t.marker.line.color if t.marker.color == "white" else c
        out.setdefault(t.legendgroup, set()).add(c)
    return out


def test_every_figure_keeps_one_colour_per_model_and_one_marker_per_placement(study_dir):
    figs = {s: report.analyze(str(study_dir), s).figures for s in report.STUDY_TITLES}
    for study, fs in figs.items():
        for name, fig in fs.items():
            if name.startswith("extrapolation"):
                continue
            for model, colours in model_colours(fig).items():
                if model == "ideal":
                    continue
                assert colours == {plots.model_color(model)}, (study, name, model, colours)
            assert line_traces_have_two_points(fig), (study, name)
            # one legend: only the key entries show in it, and every data trace hides its own entry
            assert all(t.showlegend is False for t in traces_of(fig) if t.name != "ideal"), (study, name)
    strong = figs["strong_scaling"]["speedup_efficiency"]
    symbols = {s for t in traces_of(strong) if t.name != "ideal" for s in t.marker.symbol}
    assert symbols == {"circle", "square", "diamond"}  # 1x1, 1x2, 2x1, in every subplot the same
    keys = [t.name for t in strong.data if is_key(t)]
    assert keys == ["model kan", "placement 1x1 (nodes x procs)", "placement 1x2 (nodes x procs)",
                    "placement 2x1 (nodes x procs)", "line: across nodes", "line: one node"]
    assert "diamond" not in strong.layout.title.text  # the caption never promises a marker
    assert plots.placement_symbol("2x1") == "diamond" and plots.model_color("mlp") == "#ff7f0e"


def test_figure_draws_no_marker_it_does_not_promise(tmp_path):
    write_records(tmp_path, strong_records({1: 8.0, 2: 4.4}))
    fig = report.analyze(str(tmp_path), "strong_scaling").figures["speedup_efficiency"]
    keys = [t.name for t in fig.data if is_key(t)]
    assert keys == ["model kan", "placement 1x1 (nodes x procs)", "placement 1x2 (nodes x procs)", "line: one node"]


def test_lone_points_are_not_drawn_and_the_caption_says_so(tmp_path):
    # weak scaling at N = 1, 2 only: E_w against the first multi-process point would be a lone dot
    write_records(tmp_path, weak_records("kan", {1: 1000, 2: 1600}) + strong_records({1: 8.0}, widths=[2, 4, 1])
                  + strong_records({1: 8.0, 2: 5.0}))
    a = report.analyze(str(tmp_path), "weak_scaling")
    fig = a.figures["throughput_efficiency"]
    assert not any("first multi-process" in (ann.text or "") for ann in fig.layout.annotations)
    assert "is not drawn: it needs two multi-process world sizes" in a.captions["throughput_efficiency"]
    s = report.analyze(str(tmp_path), "strong_scaling")
    assert "Not drawn (a single point is no line): kan (widths=[2, 4, 1]: one placement only)" in \
        s.captions["speedup_efficiency"]
    assert line_traces_have_two_points(s.figures["speedup_efficiency"])


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


def test_model_size_figure_colours_match_in_all_four_panels(study_dir):
    fig = report.analyze(str(study_dir), "model_size").figures["memory_time"]
    by_panel = {}
    for t in traces_of(fig):
        by_panel.setdefault(t.xaxis, {})[t.legendgroup] = t.line.color
    assert len(by_panel) == 4
    assert all(p == {"kan": plots.MODEL_COLORS["kan"], "mlp": plots.MODEL_COLORS["mlp"]} for p in by_panel.values())
    widths = {t.legendgroup: t.line.width for t in traces_of(fig)}
    assert widths["kan"] > widths["mlp"]  # coinciding lines both stay visible


def test_explorer_follows_its_study(study_dir):
    df = results.load_records(str(study_dir))
    comm = plots.explorer_options(df, "communication")
    assert comm["x"] == ["bucket_cap_mb"]  # N (2) and n_params are one value each there: not axes
    assert "comm_total_s" in comm["metrics"] and comm["models"] == ["kan"] and comm["sizes"] == [100]
    size = plots.explorer_options(df, "model_size")
    assert size["x"][0] == "n_params" and size["models"] == ["kan", "mlp"] and size["sizes"] == [1000, 10000, 100000]
    assert "comm_total_s" not in size["metrics"]  # never measured in that study
    w = plots.explorer(df, "strong_scaling")
    study_w, x_w, metric_w = w.children[0].children
    model_w, size_w = w.children[1].children
    assert study_w.value == "strong_scaling" and x_w.options == ("world_size", "global_batch", "local_batch")
    study_w.value = "model_size"  # the controls follow the chosen study
    assert x_w.value == "n_params" and model_w.options == ("kan", "mlp") and size_w.options == (1000, 10000, 100000)
    fig = plots.explorer_figure(df, "communication", "bucket_cap_mb")
    assert {t.name for t in fig.data} == {"kan 1x2 noop", "kan 1x2 timed", "kan 2x1 noop", "kan 2x1 timed"}
    with pytest.raises(ValueError, match="study: no records of 'nope'"):
        plots.explorer_options(df, "nope")


def test_offline_renderer_carries_the_mime_bundle_and_no_mathjax():
    import plotly.io as pio

    assert plots.use_offline_renderers() == "plotly_mimetype+kanlib_notebook"
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))
    bundle = pio._renderers.renderers._build_mime_bundle(fig.to_dict(), renderers_string=pio.renderers.default)
    assert "application/vnd.plotly.v1+json" in bundle and "text/html" in bundle
    assert "mathjax" not in bundle["text/html"].lower() and "cdn" not in bundle["text/html"].lower()


def test_report_findings_first_offline_and_relative(study_dir):
    g = guidelines.from_out_dir(str(study_dir))
    path = report.build_report(str(study_dir), guidelines=g)
    text = open(path).read()
    assert not re.search(r"<script[^>]+src=", text) and not re.search(r"<link[^>]+href=", text)
    assert "http" not in without_scripts(text) and not re.search(r"mathjax[^'\"]*\.js", text, re.I)
    body = text[text.index("<body>"):]
    # findings come first, beside the published numbers
    assert body.index("<h2>Findings</h2>") < body.index("Deployment guidelines") < body.index("Strong scaling (")
    for published in ("speedup 5.97x, efficiency 74.7% at 8 GPUs over 4 nodes", "1.3%-6.1%",
                      "a drop in efficiency from 1 to several GPUs, then stable", "parameters-per-byte"):
        assert published in body
    assert "1x2: speedup 1.82x [" in body and "2x1: speedup 1.60x [" in body
    assert "over 3 multi-process points efficiency ranges 50%-91%, rising with work per process at 1x2" in body
    assert "Communication overhead (exposed / step)" in body
    # readable tables with units, no raw floats
    assert "step time (ms)" in body and "efficiency" in body and not re.search(r"\d\.\d{6}e[+-]\d\d", body)
    # methods: machine, backend, torch, commit, repeats, the measurement doc
    for word in ("hosts", "backend", "torch", "commit (git)", "runs per point", "How each quantity is measured"):
        assert word in body
    # every link is relative to the report and exists (records, figures folder, docs)
    links = re.findall(r"href='([^'#][^']*)'", body)
    assert links and all(not os.path.isabs(p) for p in links)
    assert all(os.path.exists(os.path.join(os.path.dirname(path), p)) for p in links if not p.endswith("figures/"))
    assert any(p.endswith("docs/measurement.md") for p in links)
    assert str(study_dir) not in body  # no absolute path beside relative ones
    # every figure is drawn from inline plotly.js (studies without records, e.g. compounding here, draw none)
    assert body.count("Plotly.newPlot") == sum(len(a.figures) for a in report.analyses(str(study_dir)).values())
    assert "no records of study &#x27;compounding&#x27; under .<" in body


def test_report_captions_every_figure_and_table(full_study_dir):
    every = report.analyses(str(full_study_dir), bench_time_col="time_s")
    assert set(every) == set(report.STUDY_TITLES) | set(report.EXTRA_TITLES)
    for s, a in every.items():
        assert a.figures and set(a.captions) == set(a.figures), s
        assert set(a.table_captions) == set(a.tables), s
        assert all(c and c[0].isupper() for c in list(a.captions.values()) + list(a.table_captions.values())), s
    assert {"overhead", "collbench", "parity", "transfer_waiting", "options"} <= set(every["communication"].figures)
    assert set(every["model_size"].figures) == {"memory_time", "fsdp"}
    assert set(every["time_to_accuracy"].figures) == {"speedup"}  # no steps.csv here: no curves, and it says so
    assert any("have no steps.csv" in line for line in every["time_to_accuracy"].lines)


def test_report_findings_cover_the_new_studies(full_study_dir):
    found = {f["topic"]: f for f in report.findings(report.analyses(str(full_study_dir), bench_time_col="time_s"))}
    assert found["Time to the target validation loss"]["ours"].startswith(
        "strong (B=256) at 2x1: time-to-target speedup 1.60x [")
    assert "weak (64/process, lr_rule none) at 1x2: statistical efficiency 67%" in \
        found["Time to the target validation loss"]["ours"]
    assert found["Kernel speedup x DDP speedup"]["ours"].startswith("fast at 1x2: measured 4.00x vs product 4.55x")
    assert "powersgd rank 1 (1x4): step 0.88x, val loss +10.00% - harms convergence" in \
        found["Data-parallel options against plain DDP"]["ours"]
    assert found["FSDP against DDP: where sharding pays"]["ours"] == "kan: FSDP pays from 1,000,000 parameters"
    assert "recovered 5 ms" in found["Calibration: the link model on a known signal"]["ours"]
    assert found["The published setup predicted (speedup, efficiency, overhead)"]["published"].startswith("5.97x")
    assert "Model sizes above the target efficiency at scale" in found
    for f in found.values():
        assert f["published"], f["topic"]


def test_display_table_formats_units_and_intervals(study_dir):
    a = report.analyze(str(study_dir), "strong_scaling")
    t = a.summary()
    assert list(t.columns) == ["model", "global_batch", "placement", "runs", "step time (ms)", "speedup",
                               "efficiency", "Karp-Flatt serial fraction"]
    row = t[(t["global_batch"] == "512") & (t["placement"] == "1x2")].iloc[0]
    assert re.fullmatch(r"4\.44e\+03 \[[\d.e+]+, [\d.e+]+\]", row["step time (ms)"])
    assert re.fullmatch(r"1\.82x \[1\.\d\dx, 1\.\d\dx\]", row["speedup"])
    assert re.fullmatch(r"91% \[\d\d%, \d\d%\]", row["efficiency"])


def test_figures_save_as_offline_files(study_dir, tmp_path):
    a = report.analyze(str(study_dir), "strong_scaling")
    paths = a.save(str(tmp_path / "figures"))
    assert [os.path.basename(p) for p in paths] == ["strong_scaling_speedup_efficiency.html", "strong_scaling_work.html"]
    html = open(paths[0]).read()
    assert len(html) > 1_000_000 and not re.search(r"<script[^>]+src=", html)
    assert not re.search(r"mathjax[^'\"]*\.js", html, re.I)


def test_explorer_keeps_kernels_parallelisms_and_rules_apart(full_study_dir):
    df = results.load_records(str(full_study_dir))
    comp = plots.explorer_figure(df, "compounding")
    assert {t.name for t in comp.data} == {"kan 1x1 fast fast", "kan 1x1 reference reference", "kan 1x2 fast fast",
                                           "kan 1x2 reference reference"}
    size = plots.explorer_figure(df, "model_size")
    assert {"kan 1x2 ddp", "kan 1x2 fsdp"} <= {t.name for t in size.data}
    tta = plots.explorer_options(df, "time_to_accuracy")
    assert "time_to_target_s" in tta["metrics"] and tta["x"][0] == "world_size"
    assert {t.name for t in plots.explorer_figure(df, "time_to_accuracy", metric="time_to_target_s").data} == {
        "kan 1x1 linear", "kan 1x1 none", "kan 1x2 linear", "kan 1x2 none", "kan 2x1 none"}
