"""The report of a study folder and the analyses the companion notebooks show: loops over the study modules
(kanlib.studies), over one :class:`kanlib.analysis.context.Context` that reads the records and the collective
benchmark once, fits the link model once and makes each table once.

``analyze(out_dir, study)`` gives one study's section: its table, figures (each with a caption saying what to
see), further tables and sentences; with no records it carries the message "no records ..." instead of failing.
:func:`published_setup` (the calibrated model beside the published 8-GPU result) and :func:`extrapolation`
(predicted scaling to thousands of GPUs, notebook 06) are the model's what-ifs. ``build_report(out_dir)`` writes
``out_dir/report.html``: the findings first, one line each with its 95% interval beside the published study's
numbers, then the guidelines, each section's figures with captions and trimmed tables (units, readable numbers),
a methods section (machine, backend, torch, commit, configs, repeats, how each quantity is measured) and links to
the raw records. Every path in it is relative to the report's folder; plotly.js is embedded once and nothing is
loaded from the network (no CDN, no MathJax).
"""

from __future__ import annotations

import html
import os
import sys

import pandas as pd

from kanlib import front, records, studies
from kanlib.analysis import claims, fmt, groups, load, style
from kanlib.analysis.context import PARAMS, Context, Goals
from kanlib.analysis.section import StudyAnalysis
from kanlib.studies import extrapolation as _extrapolation
from kanlib.studies import published as _published

__all__ = ["StudyAnalysis", "analyze", "analyses", "published_setup", "extrapolation", "build_report",
           "methods_html"]

MEASUREMENT_DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "measurement.md")
METHOD_FIELDS = ("model", "widths", "grid_size", "spline_order", "kan_impl", "task", "global_batch", "steps",
                 "warmup_steps", "lr", "optimizer", "precision", "threads", "bucket_cap_mb",
                 "comm_hook", "grad_accum_steps", "parallelism", "lr_rule", "target_val_loss", "eval_every",
                 "placement")
"""The config fields the methods name, fixed or varied, per study."""
MEASUREMENT_METHODS = (
    "<h3>How each quantity is measured</h3><ul>"
    "<li><b>Step time</b> T(N): per step the slowest rank's forward + backward + optimizer time (host clock after "
    "synchronising the device), median over the steps after warm-up; each point is repeated in separate process "
    "groups and tables show the median over repeats with a percentile bootstrap 95% interval (2000 resamples).</li>"
    "<li><b>Speedup</b> S = T(1)/T(N) at a fixed global batch (interval resampling both); <b>efficiency</b> "
    "E = S/N; <b>Karp-Flatt</b> e = (1/S - 1/N)/(1 - 1/N).</li>"
    "<li><b>Weak scaling</b>: throughput X(N) = global batch / T(N) at a fixed per-process batch; "
    "E_w = X(N)/(N X(1)), and against the first multi-process point.</li>"
    "<li><b>Exposed communication</b>: the same configuration run with a timed all-reduce hook and with a no-op "
    "hook (same bucketing, no network); exposed = T_timed - T_noop (step times), clipped to [0, total all-reduce "
    "time]; overhead = exposed / T_timed; overlap = total - exposed.</li>"
    "<li><b>Parameters per byte</b>: parameters / the tensor memory of a training step (parameters, gradients, "
    "optimizer state, batch and activations, as the allocator counts them); for records without it, / peak memory "
    "(CUDA: allocator peak; CPU: process peak resident set).</li>"
    "<li><b>Collective benchmark</b>: per message size, all-reduces after a barrier (the transfer, not a late "
    "rank); time = median (and deciles) over iterations of the slowest rank; algbw = bytes / time, busbw = "
    "algbw x 2(N-1)/N. <b>Link model</b>: latency and bandwidth per link (intra-node, inter-node, emulated) fitted "
    "by non-negative relative least squares, with the leave-one-out error of every point; a constant the data "
    "cannot resolve is reported as such. <b>Known signal</b>: an emulated inter-node link adds 2(N-1) L + "
    "2(N-1)/N bytes/B to each all-reduce; the fit must recover L and B.</li>"
    "<li><b>Parity</b>: for each timed DDP run, the model's exposed communication from the run's buckets, the "
    "no-op twin's backward time and the fitted links, against T_timed - T_noop; <b>transfer vs waiting</b>: the "
    "benchmark-predicted transfer of the run's buckets against the hook's measured time.</li>"
    "<li><b>Data-parallel options</b>: each option run as its own point with its no-op twin; step time, exposed "
    "communication and the final validation loss (same samples) against plain DDP at the same point.</li>"
    "<li><b>Time to accuracy</b>: validation loss every eval_every steps outside the timed region; steps, "
    "samples and training wall time until it first reaches the target; strong series (one global batch): "
    "time-to-target speedup against step speedup; weak series (one per-process batch): statistical efficiency "
    "samples(N0)/samples(N).</li>"
    "<li><b>Compounding</b>: grouped by the kernel path that ran (kan_path); measured T(ref,N0) N0 / T(k,N) "
    "against the product of the kernel speedup and the reference kernel's DDP speedup.</li>"
    "<li><b>FSDP</b>: the same model sizes under DDP and fully_shard at the same placement; peak memory per "
    "process and step time; FSDP pays where its peak memory is lower by more than 5%.</li>"
    "<li><b>Groups</b>: records that differ in any configuration field, placement or code version are never "
    "pooled; each group is a row set, subplot and guideline of its own.</li></ul>")
