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
# # 05 Deployment guidelines, computed from the records
#
# For a target efficiency and a per-process memory and step-time budget, per group of records (work size,
# model, ...): the placement (nodes x processes per node) with the most processes that reaches the target
# and the least work per process that does, the smallest per-process batch for weak scaling, the placement
# and bucket size that expose the least communication, the largest world size the link model calibrated on
# the collective benchmark predicts at the target, the fastest data-parallel option that keeps the
# validation loss within `val_loss_tolerance` of plain DDP, the model size beyond which memory rather than
# time limits a process and the one from which FSDP pays, the placement that reaches the target validation
# loss soonest, and the fastest kernel x placement. Every answer is computed by `kanlib.guidelines` from the
# records under `out_dir`; change the records and the answers change; a question the data cannot answer
# says why. Also writes `out_dir/report.html`: the findings beside the published study's numbers, then every
# study's figures, tables and methods, the published setup and the extrapolation (with the parameters
# notebook 06 last used).

# %% tags=["parameters"]
out_dir: str = "../outputs"  # records of the studies
target_efficiency: float = 0.8  # parallel efficiency to reach
memory_budget_gib: float = 80.0  # memory per process (A100 80GB: 80)
step_time_budget_s: float = 1.0  # acceptable time per training step
val_loss_tolerance: float = 0.01  # relative validation-loss increase over plain DDP that counts as harm
bench_time_col: str = "time_s_p10"  # benchmark time fitted: time_s_p10 (lower decile) | time_s (median)
code: str = "newest"  # code versions: newest | all | one code_version
disturbed: str = "leave_out"  # runs the instrument flagged as disturbed: leave_out (named) | keep (shown apart)

# %%
from runners import notebook

notebook.check_parameters(globals())

# %%
from kanlib import guidelines, report

g = guidelines.from_out_dir(out_dir, code=code, target_efficiency=target_efficiency,
                            memory_budget_bytes=memory_budget_gib * 2**30, step_time_budget_s=step_time_budget_s,
                            val_loss_tolerance=val_loss_tolerance, bench_time_col=bench_time_col,
                            disturbed=disturbed)
print(guidelines.summary(g))
g

# %%
path = report.build_report(out_dir, guidelines=g, code=code, bench_time_col=bench_time_col,
                           val_loss_tolerance=val_loss_tolerance, disturbed=disturbed)
print(f"report: {path}")
