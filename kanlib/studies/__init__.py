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

A new study is a module here (added to :data:`STUDIES`), its launch and analysis notebooks, its parameter file
and its config builder in runners/plans.py.
"""

from kanlib.studies import (calibration, communication, compounding, extrapolation, model_size, options, published,
                            strong_scaling, time_to_accuracy, weak_scaling)

STUDIES = (strong_scaling, weak_scaling, communication, calibration, options, model_size, time_to_accuracy,
           compounding, published, extrapolation)
"""Every study module in run order (launch notebooks 01, 02, 03, 04, 07, 08; then the model's what-ifs, which
read the studies' records)."""


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