"""How each quantity is measured, in short (docs/measurement.md in full), for the report's methods."""


def context(out_dir: str, code: str = "newest", **params) -> Context:
    """The analysis context of ``out_dir`` with the analyses' parameters (an unknown one is refused)."""
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise ValueError(f"{unknown[0]}: not a parameter of the analyses; known: {', '.join(PARAMS)}")
    return Context(out_dir, code, **params)


def analyze(out_dir: str, study: str, code: str = "newest", ctx: Context | None = None, **params) -> StudyAnalysis:
    """Load ``study``'s records under ``out_dir`` (code versions chosen by ``code``, see
    :meth:`kanlib.analysis.load.Records.select`) and derive its section: the modules of kanlib.studies in that
    section, in order (communication: the overhead, the calibrated link model, the data-parallel options).

    params: ``bench_time_col`` (the collbench time the links are fitted on, default ``time_s_p10``: the lower
    decile, for a machine shared with other work; ``time_s`` is the median), ``val_loss_tolerance`` (relative;
    default 0.01) and ``calibration_tolerance`` (default 0.2). ``ctx``: a context already holding the records."""
    if study not in studies.record_sections():
        raise ValueError(f"study: unknown value {study!r}; choose one of {', '.join(studies.record_sections())}")
    ctx = ctx or context(out_dir, code, **params)
    try:
        sel = ctx.runs(study)
    except load.NoRecordsError as e:
        return StudyAnalysis(study, message=str(e), out_dir=out_dir, code=code)
    notes = [f"{len(sel.data)} records of {study}."]
    bad = ctx.records.bad
    if bad:
        notes.append(f"Skipped {len(bad)} unreadable: " + "; ".join(f"{os.path.basename(os.path.dirname(p))}/"
                                                                    f"{os.path.basename(p)}: {r}" for p, _, r in bad)
                     + ".")
    if sel.code_note:
        notes.append(sel.code_note)
    if sel.disturbed_note:
        notes.append(sel.disturbed_note)
    a = StudyAnalysis(study, sel.data, out_dir=out_dir, code=code,
                      explore_with=lambda: (ctx.runs().data, studies.views()))
    first, *rest = studies.sections()[study]
    try:
        part = first.analyze(ctx)
        for m in rest:
            part.merge(m.analyze(ctx))
    except KeyError as e:  # e.g. a communication study without its no-op runs
        a.message = " ".join(notes + [str(e.args[0])])
        return a
    a.merge(part)
    a.table = part.table
    a.summary_table = first.display_table(part.table) if part.table is not None else None
    notes += [n for n in (a.table.note if a.table is not None else "", part.note) if n]
    a.message = " ".join(notes)
    return a


def published_setup(out_dir: str, code: str = "newest", ctx: Context | None = None, **kw) -> StudyAnalysis:
    """The model's prediction for the published shape (8 GPUs = 4 nodes x 2) beside the published
    5.97x / 74.7% / 1.3-6.1% (:func:`kanlib.studies.published.analyze`; ``kw``: its parameters)."""
    a = _published.analyze(ctx or Context(out_dir, code), **kw)
    a.out_dir, a.code = out_dir, code
    return a


