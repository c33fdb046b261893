"""Figures that answer their reader (issue 36): both axes of every subplot titled with their unit, the guidelines'
target efficiency on strong scaling (one y range per row), the paper's overhead band (presets.PUBLISHED's numbers),
the published setup's labels whole and clear of the legend, the extrapolation named by the links it used and every
point above 100% flagged; and the words beside them: one serial fraction, never above 1, and speed ratios that say
"slower" or "faster"."""

import os
import re

import pytest

from synthetic import ddp_records, links, strong_records, write_bench, write_calibrated, write_records, write_steps

from kanlib import front, guidelines, report, studies
from kanlib.analysis import fmt, load, presets, style
from kanlib.analysis.context import Goals


def every_figure(folder) -> dict:
    """``{(section, name): figure}`` of every section's analysis of ``folder``."""
    every = report.analyses(str(folder), bench_time_col="time_s")
    return {(s, n): f for s, a in every.items() for n, f in a.figures.items()}


def with_curves(folder):
    """Give every time-to-accuracy run a steps.csv (so the curves figure is drawn too)."""
    df = load.load_records(str(folder))
    for _, r in df[df["study"] == "time_to_accuracy"].iterrows():
        write_steps(os.path.dirname(r["record_path"]),
                    [{"step": s, "step_time_s": r["step_time_s"], "val_loss": 1.0 / (s + 1) if (s + 1) % 10 == 0
                      else ""} for s in range(30)])
    return folder


def axes_of(fig, prefix: str) -> list:
    """The visible axes (``yaxis``, ``yaxis2``, ...) of ``fig`` some trace draws on."""
    names = {(getattr(t, prefix[0] + "axis", None) or prefix[0]) for t in fig.data}
    return [fig.layout[prefix + n[1:]] for n in sorted(names) if fig.layout[prefix + n[1:]].visible is not False]


def shapes_on(fig, yaxis_name: str) -> list:
    """The layout shapes (lines, bands) drawn against ``yaxis_name`` (``y3``; ``y`` for the first)."""
    return [s for s in fig.layout.shapes if (s.yref or "y").split(" ")[0] == yaxis_name]


def test_every_figure_titles_both_axes_of_every_subplot_with_a_unit(full_study_dir):
    """12 of the report's 15 figures had no y-axis title (and several subplots no x-axis title)."""
    figs = every_figure(with_curves(full_study_dir))
    assert {("time_to_accuracy", "curves"), ("extrapolation", "efficiency"), ("published", "comparison"),
            ("communication", "collbench"), ("strong_scaling", "speedup_efficiency")} <= set(figs)
    for key, fig in figs.items():
        ys, xs = axes_of(fig, "yaxis"), axes_of(fig, "xaxis")
        assert ys and xs and all(a.title.text for a in xs), (key, [a.title.text for a in xs])
        assert all(re.search(r"\(.+\)", a.title.text or "") for a in ys), (key, [a.title.text for a in ys])
        assert style.missing_axis_titles(fig) == [], key  # the helper the browser tests may use agrees


def test_strong_scaling_draws_the_target_on_every_efficiency_panel_on_one_shared_range(study_dir):
    a = report.analyze(str(study_dir), "strong_scaling")
    fig, target = a.figures["speedup_efficiency"], Goals().target_efficiency
    eff = [n for n in fig.layout if n.startswith("yaxis") and "efficiency" in (fig.layout[n].title.text or "")]
    spd = [n for n in fig.layout if n.startswith("yaxis") and "speedup" in (fig.layout[n].title.text or "")]
    assert len(eff) == len(spd) == 2  # two work sizes: a subplot pair each
    for n in eff:
        lines = [s for s in shapes_on(fig, "y" + n[5:]) if s.y0 == s.y1 == target]
        assert len(lines) == 1 and lines[0].line.dash == "longdash", n
    assert len({tuple(fig.layout[n].range) for n in eff}) == 1 and len({tuple(fig.layout[n].range) for n in spd}) == 1
    assert fig.layout[eff[0]].range[1] >= 1.0  # ideal and the target both show
    assert f"target efficiency {target:.0%}" in " ".join(t.name or "" for t in fig.data)
    assert f"target efficiency ({target:.0%})" in a.captions["speedup_efficiency"]
    work = a.figures["work"]
    assert [s for s in work.layout.shapes if s.y0 == s.y1 == target]


