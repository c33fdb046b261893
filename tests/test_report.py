"""Figures (one visual language, no lone points, no empty promises), the explorer, and the report
(findings first beside the published numbers, offline, relative links, readable tables; the records read once,
the link model fitted once)."""

import os
import re

import plotly.graph_objects as go
import pytest

from synthetic import (is_key, line_traces_have_two_points, model_colours, strong_records, traces_of, weak_records,
                       without_scripts, write_records)

from kanlib import front, guidelines, report, studies
from kanlib.analysis import explorer, load, style


def test_every_figure_keeps_one_colour_per_model_and_one_marker_per_placement(study_dir):
    figs = {s: report.analyze(str(study_dir), s).figures for s in studies.record_sections()}
    for study, fs in figs.items():
        for name, fig in fs.items():
            if name.startswith("extrapolation"):
                continue
            for model, colours in model_colours(fig).items():
                if model == "ideal":
                    continue
                assert colours == {style.model_color(model)}, (study, name, model, colours)
            assert line_traces_have_two_points(fig), (study, name)
            # one legend: only the key entries show in it, and every data trace hides its own entry
            assert all(t.showlegend is False for t in traces_of(fig) if t.name != "ideal"), (study, name)
    strong = figs["strong_scaling"]["speedup_efficiency"]
    symbols = {s for t in traces_of(strong) if t.name != "ideal" for s in t.marker.symbol}
    assert symbols == {"circle", "square", "diamond"}  # 1x1, 1x2, 2x1, in every subplot the same
    keys = [t.name for t in strong.data if is_key(t)]
    assert keys == ["model kan", "placement 1x1 (nodes x procs)", "placement 1x2 (nodes x procs)",
                    "placement 2x1 (nodes x procs)", "line: across nodes", "line: one node",
                    "long dashes: target efficiency 80% (guidelines)"]
    assert "diamond" not in strong.layout.title.text  # the caption never promises a marker
    assert style.placement_symbol("2x1") == "diamond" and style.model_color("mlp") == "#ff7f0e"


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


def test_explorer_follows_its_study(study_dir):
    df = load.load_records(str(study_dir))
    comm = explorer.explorer_options(df, "communication", studies.views())
    assert comm["x"] == ["bucket_cap_mb"]  # N (2) and n_params are one value each there: not axes
    assert "comm_total_s" in comm["metrics"] and comm["models"] == ["kan"] and comm["sizes"] == [100]
    size = explorer.explorer_options(df, "model_size", studies.views())
    assert size["x"][0] == "n_params" and size["models"] == ["kan", "mlp"] and size["sizes"] == [1000, 10000, 100000]
    assert "comm_total_s" not in size["metrics"]  # never measured in that study
    w = explorer.explorer(df, "strong_scaling", studies.views())
    study_w, x_w, metric_w = w.children[0].children
    model_w, size_w = w.children[1].children
    assert study_w.value == "strong_scaling" and x_w.options == ("world_size", "global_batch", "local_batch")
    study_w.value = "model_size"  # the controls follow the chosen study
    assert x_w.value == "n_params" and model_w.options == ("kan", "mlp") and size_w.options == (1000, 10000, 100000)
    fig = explorer.explorer_figure(df, "communication", "bucket_cap_mb", views=studies.views())
    assert {t.name for t in fig.data} == {"kan 1x2 comm_hook=noop", "kan 1x2 comm_hook=timed", "kan 2x1 comm_hook=noop",
                                          "kan 2x1 comm_hook=timed"}
    with pytest.raises(ValueError, match="study: no records of 'nope'"):
        explorer.explorer_options(df, "nope", studies.views())