def extrapolation(out_dir: str, code: str = "newest", ctx: Context | None = None, **kw) -> StudyAnalysis:
    """Predicted efficiency and exposed communication from 1 to thousands of GPUs
    (:func:`kanlib.studies.extrapolation.analyze`; ``kw``: its parameters, e.g. ``remember=True`` to keep them
    for the report)."""
    a = _extrapolation.analyze(ctx or Context(out_dir, code), **kw)
    a.out_dir, a.code = out_dir, code
    return a


def analyses(out_dir: str, code: str = "newest", published: dict | None = None, extrapolate: dict | None = None,
             ctx: Context | None = None, **params) -> dict[str, StudyAnalysis]:
    """Every section of the report, by name, in run order: each study with records (``params`` go to
    :func:`analyze`), then :func:`published_setup` (``published``: its keyword arguments) and
    :func:`extrapolation` (``extrapolate``: its keyword arguments; None: those notebook 06 kept in
    ``out_dir/extrapolation.json``, else the defaults). One context (records read once) serves them all."""
    ctx = ctx or context(out_dir, code, **params)
    saved = _extrapolation.saved_params(out_dir) if extrapolate is None else extrapolate
    what_ifs = {_published.SECTION: lambda: published_setup(out_dir, code, ctx, **(published or {})),
                _extrapolation.SECTION: lambda: extrapolation(out_dir, code, ctx, **saved)}
    return {s: what_ifs[s]() if s in what_ifs else analyze(out_dir, s, code, ctx)
            for s in studies.sections()}


# -- methods and records ------------------------------------------------------------------------------
def _configs_row(study: str, a: StudyAnalysis) -> str:
    """One row of the methods' table: records, runs per point, the fields fixed and varied."""
    r = groups.with_placement(a.records)
    fixed, varied = [], []
    for f in METHOD_FIELDS:
        if f not in r:
            continue
        vals = {fmt.value(groups.hashable(v)) for v in r[f].dropna()}
        (varied if len(vals) > 1 else fixed).append(f"{f}={', '.join(sorted(vals))}")
    t = a.table.data if a.table is not None else None
    per = t["n_runs"] if t is not None and "n_runs" in t else pd.Series(dtype=int)
    per_txt = f"{int(per.min())}-{int(per.max())}" if len(per) and per.min() != per.max() else \
        (str(int(per.iloc[0])) if len(per) else "?")
    return (f"<tr><td>{study}</td><td>{len(r)}</td><td>{per_txt}</td><td>{html.escape('; '.join(fixed))}</td>"
            f"<td>{html.escape('; '.join(varied))}</td></tr>")


def methods_html(analyses: dict[str, StudyAnalysis], report_dir: str) -> str:
    """The methods section: machine, backend, torch, code, configs and repeats per study, how each
    quantity is measured (linking docs/measurement.md)."""
    frames = [a.records for _, a in front.with_records(analyses)]
    if not frames:
        return "<p>No records.</p>"
    allr = pd.concat(frames, ignore_index=True)
    rows = [("hosts", fmt.distinct(allr, "hostname")), ("devices", fmt.distinct(allr, "device_name")),
            ("backend", fmt.distinct(allr, "backend")), ("torch", fmt.distinct(allr, "torch_version")),
            *([("CUDA / NCCL", f"{fmt.distinct(allr, 'cuda_version')} / {fmt.distinct(allr, 'nccl_version')}")]
              if front.on_cuda(allr) else []),
            ("launcher", fmt.distinct(allr, "launcher")), ("commit (git)", fmt.distinct(allr, "git_sha")),
            ("code version (hash of the runtime source)", fmt.distinct(allr, "code_version")),
            ("runs", f"{len(allr)} records, from {allr['started_at'].min() if 'started_at' in allr else '?'} "
                     f"to {allr['finished_at'].max() if 'finished_at' in allr else '?'}")]
    body = "<table class='kv'>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                                          for k, v in rows) + "</table>"
    body += "<h3>Configurations and repeats</h3><table><tr><th>study</th><th>records</th><th>runs per point</th>" \
            "<th>fixed</th><th>varied</th></tr>"
    body += "".join(_configs_row(s, a) for s, a in front.with_records(analyses)) + "</table>"
    rel = os.path.relpath(MEASUREMENT_DOC, report_dir) if os.path.exists(MEASUREMENT_DOC) else ""
    if rel and not rel.startswith(".."):  # a link that still works when the folder travels
        link = f"<a href='{html.escape(rel)}'>{html.escape(rel)}</a>"
    else:  # a report copied elsewhere would carry a broken ../ link: name the file instead
        link = "docs/measurement.md in the kanlib repository"
    return body + MEASUREMENT_METHODS + f"<p>Definitions in full: {link}.</p>"