def test_the_overhead_figure_carries_the_published_band(study_dir):
    a = report.analyze(str(study_dir), "communication")
    fig, pub = a.figures["overhead"], presets.PUBLISHED
    share = [n for n in fig.layout if n.startswith("yaxis") and "exposed" in (fig.layout[n].title.text or "")]
    assert share
    for n in share:
        bands = [s for s in shapes_on(fig, "y" + n[5:]) if s.type == "rect"]
        assert [(s.y0, s.y1) for s in bands] == [(pub["overhead_fraction_min"], pub["overhead_fraction_max"])], n
    assert len({tuple(fig.layout[n].range) for n in share}) == 1
    assert "published 1.3%-6.1%" in a.captions["overhead"]


def test_the_published_setup_names_each_bar_whole_and_keeps_the_legend_off_the_labels(calibrated):
    a = report.analyses(str(calibrated), bench_time_col="time_s")["published"]
    fig = a.figures["comparison"]
    labels = {x for t in style.data_traces(fig) for x in t.x}
    shorts = {r["short"] for r in a.extra["comparisons"].values()}
    assert len(shorts) == 3 and {x.replace("<br>", " ") for x in labels} == shorts  # every name whole
    assert all(len(line) <= 16 for x in labels for line in x.split("<br>"))
    assert fig.layout.legend.orientation == "v" and fig.layout.legend.x > 1  # beside the panels, not under them
    assert all(not t.showlegend for t in style.data_traces(fig))
    band = [s for s in shapes_on(fig, "y3") if s.type == "rect"]
    assert [(s.y0, s.y1) for s in band] == [(presets.PUBLISHED["overhead_fraction_min"],
                                             presets.PUBLISHED["overhead_fraction_max"])]


def test_the_extrapolation_names_its_links_and_flags_every_point_above_100_percent(tmp_path):
    """A measured two-process point at 125% efficiency (the one-process baseline slower than its share), CPU
    processes on gloo links: the axis said "GPUs" and the point was drawn off the top of a 0-105% axis, unflagged."""
    write_calibrated(tmp_path, two_process_step_s=0.004, device="cpu", backend="gloo")
    a = report.extrapolation(str(tmp_path), bench_time_col="time_s", kan_sizes=[[2, 8, 1]], bucket_caps_mb=(25.0,),
                             max_world_size=64, at_world_size=16)
    fig = a.figures["efficiency"]
    assert a.tables["measured"]["measured efficiency"].iloc[0] == "125.0%"
    for ax in axes_of(fig, "xaxis"):
        assert "GPU" not in ax.title.text and "cpu processes on the gloo links measured here" in ax.title.text
    assert "GPU" not in fig.layout.title.text
    rings = [t for t in fig.data if t.name and t.name.startswith("above 100%")]
    ringed = {(t.yaxis or "y", x, y) for t in rings for x, y in zip(t.x, t.y)}
    above = [(t.yaxis or "y", x, y) for t in style.data_traces(fig) if t not in rings and t.fill != "toself"
             for x, y in zip(t.x, t.y) if y is not None and y > 1]
    assert ("y", 2, pytest.approx(1.25, rel=0.02)) in above  # the measured point
    for ya, x, y in above:  # ringed where it is, or at the top edge of a readable axis (at most 150%)
        assert (ya, x, min(y, 1.5)) in ringed
        assert min(y, 1.5) <= fig.layout["yaxis" + ya[1:]].range[1] <= 1.6
    off = {(t.yaxis or "y", x): v for t in rings for x, y, v in zip(t.x, t.y, t.text) if v}
    assert all(re.fullmatch(r"\d+%", v) for v in off.values())  # a value off the scale is written beside it
    assert "Ringed in red, above 100% efficiency" in a.captions["efficiency"]