def test_offline_renderer_carries_the_mime_bundle_and_no_mathjax():
    import plotly.io as pio

    assert style.use_offline_renderers() == "plotly_mimetype+kanlib_notebook"
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
    # the bottom line and the verdicts come first, then the table of contents, every finding beside the published
    # numbers, the guidelines, the studies, the glossary
    assert body.index("id='bottom-line'") < body.index("id='verdicts'") < body.index("id='toc'") \
        < body.index("<h2>All findings beside the published study</h2>") < body.index("<h2>Deployment guidelines") \
        < body.index("<h2>Strong scaling (") < body.index("<h2>Glossary</h2>")
    # every section is in the contents and folded but the first screen's and the guidelines
    toc = body[body.index("id='toc'"):body.index("</nav>")]
    for anchor in re.findall(r"<section id='([^']+)'>", body):
        assert f"href='#{anchor}'" in toc, anchor
    assert re.findall(r"<section id='([^']+)'><details class='section' open>", body) == ["front", "guidelines"]
    for published in ("speedup 5.97x, efficiency 74.7% at 8 GPUs over 4 nodes", "1.3%-6.1%",
                      "a drop in efficiency from 1 to several GPUs, then stable", "parameters-per-byte"):
        assert published in body
    assert "1x2: speedup 1.82x (3 runs)" in body and "2x1: speedup 1.60x (3 runs)" in body  # too few for intervals
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
    # the docs lie outside the report's folder here: named, not linked (a ../ link breaks when the report travels)
    assert not any(p.endswith("docs/measurement.md") for p in links)
    assert "docs/measurement.md in the kanlib repository" in body
    assert str(study_dir) not in body  # no absolute path beside relative ones
    # every figure is drawn from inline plotly.js (studies without records, e.g. compounding here, draw none)
    assert body.count("Plotly.newPlot") == sum(len(a.figures) for a in report.analyses(str(study_dir)).values())
    assert "no records of study &#x27;compounding&#x27; under .<" in body


def test_report_captions_every_figure_and_table(full_study_dir):
    every = report.analyses(str(full_study_dir), bench_time_col="time_s")
    assert set(every) == set(studies.sections())
    for s, a in every.items():
        assert a.figures and set(a.captions) == set(a.figures), s
        assert set(a.table_captions) == set(a.tables), s
        assert all(c and c[0].isupper() for c in list(a.captions.values()) + list(a.table_captions.values())), s
    assert {"overhead", "collbench", "parity", "transfer_waiting", "options"} <= set(every["communication"].figures)
    assert set(every["model_size"].figures) == {"memory_time", "fsdp"}
    assert set(every["time_to_accuracy"].figures) == {"speedup"}  # no steps.csv here: no curves, and it says so
    assert any("have no steps.csv" in line for line in every["time_to_accuracy"].lines)


def test_report_findings_cover_the_new_studies(full_study_dir):
    found = {f["topic"]: f for f in front.findings(report.analyses(str(full_study_dir), bench_time_col="time_s"))}
    assert found["Time to the target validation loss"]["ours"].startswith(
        "strong (B=256) at 2x1: time-to-target speedup 1.60x [")
    assert "weak (64/process, lr_rule none) at 1x2: statistical efficiency 67%" in \
        found["Time to the target validation loss"]["ours"]
    assert found["Kernel speedup x DDP speedup"]["ours"].startswith("fast at 1x2: measured 4.00x vs product 4.55x")
    assert "powersgd rank 1 (1x4): step 1.14x faster, val loss +10.00% - harms convergence" in \
        found["Data-parallel options against plain DDP"]["ours"]
    assert found["FSDP against DDP: where sharding pays"]["ours"] == "kan 1x2: FSDP pays from 1,000,000 parameters"
    assert "recovered 5 ms" in found["Calibration: the link model on a known signal"]["ours"]
    assert found["The published setup predicted (speedup, efficiency, overhead)"]["published"].startswith("5.97x")
    assert "Model sizes above the target efficiency at scale" in found
    for f in found.values():
        assert f["published"], f["topic"]