def _records_html(analyses: dict[str, StudyAnalysis], report_dir: str, bench: pd.DataFrame) -> str:
    """Every record, linked, per study; and the collective benchmark's."""
    parts = []
    for study, a in front.with_records(analyses):
        label = getattr(studies.sections()[study][0], "record_label", lambda row: "")
        items = []
        for _, row in groups.with_placement(a.records).iterrows():
            rel = os.path.relpath(row["record_path"], report_dir)
            desc = (f"{row.get('model', '')} {fmt.value(groups.hashable(row.get('widths', '')))} "
                    f"B={row.get('global_batch', '')} {row['placement']} repeat {row.get('repeat', '')}"
                    + label(row))
            items.append(f"<li><a href='{html.escape(rel)}'>{html.escape(rel)}</a>: {html.escape(desc)}, "
                         f"{row['step_time_s'] * 1e3:.3g} ms</li>")
        parts.append(f"<details><summary>{study}: {len(items)} records</summary><ul>{''.join(items)}</ul></details>")
    if not bench.empty:
        files = bench.drop_duplicates("record_path")
        items = [f"<li><a href='{html.escape(os.path.relpath(p, report_dir))}'>"
                 f"{html.escape(os.path.relpath(p, report_dir))}</a>: {html.escape(str(pl))} {html.escape(str(be))}"
                 f"{', emulated ' + fmt.link_desc(la, bw) if n > 1 and (la or bw) else ''}</li>"
                 for p, pl, be, n, la, bw in zip(files["record_path"], files["placement"], files["backend"],
                                                 files["nnodes"], files["emulate_latency_s"].fillna(0),
                                                 files["emulate_bandwidth_bytes_per_s"].fillna(0))]
        parts.append(f"<details><summary>collbench: {len(items)} records</summary><ul>{''.join(items)}</ul></details>")
    return "".join(parts)


def _section(title: str, body: str, anchor: str = "", folded: bool = True) -> str:
    """A section of the page; folded (a closed ``<details>``) unless it is the first screen's: the page stays short,
    and a reader opens what they need from the table of contents."""
    a = f" id='{anchor}'" if anchor else ""
    return (f"<section{a}><details class='section'{'' if folded else ' open'}><summary><h2>{html.escape(title)}</h2>"
            f"</summary>{body}</details></section>\n")


TOC_SCRIPT = ("<script>document.querySelectorAll('details').forEach(function(d){d.addEventListener('toggle',"
              "function(){if(d.open){d.querySelectorAll('.js-plotly-plot').forEach(function(p){Plotly.Plots.resize(p)"
              "})}})});document.querySelectorAll('nav#toc a').forEach(function(a){a.addEventListener('click',"
              "function(){var s=document.querySelector(a.getAttribute('href'));if(s){var d=s.querySelector("
              "'details');if(d){d.open=true}}})});if(location.hash){var s=document.querySelector(location.hash);"
              "if(s){var d=s.querySelector('details');if(d){d.open=true}}}</script>")
"""Figures drawn inside a folded section are resized when it opens; a table-of-contents link (or a link with a
section's anchor) opens the section it points to."""

