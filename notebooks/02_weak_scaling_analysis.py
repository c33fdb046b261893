# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     notebook_metadata_filter: kernelspec,jupytext,-jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 Weak scaling: analysis
#
# Loads the `weak_scaling` records under `out_dir` (by default only those of the newest code version;
# `code="all"` keeps every version as a group of its own), derives the table in `kanlib.studies.weak_scaling` (medians
# over repeats with bootstrap 95% intervals; records that differ in configuration or placement are never
# pooled) and draws the study's figures, each with a caption saying what to see. Efficiency is
# given against one process and against the first multi-process point of the same kind of placement: the
# published study saw a drop from 1 to several GPUs, then stability. Every figure is also written as a
# self-contained HTML file under `fig_dir` (opens offline). The explorer at the end needs a live kernel; a
# static copy of its first view sits below it.

# %% tags=["parameters"]
out_dir: str = "../outputs"  # where the launch notebook wrote records
fig_dir: str = ""  # offline HTML figures go here; empty: <out_dir>/figures
code: str = "newest"  # code versions: newest | all | one code_version

# %%
from runners import notebook

notebook.check_parameters(globals())

# %%
from kanlib import report

a = report.analyze(out_dir, "weak_scaling", code=code)
a.show()

# %%
a.save_figures(fig_dir)

# %%
a.explore()