def test_figures_save_as_offline_files(study_dir, tmp_path):
    a = report.analyze(str(study_dir), "strong_scaling")
    paths = a.save(str(tmp_path / "figures"))
    assert [os.path.basename(p) for p in paths] == ["strong_scaling_speedup_efficiency.html", "strong_scaling_work.html"]
    html = open(paths[0]).read()
    assert len(html) > 1_000_000 and not re.search(r"<script[^>]+src=", html)
    assert not re.search(r"mathjax[^'\"]*\.js", html, re.I)


def test_explorer_keeps_kernels_parallelisms_and_rules_apart(full_study_dir):
    df = load.load_records(str(full_study_dir))
    comp = explorer.explorer_figure(df, "compounding", views=studies.views())
    assert {t.name for t in comp.data} == {"kan 1x1 kan_impl=fast, kan_path=fast",
                                           "kan 1x1 kan_impl=reference, kan_path=reference",
                                           "kan 1x2 kan_impl=fast, kan_path=fast",
                                           "kan 1x2 kan_impl=reference, kan_path=reference"}
    size = explorer.explorer_figure(df, "model_size", views=studies.views())
    assert {"kan 1x2 parallelism=ddp", "kan 1x2 parallelism=fsdp"} <= {t.name for t in size.data}
    tta = explorer.explorer_options(df, "time_to_accuracy", studies.views())
    assert "time_to_target_s" in tta["metrics"] and tta["x"][0] == "world_size"
    # the strong series (global batch 256) and the weak one (64 per process) are apart at 1x1, as in the table
    assert {t.name for t in explorer.explorer_figure(df, "time_to_accuracy", metric="time_to_target_s",
                                                     views=studies.views()).data} == {
        "kan 1x1 lr_rule=linear, global_batch=64", "kan 1x1 lr_rule=none, global_batch=256",
        "kan 1x1 lr_rule=none, global_batch=64", "kan 1x2 lr_rule=linear, global_batch=128",
        "kan 1x2 lr_rule=none, global_batch=128", "kan 1x2 lr_rule=none, global_batch=256",
        "kan 2x1 lr_rule=none, global_batch=256"}


def test_report_has_the_calibration_published_setup_and_extrapolation(calibrated):
    g = guidelines.from_out_dir(str(calibrated))
    path = report.build_report(str(calibrated), guidelines=g, bench_time_col="time_s")
    body = open(path).read()
    body = body[body.index("<body>"):]
    assert "Calibration: the link model on a known signal" in body
    assert re.search(r"injected latency 5 ms, recovered 5 ms \([+-]0\.00%, within 20%: yes\)", body)
    for title in [t for s, t in studies.titles().items() if s not in studies.record_sections()]:
        assert f"<h2>{title}</h2>" in body
    assert "5.97x / 74.7% / 1.3-6.1% measured on the published cluster" in body
    n_figures = sum(len(a.figures) for a in report.analyses(str(calibrated), bench_time_col="time_s").values())
    advice = body[body.index("<section id='advisor'>"):body.index("<section id='strong_scaling'>")]
    assert advice.count("Plotly.newPlot") == 1  # what the study predicts on other links
    assert body.count("Plotly.newPlot") == n_figures + 1
    assert "collbench: 3 records" in body  # the benchmark's raw records are linked too
    assert str(calibrated) not in body


def test_a_report_build_reads_each_record_once_and_fits_the_link_model_once(calibrated, monkeypatch):
    """Every record.json is opened once per build (however many sections, findings, methods and guidelines read
    the records), and the link model is fitted once; with the guidelines computed first on the same folder, the
    report reuses what they read."""
    import builtins

    from kanlib.analysis import commmodel

    opened, fitted = [], []
    real_open, real_fit = builtins.open, commmodel.fit_collbench

    def counting_open(file, *args, **kwargs):
        if str(file).endswith("record.json"):
            opened.append(os.path.abspath(str(file)))
        return real_open(file, *args, **kwargs)

    def counting_fit(*args, **kwargs):
        fitted.append(1)
        return real_fit(*args, **kwargs)

    files = sorted(load.find_record_files(str(calibrated)))
    assert any("collbench" in f for f in files) and any("strong_scaling" in f for f in files)
    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(commmodel, "fit_collbench", counting_fit)
    report.build_report(str(calibrated))
    assert sorted(opened) == files and len(fitted) == 1
    opened.clear(), fitted.clear()
    g = guidelines.from_out_dir(str(calibrated))  # notebook 05: the guidelines, then the report
    report.build_report(str(calibrated), guidelines=g)
    assert sorted(opened) == files and len(fitted) == 1


