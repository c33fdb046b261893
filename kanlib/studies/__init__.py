"""The studies, one module each, in run order (:data:`STUDIES`): a report and the guidelines are loops over it.

Every module has the same names:

- ``NAME``: the module's name; ``SECTION``: the report section it belongs to (a study's own name, or the study
  whose section it joins: calibration and options join communication); ``RECORDS``: the study whose records it
  reads (None for the model's what-ifs); ``TITLE``; ``PUBLISHED``: the published study's word beside its finding;
  ``AXES``, ``SWEPT``: what varies within a group and in one sweep; ``EXPLORER``: what the explorer offers.
- ``table(...)``: its derived table (:class:`kanlib.analysis.table.Table`);
  ``analyze(ctx, ...) -> StudyAnalysis``: the table, figures with captions, further tables and sentences, from a
  :class:`kanlib.analysis.context.Context` (records read once, the link model fitted once, tables made once);
  ``display_table(table)``: the table as a reader needs it; ``finding(section_analysis) -> list[dict]``: the
  report's findings rows; ``guideline(ctx, goals) -> (rows, sentences)``: its deployment guidelines.
- A module whose section has records may have ``record_label(row)``: what names one record in the report's list
  besides model, widths, batch, placement and repeat (nothing when it has none).

The registry also holds the run order of ``make study`` (``python -m runners.study``, a loop over it): each
study's notebooks (:data:`NOTEBOOKS`), its launch notebook in :data:`STUDIES` order, then the analyses, then
:data:`GUIDELINES_NOTEBOOK` (:func:`run_order`).

A new study is a module here (added to :data:`STUDIES`, its notebooks to :data:`NOTEBOOKS`), its launch and analysis
notebooks, its parameter file and its config builder in runners/plans.py.
"""

from kanlib.studies import (calibration, communication, compounding, extrapolation, model_size, options, published,
                            strong_scaling, time_to_accuracy, weak_scaling)

STUDIES = (strong_scaling, weak_scaling, communication, calibration, options, model_size, time_to_accuracy,
           compounding, published, extrapolation)
"""Every study module in run order (launch notebooks 01, 02, 03, 04, 07, 08; then the model's what-ifs, which
read the studies' records)."""

NOTEBOOKS = {
    "strong_scaling": ("01_strong_scaling", "01_strong_scaling_analysis"),
    "weak_scaling": ("02_weak_scaling", "02_weak_scaling_analysis"),
    "communication": ("03_communication_overhead", "03_communication_overhead_analysis"),
    "model_size": ("04_model_size_scaling", "04_model_size_scaling_analysis"),
    "time_to_accuracy": ("07_time_to_accuracy", "07_time_to_accuracy_analysis"),
    "compounding": ("08_compounding", "08_compounding_analysis"),
    "extrapolation": (None, "06_extrapolation"),
}
"""Each study's notebooks by module ``NAME``: its launch notebook (None: it makes no runs; it reads the others'
records) and its analysis notebook (``notebooks/<name>.py``). A module absent here is shown by its section's
analysis notebook (calibration and options by communication's) or by the guidelines' (published)."""

GUIDELINES_NOTEBOOK = "05_guidelines"
"""The last notebook of a study: the guidelines and the report, from every study's records."""

LAUNCH, ANALYSIS, GUIDELINES = "launch", "analysis", "guidelines"


def run_order() -> list[tuple[str, str]]:
    """Every notebook of a study as ``(name, kind)`` in the order ``make study`` runs them: the launch notebooks
    (kind ``"launch"``, one after the other) in :data:`STUDIES` order, then the analyses (``"analysis"``: they
    time nothing, so several may run at once; the extrapolation reads strong scaling's and communication's
    records), then :data:`GUIDELINES_NOTEBOOK` (``"guidelines"``, which writes the report)."""
    order = [NOTEBOOKS[m.NAME] for m in STUDIES if m.NAME in NOTEBOOKS]
    return ([(launch, LAUNCH) for launch, _ in order if launch] + [(a, ANALYSIS) for _, a in order if a]
            + [(GUIDELINES_NOTEBOOK, GUIDELINES)])


def sections() -> dict[str, list]:
    """The report's sections in order, each with its modules in order."""
    out = {}
    for m in STUDIES:
        out.setdefault(m.SECTION, []).append(m)
    return out


def record_sections() -> list[str]:
    """The sections that are studies with records of their own (``report.analyze`` takes these)."""
    return [s for s, mods in sections().items() if mods[0].RECORDS]


def titles() -> dict[str, str]:
    """Each section's title (its first module's)."""
    return {s: mods[0].TITLE for s, mods in sections().items()}


def views() -> dict:
    """What the explorer offers per study (each record study's ``EXPLORER``)."""
    import dataclasses

    return {s: dataclasses.replace(mods[0].EXPLORER, axes=tuple(mods[0].AXES)) for s, mods in sections().items()
            if mods[0].RECORDS}
