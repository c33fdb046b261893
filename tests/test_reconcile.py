"""The same model at the same placement measured by several studies: found, each efficiency listed with its
interval and the work per process, every other setting that differs named, and where the difference lies said."""

import pytest

from synthetic import default_study_overlap, write_records

from kanlib.analysis.context import Context
from kanlib.analysis.reconcile import COLUMNS, reconcile


def test_the_same_model_in_strong_and_weak_scaling_at_1x2_is_found_with_what_differs(full_study_dir):
    t, lines = reconcile(Context(str(full_study_dir)))
    assert list(t.columns) == COLUMNS
    at = t[(t["model"] == "kan") & (t["placement"] == "1x2")]
    assert {"strong_scaling", "weak_scaling", "compounding", "time_to_accuracy"} <= set(at["study"])
    assert at["set"].nunique() == 1 and (at["kernel"] == "fast").all()
    assert all(list(w) == [2, 8, 1] for w in at["widths"])
    weak = at[at["study"] == "weak_scaling"].iloc[0]
    assert weak["efficiency"] == pytest.approx(1600 / 2000)  # E_w from weak_records: 1600 / (2 x 1000)
    assert weak["local_batch"] == 64 and weak["baseline_batch"] == 64
    strong = at[(at["study"] == "strong_scaling") & (at["global_batch"] == 512)].iloc[0]
    assert strong["efficiency"] == pytest.approx(8.0 / 4.4 / 2) and strong["local_batch"] == 256
    # the one-process compute of a process's share: the median T(1) of 8, 8.08 and 8.16 s over 2
    assert strong["baseline_batch"] == 512 and strong["work_per_process_s"] == pytest.approx(8.08 / 2)
    assert "global_batch" in at["differs"].iloc[0].split(", ")
    assert "global_batch=128" in weak["values"] and "global_batch=512" in strong["values"]
    # the MLP is in weak scaling only: nothing to reconcile; compounding's reference kernel is another model
    assert "mlp" not in set(t["model"]) and "reference" not in set(t["kernel"])
    assert any(s.startswith("kan, widths [2, 8, 1], grid 5, order 3, kernel fast at 1x2 is measured by 4 studies")
               for s in lines)


def test_what_the_default_study_measured_at_1x2_is_reconciled(tmp_path):
    write_records(tmp_path, default_study_overlap())
    t, lines = reconcile(Context(str(tmp_path)))
    assert set(t["placement"]) == {"1x2"} and t["set"].nunique() == 1  # [2, 32, 32, 1]: strong scaling only
    e = t.set_index("study")
    assert e.loc["strong_scaling", "efficiency"] == pytest.approx(0.76)
    assert e.loc["weak_scaling", "efficiency"] == pytest.approx(0.174 / 0.200)
    assert e.loc["compounding", "efficiency"] == pytest.approx(0.400 / 0.215 / 2)
    assert e.loc["compounding", "n_runs"] == 1
    assert e["local_batch"].to_dict() == {"strong_scaling": 4096, "weak_scaling": 2048, "compounding": 2048}
    assert e.loc["strong_scaling", "baseline_per_sample_s"] == pytest.approx(0.800 * 1.02 / 8192)  # median of 5 runs
    assert set(e["differs"].iloc[0].split(", ")) == {"global_batch", "steps", "warmup_steps"}
    assert e.loc["compounding", "values"] == "global_batch=4096; steps=12; warmup_steps=3"
    text = " ".join(lines)
    assert lines[0].startswith("kan, widths [32, 128, 128, 1], grid 5, order 3, kernel compiled, fp32 at 1x2 is "
                               "measured by 3 studies: strong_scaling (global batch 8192) 76% [")
    # strong scaling's processes each do twice the weak ones' samples, yet its efficiency is lower
    assert "the efficiency does not rise with it, so the work per process does not explain the difference" in text
    assert "Other settings that differ between them: global_batch 8192 in strong_scaling (global batch 8192), " in text
    assert "steps 72 in strong_scaling (global batch 8192), 80 in weak_scaling (2048 per process), 12 in compounding" \
        in text
    assert "Fewer than 5 runs (an interval that means little): compounding (kernel compiled) 1." in text


def test_nothing_to_reconcile_gives_an_empty_table(tmp_path):
    write_records(tmp_path, [r for r in default_study_overlap() if r["study"] == "strong_scaling"])
    t, lines = reconcile(Context(str(tmp_path)))
    assert t.empty and list(t.columns) == COLUMNS and lines == []