def test_explorer_median_never_pools_two_groups_of_a_table(full_study_dir):
    """Issue 22.7: each median the explorer draws is the median of one point a table keeps apart (records equal
    in every configuration field that varies, placement included, but the repeat): notebook 01's two work sizes
    (global batch 8192 and 512) and notebook 03's runs with and without the emulated link are lines of their own,
    never one pooled median."""
    import numpy as np

    from kanlib.analysis import groups

    write_records(full_study_dir, strong_records({"1x1": 0.35, "1x2": 0.2}, repeats=4, batch=8192,
                                                 widths=[32, 128, 1]))
    df = load.load_records(str(full_study_dir))
    for study in ("strong_scaling", "communication"):
        sub = groups.with_placement(df[df["study"] == study])
        fields = groups.design(sub, study, axes=()).groups + ["placement"]
        medians = {}  # world size -> the median step time of every point there
        for key, g in groups.groupby(sub, fields):
            medians.setdefault(int(g["world_size"].iloc[0]), []).append(float(np.median(g["step_time_s"])))
        fig = explorer.explorer_figure(df, study, views=studies.views())
        for t in fig.data:
            for x, y in zip(t.x, t.y):
                assert any(np.isclose(m, y, rtol=1e-12) for m in medians[int(x)]), (study, t.name, x, y)


def test_explorer_draws_every_x_it_offers(full_study_dir):
    """The explorer offers per-process batch (``local_batch``, made from the records for the x axis) for weak
    scaling and time to accuracy; choosing it raised KeyError ("['local_batch'] not in index"), and a study whose
    multi-process weak runs were all disturbed (run Z4: a CPU hog; one world size left) opened on it, so make study
    stopped in notebook 02's analysis. Every study draws for every x it offers, with and without that."""
    import pandas as pd

    write_records(full_study_dir, weak_records(b=256))  # a second per-process batch
    df = load.load_records(str(full_study_dir))
    views = studies.views()
    weak = df[df["study"] == "weak_scaling"]
    one_size = pd.concat([df[df["study"] != "weak_scaling"], weak[weak["world_size"] == weak["world_size"].min()]])
    for frame in (df, one_size):
        for study in sorted(frame["study"].unique()):
            for x in explorer.explorer_options(frame, study, views)["x"]:
                fig = explorer.explorer_figure(frame, study, x=x, views=views)
                assert fig.data, (study, x)
    assert explorer.explorer_options(one_size, "weak_scaling", views)["x"] == ["local_batch"]