GLOSSARY = (
    ("placement NxP", "N nodes x P processes per node; on one host the 'nodes' are separate torchrun launches "
                      "talking over loopback."),
    ("efficiency", "strong scaling: speedup over N, speedup = T(1)/T(N) at a fixed global batch. E_w (weak "
                   "scaling): throughput at N over N times the one-process throughput, at a fixed batch per process."),
    ("interval", "the median of a point's runs with its distribution-free 95% interval (a bootstrap of the median); "
                 "with 5 runs it is the runs' [min, max], about 94% coverage. Fewer than 5 runs: the runs are shown, "
                 "no interval, and nothing is ranked on them."),
    ("flagged (!)", "a decision that could change within its intervals (a threshold its interval holds, a tie its "
                    "intervals could break) or that rests on a point with a disturbed run or too few runs."),
    ("wide", "a point whose runs spread more than the 10% decision margin: its interval is wide; that alone flags no "
             "decision."),
    ("disturbed", "a run during whose measured steps other processes took its CPUs (per-CPU counters) or it "
                  "waited for a CPU: left out of the analysis and named; the sweep runs it once more."),
    ("exposed communication", "step time with DDP's all-reduce minus step time of the no-op twin (the same run "
                              "with a communication hook that sends nothing): the communication that does not "
                              "overlap the backward pass."),
    ("no-op twin", "the run repeated with a communication hook that returns the gradients unsent: bucketing and "
                   "copies stay, only the network goes."),
    ("hook time, waiting share", "the all-reduce time a timed communication hook sees, which includes waiting for "
                                 "the slower rank; the waiting share is what the collective benchmark's transfer "
                                 "time does not explain."),
    ("algbw, busbw", "nccl-tests' bandwidths: algbw = bytes / time; busbw = algbw x 2(N-1)/N, what each link "
                     "carried in a ring all-reduce (comparable across N)."),
    ("Karp-Flatt serial fraction", "e = (1/S - 1/N) / (1 - 1/N) from the measured speedup S: rising with N means an "
                                   "overhead that grows with N (communication), not a fixed serial part."),
    ("link model", "latency + bytes / bandwidth per all-reduce step, fitted on the collective benchmark, with "
                   "the ranks' waiting; it predicts the DDP step and extrapolates to other world sizes."),
    ("preset (e.g. a100-hdr)", "a link and compute model of a named GPU cluster from its vendors' numbers, for "
                               "what-if predictions (kanlib.analysis.presets)."),
    ("lr_rule", "how the learning rate follows the global batch in the time-to-accuracy study: none, linear or "
                "sqrt scaling from lr_base_batch."),
    ("statistical efficiency", "steps (or samples) to a target loss at N against at 1: a larger batch can need "
                               "more samples to reach the same loss."),
    ("matched-parameter MLP", "an MLP with (about) the KAN's parameter count, so both all-reduce the same gradient "
                              "bytes."),
)
"""Every term the report uses that a reader may not know, with its definition (docs/measurement.md has more)."""


def glossary_html() -> str:
    return ("<dl class='glossary'>" + "".join(f"<dt>{html.escape(t)}</dt><dd>{html.escape(d)}</dd>"
                                             for t, d in GLOSSARY) + "</dl>")


def toc_html(entries: list[tuple[str, str]]) -> str:
    """The table of contents: one link per section (anchor, title)."""
    return "<nav id='toc'><b>Contents:</b> " + "".join(f"<a href='#{a}'>{html.escape(t)}</a>"
                                                       for a, t in entries) + "</nav>"


CSS = ("body{font-family:system-ui,sans-serif;max-width:1250px;margin:auto;padding:1em;color:#222}"
       "table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 7px;"
       "text-align:left;vertical-align:top}th{background:#f3f3f3}.findings td:first-child{font-weight:600}"
       ".caption{color:#444;font-size:14px;margin:.2em 0 1.5em}.note{color:#666;font-size:13px}"
       "table.kv th{width:14em}.verdicts td:nth-child(3){white-space:nowrap}.v-confirmed td:nth-child(3){color:#1a7f37}"
       ".v-contradicted td:nth-child(3){color:#c0392b}.v-not-comparable-here td:nth-child(3){color:#8a6d00}"
       ".v-untested td:nth-child(3){color:#666}.warn{color:#c0392b;font-weight:600}"
       ".two{display:flex;gap:1em}.two>div{flex:1;min-width:0}.muted{color:#777}"
       "#bottom-line{background:#f6f8fa;border-left:4px solid #1f6feb;padding:.2em 1em;font-size:14px}"
       "nav#toc{font-size:13px;margin:.5em 0}nav#toc a{margin-right:1em}"
       "details.section>summary{cursor:pointer}details.section>summary h2{display:inline}"
       "dl.glossary dt{font-weight:600}dl.glossary dd{margin:0 0 .4em 1.5em}")


def _findings_html(found: list[dict]) -> str:
    if not found:
        return "<p>No records to report on yet.</p>"
    return ("<table class='findings'><tr><th>finding</th><th>this study (median, 95% interval)</th>"
            "<th>published study</th></tr>"
            + "".join(f"<tr><td><a href='#{f['study']}'>{html.escape(f['topic'])}</a></td><td>{html.escape(f['ours'])}"
                      f"</td><td>{html.escape(f['published'])}</td></tr>" for f in found) + "</table>")


