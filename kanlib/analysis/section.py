"""What an analysis gives: a study module's table, figures with captions, further tables with theirs and the
sentences it states, and, merged over the modules of one report section, that section (:class:`StudyAnalysis`),
which a notebook shows and the report writes."""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field

import pandas as pd

from kanlib.analysis import style
from kanlib.analysis.style import go
from kanlib.analysis.table import Table

LONG_TABLE_ROWS = 20
"""Tables longer than this are folded (``<details>``) in the report."""


@dataclass
class StudyAnalysis:
    """One study's records, derived table, figures, further tables and their captions (empty with a
    message when no records). ``summary_table`` is the derived table trimmed for a reader; ``tables`` hold
    display-ready frames (units in the column names, readable numbers); ``lines`` are sentences the analysis
    states (checks, fits, what is missing); ``printed`` are sentences a notebook prints below it (not in the
    report); ``extra`` holds the values findings are drawn from."""

    study: str
    records: pd.DataFrame | None = None
    table: Table | None = None
    figures: dict[str, go.Figure] = field(default_factory=dict)
    message: str = ""
    extra: dict = field(default_factory=dict)
    captions: dict[str, str] = field(default_factory=dict)
    out_dir: str = ""
    code: str = "newest"
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    table_captions: dict[str, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    summary_table: pd.DataFrame | None = None
    printed: list[str] = field(default_factory=list)
    note: str = ""
    """A sentence for the message (what the analysis could not do)."""
    explore_with: object = None
    """A function giving ``(records, views)`` for :meth:`explore`: every record of the folder (read once, when
    asked for) and each study's explorer view."""

    @property
    def empty(self) -> bool:
        return self.records is None

    def add_figure(self, name: str, fig: go.Figure, caption: str) -> None:
        """Add a figure with the caption that says what to see in it."""
        self.figures[name] = fig
        self.captions[name] = caption

    def add_table(self, name: str, table: pd.DataFrame, caption: str) -> None:
        """Add a display-ready table with its caption."""
        self.tables[name] = table
        self.table_captions[name] = caption

    def merge(self, other: "StudyAnalysis") -> None:
        """Add another module's part of the same section: its figures, tables, sentences and values, after these."""
        for name in ("figures", "captions", "tables", "table_captions", "extra"):
            getattr(self, name).update(getattr(other, name))
        self.lines += other.lines
        self.printed += other.printed

    def summary(self) -> pd.DataFrame:
        """The table trimmed to the columns that matter, with units and readable numbers."""
        return self.summary_table if self.summary_table is not None else pd.DataFrame()

    def show(self) -> None:
        """Display the message, the trimmed table, every figure with its caption, the further tables
        with theirs and the analysis' sentences (figures use the renderers of
        :func:`kanlib.analysis.style.use_offline_renderers`, so they survive export)."""
        from IPython.display import HTML, Markdown, display

        style.use_offline_renderers()
        if self.message:
            display(Markdown(self.message))
        if self.summary_table is not None:
            display(HTML(self.summary().to_html(index=False, escape=True)))
        for name, fig in self.figures.items():
            fig.show()
            if self.captions.get(name):
                display(Markdown(f"*{self.captions[name]}*"))
        for name, t in self.tables.items():
            if self.table_captions.get(name):
                display(Markdown(f"**{self.table_captions[name]}**"))
            display(HTML(t.to_html(index=False, escape=True)))
        if self.lines:
            display(Markdown("\n".join(f"- {html.escape(s)}" for s in self.lines)))
        for line in self.printed:
            print(line)

    def save(self, fig_dir: str) -> list[str]:
        """Write each figure as an offline HTML file ``<fig_dir>/<study>_<name>.html``."""
        return [style.save_html(fig, os.path.join(fig_dir, f"{self.study}_{name}.html"))
                for name, fig in self.figures.items()]

    def save_figures(self, fig_dir: str = "") -> list[str]:
        """:meth:`save` into ``fig_dir`` (empty: ``<out_dir>/figures``) and print where each file went."""
        paths = self.save(fig_dir or os.path.join(self.out_dir, "figures"))
        print("\n".join(paths) if paths else f"no figures written ({self.message})")
        return paths

    def explore(self) -> None:
        """Display the explorer over every record under ``out_dir``, opened on this study, with a
        static copy of its first view (or the reason there is nothing to explore)."""
        from kanlib.analysis import explorer

        if self.empty or self.explore_with is None:
            print(f"nothing to explore: {self.message}")
            return
        records, views = self.explore_with()
        explorer.show_explorer(records, self.study, views)

    def html(self) -> str:
        """This analysis as an HTML fragment of the report (figures drawn by the page's plotly.js)."""
        body = f"<p class='note'>{html.escape(self.message)}</p>"
        if self.empty and not self.figures and not self.tables:
            return body
        for name, fig in self.figures.items():
            body += fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False)
            body += f"<p class='caption'>{html.escape(self.captions.get(name, ''))}</p>"
        if self.summary_table is not None:
            body += self.summary().to_html(index=False, classes="table", border=0)
        for name, t in self.tables.items():
            cap = html.escape(self.table_captions.get(name, name))
            if len(t) > LONG_TABLE_ROWS:  # long tables (every benchmark point, every run) fold away
                body += (f"<details><summary><b>{cap}</b> ({len(t)} rows)</summary>"
                         f"{t.to_html(index=False, classes='table', border=0)}</details>")
            else:
                body += f"<h3>{cap}</h3>" + t.to_html(index=False, classes="table", border=0)
        if self.lines:
            body += "<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in self.lines) + "</ul>"
        return body
