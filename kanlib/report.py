"""Study analyses for the companion notebooks, and the single-file HTML report of the study.

``analyze(out_dir, study)`` loads the study's records, computes its table (kanlib.results) and
figures (kanlib.plots); with no records it carries the message "no records under ..." instead of
failing. ``build_report(out_dir)`` collects every study's figures and tables and the guidelines into
``out_dir/report.html``, which embeds plotly.js once and opens offline.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go

from kanlib import plots, records, results

STUDY_TITLES = {
    "strong_scaling": "Strong scaling (fixed global batch)",
    "weak_scaling": "Weak scaling (fixed per-process batch)",
    "communication": "Communication overhead (no-op-hook method)",
    "model_size": "Model-size scaling (KAN vs matched-parameter MLP)",
}


@dataclass
class StudyAnalysis:
    """One study's records, derived table and figures (empty with a message when no records)."""

    study: str
    records: pd.DataFrame | None = None
    table: pd.DataFrame | None = None
    figures: dict[str, go.Figure] = field(default_factory=dict)
    message: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.records is None

    def show(self) -> None:
        """Display the message, the table and every figure (static figures: they survive export)."""
        from IPython.display import display

        if self.message:
            print(self.message)
        if self.table is not None:
            display(self.table)
        for fig in self.figures.values():
            fig.show()

    def save(self, fig_dir: str) -> list[str]:
        """Write each figure as an offline HTML file ``<fig_dir>/<study>_<name>.html``."""
        return [plots.save_html(fig, os.path.join(fig_dir, f"{self.study}_{name}.html"))
                for name, fig in self.figures.items()]


def _table_and_figures(study: str, df: pd.DataFrame):
    """(table, figures, extra results, note) of one study's records."""
    if study == "strong_scaling":
        t = results.scaling_table(df, by=("model",))
        return t, {"speedup_efficiency": plots.strong_scaling_figure(t)}, {}, ""
    if study == "weak_scaling":
        t = results.weak_scaling_table(df)
        return t, {"throughput_efficiency": plots.weak_scaling_figure(t)}, {}, ""
    if study == "communication":
        from kanlib import commmodel

        t = results.communication_table(df)
        figs = {"overhead": plots.communication_figure(t)}
        try:
            model, pred, basis = commmodel.extrapolate_study(df, t)
        except ValueError as e:  # too few timed multi-process runs to fit the model
            return t, figs, {}, str(e)
        measured = df[(df["comm_hook"] == "timed") & (df["world_size"] > 1)]
        figs["extrapolation"] = plots.comm_model_figure(pred, measured, model)
        return t, figs, {"comm_model": model, "prediction": pred, "basis": basis}, ""
    if study == "model_size":
        t = results.model_size_table(df)
        return t, {"memory_time": plots.model_size_figure(t)}, {}, ""
    raise ValueError(f"study: unknown value {study!r}; choose one of {', '.join(STUDY_TITLES)}")


def analyze(out_dir: str, study: str) -> StudyAnalysis:
    """Load ``study``'s records under ``out_dir`` and derive its table and figures."""
    if study not in STUDY_TITLES:
        raise ValueError(f"study: unknown value {study!r}; choose one of {', '.join(STUDY_TITLES)}")
    try:
        df = results.load_records(out_dir, study=study)
    except results.NoRecordsError as e:
        return StudyAnalysis(study, message=str(e))
    bad = df.attrs.get("bad", [])
    msg = f"{len(df)} records of {study} under {out_dir}"
    if bad:
        msg += f"; skipped {len(bad)} unreadable: " + "; ".join(f"{p} line {ln}: {r}" for p, ln, r in bad)
    table, figs, extra, note = _table_and_figures(study, df)
    if note:
        msg += "; " + note
    return StudyAnalysis(study, df, table, figs, msg, extra)


def _section(title: str, body: str) -> str:
    return f"<section><h2>{html.escape(title)}</h2>{body}</section>\n"


def build_report(out_dir: str, guidelines=None, path: str | None = None) -> str:
    """Write ``out_dir/report.html`` with every study found, its table and figures, and the
    guidelines (a :class:`kanlib.guidelines.Guidelines`, optional). Returns the path."""
    from plotly.offline import get_plotlyjs

    parts = []
    for study, title in STUDY_TITLES.items():
        a = analyze(out_dir, study)
        if a.empty:
            parts.append(_section(title, f"<p>{html.escape(a.message)}</p>"))
            continue
        body = f"<p>{html.escape(a.message)}</p>"
        body += a.table.to_html(index=False, float_format=lambda v: f"{v:.4g}", classes="table")
        for fig in a.figures.values():
            body += fig.to_html(full_html=False, include_plotlyjs=False)
        parts.append(_section(title, body))
    if guidelines is not None:
        items = "".join(f"<li>{html.escape(s)}</li>" for s in guidelines.sentences)
        parts.insert(0, _section("Deployment guidelines (computed from these records)",
                                 guidelines.table.to_html(index=False) + f"<ul>{items}</ul>"))
    path = path or os.path.join(out_dir, "report.html")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    doc = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>kanlib scaling study</title>"
           f"<script type='text/javascript'>{get_plotlyjs()}</script>"
           "<style>body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}"
           "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}</style>"
           f"</head><body><h1>kanlib: how KAN training scales with DDP</h1>"
           f"<p>Records under {html.escape(os.path.abspath(out_dir))}; generated {records.now_iso()}.</p>"
           + "".join(parts) + "</body></html>")
    with open(path, "w") as f:
        f.write(doc)
    return path