def guidelines_html(g) -> str:
    """The decisions on one screen: question, answer, a flag (! with its reason folded) and a link to the section
    whose figures and tables are its evidence; the sentences folded below."""
    t = g.table
    rows = []
    for _, r in t.iterrows():
        study = getattr(g, "records_of", {}).get((r["question"], r["group"]), "")
        flag = str(r["rests_on"] or "")
        if not r["ranked"]:
            flag = f"not ranked: {int(r['runs'])} run(s)" + (f"; {flag}" if flag else "")
        cell = (f"<details><summary>!</summary>{html.escape(flag)}</details>" if flag else "")
        link = f"<a href='#{html.escape(study)}'>evidence</a>" if study else ""
        group = f" <span class='muted'>[{html.escape(str(r['group']))}]</span>" if r["group"] else ""
        rows.append(f"<tr><td>{html.escape(str(r['question']))}{group}</td><td>{html.escape(str(r['answer']))}</td>"
                    f"<td>{cell}</td><td>{link}</td></tr>")
    n_flag = int((t["rests_on"].fillna("") != "").sum()) if len(t) else 0
    items = "".join(f"<li>{html.escape(s)}</li>" for s in g.sentences)
    return (f"<p class='note'>{len(t)} decisions, {n_flag} flagged (could change within their intervals, or rest on "
            f"disturbed points or too few runs: open ! for why).</p>"
            "<table class='decisions'><tr><th>question [group]</th><th>answer</th><th>flag</th><th></th></tr>"
            + "".join(rows) + "</table>"
            + f"<details><summary>every guideline as a sentence ({len(g.sentences)})</summary><ul>{items}</ul>"
              f"</details>")


def reconcile_html(ctx: Context) -> str:
    """The same model measured by several studies at one placement, side by side, and why their efficiencies differ
    (:func:`kanlib.analysis.reconcile.reconcile`); '' when no model is measured twice."""
    from kanlib.analysis.reconcile import reconcile

    try:
        t, sentences = reconcile(ctx)
    except load.NoRecordsError:
        return ""
    if t.empty:
        return ""
    cols = [c for c in ("set", "model", "widths", "placement", "study", "series", "measure", "efficiency",
                        "efficiency_lo", "efficiency_hi", "n_runs", "local_batch", "differs") if c in t]
    return ("<h3 id='reconcile'>One model, several studies: why their efficiencies differ</h3><ul>"
            + "".join(f"<li>{html.escape(x)}</li>" for x in sentences) + "</ul><details><summary>the measures side "
            "by side</summary>" + t[cols].to_html(index=False, classes="table", border=0, float_format="%.3g")
            + "</details>")


def advisor_html(ctx: Context) -> str:
    """The advisor's section (:func:`kanlib.advise.report_section`), or why it could not be made."""
    from kanlib import advise

    try:
        return advise.report_section(ctx, target=Goals().target_efficiency)
    except (ValueError, KeyError, load.NoRecordsError) as e:
        return f"<p class='note'>No advice from these records: {html.escape(str(e))}</p>"


def _reuse(guidelines, out_dir: str, code: str, params: dict) -> Context | None:
    """The context the guidelines were computed on, when it is this report's (same folder, code policy and
    parameters): its records, benchmark and link fit are not read or made again."""
    ctx = getattr(guidelines, "context", None)
    if ctx is None or ctx.frame is not None or os.path.abspath(ctx.out_dir) != os.path.abspath(out_dir) \
            or ctx.code != code or any(getattr(ctx, k) != v for k, v in params.items()):
        return None
    defaults = Context(out_dir)
    return ctx if all(getattr(ctx, k) == getattr(defaults, k) for k in PARAMS if k not in params) else None