def test_front_page_gives_a_verdict_per_published_claim_and_describes_the_machine(full_study_dir):
    write_records(full_study_dir, [dict(strong_records({"1x2": 6.0}, repeats=1)[0], foreign_cpu_frac=0.4,
                                        interference_window_s=5.0, repeat=7)])
    g = guidelines.from_out_dir(str(full_study_dir))
    all_a = report.analyses(str(full_study_dir), ctx=g.context)
    vs = front.verdicts(all_a, g, str(full_study_dir), g.context)
    assert [v["claim"] for v in vs] == [c.title for c in front.published_claims()]
    assert all(v["verdict"] in front.VERDICTS for v in vs)
    by = {v["claim"]: v for v in vs}
    # CPU processes, N <= 4, 2x1 is two launches on one host: the 8-GPU claim is not comparable here
    assert by["Strong scaling"]["verdict"] == "not comparable here" and "CPU" in by["Strong scaling"]["why"]
    # the model-size claim in two parts: the step time needs the paper's GPUs; parameters per byte of tensor memory
    # any machine decides, here untested (the synthetic records predate tensor_peak_bytes)
    assert by["Model-size scaling: step time"]["verdict"] == "not comparable here"
    assert by["Model-size scaling: parameters per byte of tensor memory"]["verdict"] == "untested"
    body = open(report.build_report(str(full_study_dir), guidelines=g)).read()
    first = body[body.index("id='front'"):body.index("id='stability'")]
    assert "id='verdicts'" in first and "id='own-findings'" in first and "loopback" in first
    assert "1 run(s) disturbed (left out; named under Stability)" in first
    assert "Step time against model size" in body and "time scales unfavourably" in body
    stab = body[body.index("id='stability'"):body.index("id='findings'")]
    assert "disturbed run(s) left out" in stab and "too few repeats" in stab
    assert "CUDA / NCCL" not in body  # a CPU study records no CUDA


