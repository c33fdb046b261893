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
# # 01 Strong scaling: analysis
#
# Loads the `strong_scaling` records under `out_dir` (by default only those of the newest code version;
# `code="all"` keeps every version as a group of its own), derives the table in `kanlib.studies.strong_scaling` (medians
# over repeats with bootstrap 95% intervals; records that differ in configuration or placement are never
# pooled) and draws the study's figures, each with a caption saying what to see. The table gives
# speedup, efficiency and the Karp-Flatt serial fraction per placement (a serial fraction rising with N
# means overhead that grows with N, such as communication; clipped to [0, 1]).
# Every figure is also written as a self-contained HTML file under `fig_dir` (opens offline). The explorer
# at the end needs a live kernel; a static copy of its first view sits below it.

# %% tags=["parameters"]
out_dir: str = "../outputs"  # where the launch notebook wrote records
fig_dir: str = ""  # offline HTML figures go here; empty: <out_dir>/figures
code: str = "newest"  # code versions: newest | all | one code_version

# %%
from runners import notebook

notebook.check_parameters(globals())

# %%
from kanlib import report

a = report.analyze(out_dir, "strong_scaling", code=code)
a.show()

# %%
a.save_figures(fig_dir)

# %%
a.explore()