def build_report(out_dir: str, guidelines=None, path: str | None = None, code: str = "newest",
                 published: dict | None = None, extrapolate: dict | None = None, **params) -> str:
    """Write ``out_dir/report.html`` (or ``path``): findings beside the published study's numbers, the
    guidelines (a :class:`kanlib.guidelines.Guidelines`, optional), each study's figures with captions
    and trimmed tables, the published setup and the extrapolation through the calibrated model, methods
    and links to the raw records. ``published`` / ``extrapolate`` / ``params``: see :func:`analyses`.
    The records are read once (and not again when ``guidelines`` were computed on the same folder). Returns
    the path."""
    from plotly.offline import get_plotlyjs

    path = path or os.path.join(out_dir, "report.html")
    report_dir = os.path.dirname(os.path.abspath(path))
    ctx = _reuse(guidelines, out_dir, code, params) or context(out_dir, code, **params)
    all_a = analyses(out_dir, code, published, extrapolate, ctx)
    if guidelines is not None and getattr(guidelines, "context", None) is None:
        guidelines.context = ctx
    first = front.front_page_html(all_a, guidelines, out_dir, ctx)
    parts = [("stability", "Stability", front.stability_html(ctx)),
             ("findings", "All findings beside the published study",
              _findings_html(front.findings(all_a)) + reconcile_html(ctx))]
    if guidelines is not None:
        parts.append(("guidelines", "Deployment guidelines (computed from these records)",
                      guidelines_html(guidelines)))
    where = os.path.relpath(os.path.abspath(out_dir), report_dir)
    parts.append(("advisor", "Deployment advisor: what this study says about another machine",
                  advisor_html(ctx).replace(html.escape(os.path.abspath(out_dir)), html.escape(where))))
    mc = ctx.model_check()
    for name, title in studies.titles().items():
        if name in (_published.SECTION, _extrapolation.SECTION) and not mc.usable:
            all_a[name].message = (f"{mc.describe()[0].upper() + mc.describe()[1:]}: what follows is the model's "
                                   f"what-if, shown for the record, not a prediction. " + all_a[name].message)
        # messages name the folder absolutely ("no records ... under /abs/path"); the report says it relatively
        body = all_a[name].html().replace(html.escape(os.path.abspath(out_dir)), html.escape(where))
        parts.append((name, title, body))
    parts.append(("methods", "Methods", methods_html(all_a, report_dir)))
    figs = os.path.relpath(os.path.join(os.path.abspath(out_dir), "figures"), report_dir)
    parts.append(("records", "Raw records", f"<p>Each run's folder holds config.json, steps.csv, launch.log and "
                                            f"record.json; every figure is also a file under "
                                            f"<a href='{html.escape(figs)}/'>{html.escape(figs)}/</a>.</p>"
                  + _records_html(all_a, report_dir, ctx.bench())))
    parts.append(("glossary", "Glossary", glossary_html()))
    toc = toc_html([("front", "Bottom line and verdicts")] + [(a, t) for a, t, _ in parts])
    doc = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>kanlib scaling study</title>"
           f"<script type='text/javascript'>{get_plotlyjs()}</script><style>{CSS}</style></head><body>"
           "<h1>How KAN training scales with PyTorch DDP</h1>"
           + _section("Bottom line and verdicts", first, "front", folded=False) + toc
           + "".join(_section(t, body, a, folded=a != "guidelines") for a, t, body in parts)
           + f"<p class='note'>Computed from the records under <code>{html.escape(where)}/</code> (relative to this "
             f"file); generated {records.now_iso()}.</p>" + TOC_SCRIPT + "</body></html>")
    os.makedirs(report_dir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(doc)
    os.replace(tmp, path)
    return path


# -- README's results, generated from a study's outputs -----------------------------------------------------------
README_START = "<!-- results:start (generated by python -m kanlib.report OUT --readme; do not edit by hand) -->"
README_END = "<!-- results:end -->"


def readme_results(out_dir: str, guidelines=None) -> str:
    """README's results section, in Markdown, from the records under ``out_dir``: the verdict per published claim,
    the project's own findings, the machine and the stability counts, with the commit the records came from."""
    from kanlib import guidelines as _g

    g = guidelines or _g.from_out_dir(out_dir)
    ctx = g.context if g.context is not None else context(out_dir)
    all_a = analyses(out_dir, ctx=ctx)
    m = front.machine(all_a, out_dir, front.disturbed_runs(ctx), ctx)
    try:
        shas = fmt.distinct(ctx.runs().data, "git_sha")
    except load.NoRecordsError:
        shas = "none"

    def cell(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    vs = front.verdicts(all_a, g, out_dir, ctx)
    lines = [README_START, "", f"From the records of commit {shas} (`make study`, then "
             f"`python -m kanlib.report {os.path.basename(os.path.abspath(out_dir))} --readme`); the report says "
             f"why for each.", "", "Machine: " + cell(dict(m["rows"]).get("compute", "not recorded")) + f"; up to {m['max_n']} process(es)"
             + ("" if m["real_nodes"] else ", 'nodes' on one host") + ".", "",
             "| published claim | verdict | measured | what would test it |", "|---|---|---|---|"]
    for v in vs:
        nc = v["verdict"] in (claims.NOT_COMPARABLE, "untested")
        test = (v.get("test_with") or "any machine") if nc else "decided here"
        lines.append(f"| {cell(v['claim'])} | **{v['verdict']}** | {cell(front.short(v['number'], 90))} | "
                     f"{cell(front.short(test, 60))} |")
    own = front.own_findings(front.findings(all_a))
    lines += ["", "| the project's own finding | here |", "|---|---|"]
    lines += [f"| {cell(f['topic'])} | {cell(front.short(f['ours'], 110))} |" for f in own]
    t = g.table
    lines += ["", f"Decisions: {len(t)}, {int((t['rests_on'].fillna('') != '').sum()) if len(t) else 0} flagged "
                  f"(could change within their intervals, or rest on disturbed points); the link model: "
                  f"{ctx.model_check().status}."]
    lines += ["", README_END]
    return "\n".join(lines)


def readme_problem(readme: str) -> str | None:
    """Why ``readme`` cannot take the generated results (None when it can): it is not a readable file, or it lacks
    a results marker (each missing one named), or its end marker comes before its start marker."""
    try:
        with open(readme) as f:
            text = f.read()
    except FileNotFoundError:
        return f"{readme}: no such file (--readme and --check-readme take the README that holds the results markers)"
    except (OSError, UnicodeDecodeError) as e:
        return f"{readme}: cannot be read ({e})"
    start_tag = README_START.split(" (")[0]
    i, j = text.find(start_tag), text.find(README_END)
    missing = [m for m, at in ((README_START, i), (README_END, j)) if at < 0]
    if missing:
        return (f"{readme}: no results marker{'s' if len(missing) > 1 else ''} {' and '.join(missing)}; the "
                f"generated results go between {README_START} and {README_END}, each on a line of its own")
    if j < i:
        return f"{readme}: its results end marker {README_END} comes before its start marker {start_tag} ...-->"
    return None


def write_readme(out_dir: str, readme: str) -> str:
    """Replace the text between :data:`README_START` and :data:`README_END` in ``readme`` with
    :func:`readme_results` of ``out_dir`` (nothing else in the file changes); a ValueError names a missing marker
    (:func:`readme_problem`), before anything is computed or written."""
    problem = readme_problem(readme)
    if problem:
        raise ValueError(problem)
    with open(readme) as f:
        text = f.read()
    i, j = text.find(README_START.split(" (")[0]), text.find(README_END)
    new = text[:i] + readme_results(out_dir) + text[j + len(README_END):]
    tmp = readme + ".tmp"
    with open(tmp, "w") as f:
        f.write(new)
    os.replace(tmp, readme)
    return readme


def main(argv: list[str] | None = None) -> int:
    """``python -m kanlib.report OUT``: write OUT/report.html; ``--readme [README.md]``: also regenerate README's
    results section from OUT's records; ``--check-readme``: exit 1 when README's section is not what OUT gives.
    A README that is missing or lacks the results markers exits 2 naming what is wrong, before anything is
    written."""
    import argparse

    from kanlib import guidelines as _g

    ap = argparse.ArgumentParser(prog="python -m kanlib.report", description=main.__doc__)
    ap.add_argument("out_dir")
    ap.add_argument("--readme", nargs="?", const="README.md", default=None)
    ap.add_argument("--check-readme", nargs="?", const="README.md", default=None)
    args = ap.parse_args(argv)
    if not os.path.isdir(args.out_dir):
        ap.error(f"out_dir: {args.out_dir!r} is not a folder")
    for readme in (args.check_readme, args.readme):
        problem = readme and readme_problem(readme)
        if problem:
            print(f"python -m kanlib.report: {problem}", file=sys.stderr)
            return 2
    try:  # the report and README's results are made with the studies' figures
        style.import_plotly("plotly.offline")
    except ModuleNotFoundError as e:
        print(f"python -m kanlib.report: {e} (python -m kanlib.guidelines OUT answers without it)", file=sys.stderr)
        return 2
    if args.check_readme:
        with open(args.check_readme) as f:
            text = f.read()
        want = readme_results(args.out_dir)
        if want.split("\n", 3)[3] not in text:  # past the marker and the commit line
            print(f"{args.check_readme}: its results are not those of {args.out_dir} (regenerate with "
                  f"python -m kanlib.report {args.out_dir} --readme)")
            return 1
        print(f"{args.check_readme}: results match {args.out_dir}")
        return 0
    g = _g.from_out_dir(args.out_dir)
    print(build_report(args.out_dir, guidelines=g))
    if args.readme:
        print(write_readme(args.out_dir, args.readme))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
