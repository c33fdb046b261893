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
# # 03 Communication overhead: analysis
#
# Loads the `communication` records under `out_dir` (by default only those of the newest code version;
# `code="all"` keeps every version as a group of its own), derives the table in `kanlib.studies.communication` (medians
# over repeats with bootstrap 95% intervals; records that differ in configuration or placement are never
# pooled) and draws the study's figures, each with a caption saying what to see. Per point: step
# time with and without the network, total bucket all-reduce time, exposed part and overlap.
#
# Then the **calibrated link model** (`kanlib.analysis.commmodel`), fitted on the collective-benchmark records of the
# same folder (`out_dir/collbench/`): time, algbw and busbw against message size per placement; each link's
# latency and bandwidth with the leave-one-out error of every point (a constant the data cannot resolve is
# named so, never printed as 0); the known-signal check (the emulated link's injected latency and
# bandwidth against what the fit recovers, within 20%); the DDP hook's time split into transfer and
# waiting per placement; and the parity of predicted and measured step time and exposed communication for
# every DDP run. Without benchmark records it says so and fits nothing. Then the **data-parallel options**
# against plain DDP (step time, exposed communication, validation loss after the same samples), and the
# **published setup** (8 GPUs = 4 nodes x 2) through the model: with a preset's compute and links, with the
# compute measured here, and with compute and links measured here, beside 5.97x / 74.7% / 1.3-6.1%. Every
# figure is also written as a self-contained HTML file under `fig_dir` (opens offline). The explorer at the
# end needs a live kernel; a static copy of its first view sits below it.

# %% tags=["parameters"]
out_dir: str = "../outputs"  # where the launch notebook wrote records
fig_dir: str = ""  # offline HTML figures go here; empty: <out_dir>/figures
code: str = "newest"  # code versions: newest | all | one code_version
bench_time_col: str = "time_s_p10"  # benchmark time fitted: time_s_p10 (lower decile, shared machines) | time_s (median)
val_loss_tolerance: float = 0.01  # relative validation-loss increase over plain DDP that counts as harm
published_preset: str = "a100-hdr"  # hardware preset of the published comparison: a100-hdr | h100-ndr | h200-ndr

# %%
from runners import notebook

notebook.check_parameters(globals())

# %%
from kanlib import report

a = report.analyze(out_dir, "communication", code=code, bench_time_col=bench_time_col,
                   val_loss_tolerance=val_loss_tolerance)
a.show()

# %%
published = report.published_setup(out_dir, code=code, preset_name=published_preset, bench_time_col=bench_time_col)
published.show()

# %%
a.save_figures(fig_dir)

# %%
a.explore()