def test_readme_results_are_generated_from_the_outputs_and_checked(study_dir, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# kanlib\n\nintro\n\n{report.README_START}\nold numbers\n{report.README_END}\n\nusage\n")
    assert report.main([str(study_dir), "--check-readme", str(readme)]) == 1
    report.write_readme(str(study_dir), str(readme))
    text = readme.read_text()
    assert text.startswith("# kanlib\n\nintro\n") and text.endswith("\n\nusage\n") and "old numbers" not in text
    assert "| Strong scaling |" in text and "**not comparable here**" in text
    assert report.main([str(study_dir), "--check-readme", str(readme)]) == 0
    readme.write_text(text.replace("| Strong scaling |", "| Strong scaling (edited) |"))
    assert report.main([str(study_dir), "--check-readme", str(readme)]) == 1
    with pytest.raises(ValueError, match="no results markers"):
        (tmp_path / "bare.md").write_text("# nothing\n")
        report.write_readme(str(study_dir), str(tmp_path / "bare.md"))


def test_readme_options_refuse_a_readme_without_markers_before_writing_anything(study_dir, tmp_path, capsys):
    """Issue 34.11: --readme on a README without markers wrote report.html, then raised ValueError; --check-readme
    said 'its results are not those of OUT' instead of naming the missing markers."""
    bare = tmp_path / "bare.md"
    bare.write_text("# nothing\n")
    assert report.main([str(study_dir), "--readme", str(bare)]) == 2
    err = capsys.readouterr().err
    assert f"{bare}: no results markers {report.README_START} and {report.README_END}" in err
    assert not (study_dir / "report.html").exists() and bare.read_text() == "# nothing\n"  # nothing written
    half = tmp_path / "half.md"
    half.write_text(f"# half\n{report.README_START}\nold\n")
    assert report.main([str(study_dir), "--check-readme", str(half)]) == 2
    out = capsys.readouterr()
    assert f"{half}: no results marker {report.README_END};" in out.err and "not those of" not in out.out
    backwards = tmp_path / "backwards.md"
    backwards.write_text(f"{report.README_END}\n{report.README_START}\n")
    assert report.main([str(study_dir), "--readme", str(backwards)]) == 2
    assert "end marker <!-- results:end --> comes before its start marker" in capsys.readouterr().err
    assert not (study_dir / "report.html").exists()


def test_readme_options_on_a_missing_readme_exit_2_with_a_clear_error(study_dir, tmp_path):
    """Issue 34.11: a missing README raised FileNotFoundError (a traceback)."""
    import subprocess
    import sys

    for option in ("--readme", "--check-readme"):
        run = subprocess.run([sys.executable, "-m", "kanlib.report", str(study_dir), option,
                              str(tmp_path / "NOPE.md")], capture_output=True, text=True, timeout=300)
        assert run.returncode == 2, run.stderr
        assert "Traceback" not in run.stderr and f"{tmp_path / 'NOPE.md'}: no such file" in run.stderr
    assert not (study_dir / "report.html").exists() and not (tmp_path / "NOPE.md").exists()


def test_the_report_cli_without_plotly_says_what_to_install(study_dir, tmp_path):
    """Issue 34.10: the report draws the studies' figures, so it needs plotly (the notebooks extra): without it, a
    clear error and exit 2, not a traceback, and nothing written."""
    import os
    import subprocess
    import sys

    site = tmp_path / "no_plotly"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['plotly'] = None  # import plotly fails\n")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-m", "kanlib.report", str(study_dir)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), repo])})
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "making a figure needs plotly, which kanlib's notebooks extra installs (pip install 'kanlib[notebooks]')" \
        in run.stderr
    assert not (study_dir / "report.html").exists()


def test_readme_carries_the_generated_results_markers():
    """README's results section is the generator's to write (python -m kanlib.report OUT --readme)."""
    text = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")).read()
    assert text.count(report.README_START) == 1 and text.count(report.README_END) == 1
    assert text.index(report.README_START) < text.index(report.README_END)


def test_a_study_modules_claim_reaches_the_front_page_through_the_registry(full_study_dir, monkeypatch):
    # a claim is declared once, in its study module (its text, the paper's numbers, its judge): the report is a loop
    from kanlib.analysis import claims
    from kanlib.studies import weak_scaling

    seen = []

    def judge(a, machine, other, guidelines=None, ctx=None):
        seen.append((a.study, other))
        return {"verdict": "confirmed", "number": "42 steps", "why": "a test claim"}

    extra = claims.Claim("A test claim", "the paper's test number", judge, "weak_scaling")
    monkeypatch.setattr(weak_scaling, "CLAIMS", weak_scaling.CLAIMS + (extra,))
    g = guidelines.from_out_dir(str(full_study_dir))
    vs = front.verdicts(report.analyses(str(full_study_dir), ctx=g.context), g, str(full_study_dir), g.context)
    titles = [v["claim"] for v in vs]
    assert titles.index("A test claim") == titles.index("Weak scaling") + 1  # in run order
    by = {v["claim"]: v for v in vs}
    assert by["A test claim"] == {"claim": "A test claim", "published": "the paper's test number",
                                  "study": "weak_scaling", "verdict": "confirmed", "number": "42 steps",
                                  "why": "a test claim", "test_with": claims.CLUSTER_RUN}
    assert seen == [("weak_scaling", claims.not_here(front.machine(report.analyses(
        str(full_study_dir), ctx=g.context), str(full_study_dir), front.disturbed_runs(g.context), g.context)))]
    # the paper's numbers stand once (presets.PUBLISHED): the claim texts are made from them
    from kanlib.analysis import presets
    from kanlib.studies import communication, strong_scaling

    assert f"{presets.PUBLISHED['speedup']}x" in strong_scaling.PUBLISHED and "74.7%" in strong_scaling.PUBLISHED
    assert communication.PUBLISHED_RANGE == "1.3%-6.1%"
    assert "weak_scaling" in front.published_modules() and "published" not in front.published_modules()


def test_the_report_reconciles_one_model_measured_by_several_studies(full_study_dir):
    # issue 36.4: the same model at 1x2 read 76% (strong), 87% (weak) and 93% (compounding) and nothing reconciled
    # them; the findings section sets them side by side and says why they differ
    body = open(report.build_report(str(full_study_dir))).read()
    part = body[body.index("<section id='findings'>"):body.index("<section id='guidelines'>")
                if "<section id='guidelines'>" in body else body.index("<section id='advisor'>")]
    assert "One model, several studies: why their efficiencies differ" in part
    assert "strong_scaling" in part and "weak_scaling" in part and "global_batch" in part