def test_strong_scaling_prints_one_serial_fraction_never_above_1(tmp_path):
    """A two-process point slower than one process: Karp-Flatt read 1.890 in the table beside an Amdahl fit of
    1.000 in the guideline for the same point."""
    write_records(tmp_path, strong_records({"1x1": 8.0, "1x2": 11.6, "2x1": 5.0}))
    a = report.analyze(str(tmp_path), "strong_scaling")
    shown = studies.strong_scaling.display_table(a.table)["Karp-Flatt serial fraction"].tolist()
    assert a.table.data["karp_flatt"].max() <= 1.0
    g = guidelines.from_out_dir(str(tmp_path))
    text = " ".join(shown + a.printed + g.sentences + g.table["answer"].astype(str).tolist())
    assert "Amdahl" not in text
    fractions = [float(v) for v in re.findall(r"serial fraction(?: there)? (\d+(?:\.\d+)?)", text)]
    fractions += [float(m) for v in shown if v for m in re.findall(r"^(\d+(?:\.\d+)?)", v)]
    assert fractions and max(fractions) <= 1.0
    assert "1 (capped: slower than N0" in " ".join(shown)


def test_speed_ratios_say_slower_or_faster(full_study_dir):
    """'step 1.32x' meant slower; 'step 0.88x' meant faster."""
    every = report.analyses(str(full_study_dir), bench_time_col="time_s")
    found = " ".join(f["ours"] for f in front.findings(every))
    g = guidelines.from_out_dir(str(full_study_dir))
    words = " ".join([found] + every["communication"].lines + g.sentences + g.table["answer"].astype(str).tolist()
                     + [h for t in every["communication"].figures["options"].data for h in (t.hovertext or ())])
    assert "powersgd rank 1 (1x4): step 1.14x faster" in found
    assert re.search(r"grad_accum_steps=2 \(1x4\): step 1\.\d\dx slower", found)
    assert not re.search(r"step \d+\.\d+x(?! (slower|faster))", words)
    assert not re.search(r"\d\.\d\dx plain\b", words)
    assert (fmt.slower_faster(1.32), fmt.slower_faster(0.875), fmt.slower_faster(1.001)) == \
        ("1.32x slower", "1.14x faster", "as fast")


def test_the_collective_benchmark_marks_the_largest_bucket_and_lists_nccl_tests_columns(tmp_path):
    """A benchmark stopping at 4 MiB beside DDP runs with 25 MiB buckets says the link model extrapolates there;
    one that runs to 64 MiB says it measured past it; both list time, algbw and busbw per size."""
    short = [8 * 4 ** k for k in range(11)]  # 8 B .. 8 MiB
    for top, sizes, words in ((4 * 2**20, short[:-1] + [4 * 2**20], "below it, so the link model extrapolates there"),
                              (64 * 2**20, short + [32 * 2**20, 64 * 2**20], "past it")):
        folder = tmp_path / str(top)
        write_bench(folder, "1x2", links(), sizes=sizes)
        write_records(folder, ddp_records())  # buckets capped at 0.5 MiB: DDP's default 25 MiB is the largest
        a = report.analyses(str(folder), bench_time_col="time_s")["communication"]
        fig = a.figures["collbench"]
        assert [s.x0 for s in fig.layout.shapes if s.type == "line"] == [25 * 2**20] * 3
        assert words in a.captions["collbench"] and "largest gradient bucket (25 MiB)" in a.captions["collbench"]
        t = a.tables["collbench"]
        assert {"time (us)", "algbw (GB/s)", "busbw (GB/s)", "count (elements)"} <= set(t.columns)
        assert len(t) == len(sizes) and t["size"].iloc[-1] == fmt.nbytes(top)
