"""Time to accuracy: strong and weak series found in one folder, runs that miss the target counted not averaged,
curves from each run's steps.csv, and the guideline naming the placement that reaches the target soonest."""

import os

import pytest

from synthetic import tta_rec, tta_records, tta_run, write_records, write_steps, write_tta_runs

from kanlib import guidelines
from kanlib.analysis import load
from kanlib.analysis.context import Context
from kanlib.studies import time_to_accuracy


def test_time_to_accuracy_finds_strong_and_weak_series_in_one_folder(tmp_path):
    write_records(tmp_path, tta_records())
    tab = time_to_accuracy.table(load.load_records(str(tmp_path)))
    t = tab.data
    strong = t[t["series"] == "strong"].set_index("placement")
    assert list(strong.index) == ["1x1", "1x2", "2x1"] and (strong["series_batch"] == 256).all()
    assert strong.loc["1x2", "time_speedup"] == pytest.approx(10 / 5.5, rel=1e-6)
    assert strong.loc["1x2", "time_speedup"] == pytest.approx(strong.loc["1x2", "step_speedup"], rel=1e-9)
    assert strong.loc["2x1", "time_speedup"] == pytest.approx(1.6, rel=1e-6)
    lo, hi = strong.loc["1x2", ["time_speedup_lo", "time_speedup_hi"]]
    assert lo < strong.loc["1x2", "time_speedup"] < hi  # repeats differ by 1-2%: a real interval
    assert strong.loc["1x1", "time_to_target_s"] == pytest.approx(1.01)  # median of 1.00, 1.01, 1.02 s
    weak = t[t["series"] == "weak"].set_index(["lr_rule", "placement"])
    assert weak.loc[("none", "1x2"), "statistical_efficiency"] == pytest.approx(6400 / 9600)
    assert weak.loc[("linear", "1x2"), "statistical_efficiency"] == pytest.approx(1.0)
    assert weak.loc[("none", "1x1"), "statistical_efficiency"] == 1.0
    assert weak.loc[("none", "1x2"), "global_batch"] == 128 and weak.loc[("none", "1x2"), "local_batch"] == 64
    # the strong rows never mix in the weak runs, nor the other way round
    assert (t.loc[t["series"] == "strong", "global_batch"] == 256).all()
    assert set(t.loc[t["series"] == "weak", "local_batch"]) == {64}
    assert tab.groups == ["model", "lr_rule"]


def test_runs_that_miss_the_target_are_counted_not_averaged(tmp_path):
    recs = [tta_rec("1x1", 256, 100, 0.01, repeat=r) for r in range(2)]
    recs += [tta_rec("1x2", 256, 100, 0.0055, repeat=0), tta_rec("1x2", 256, 100, 0.0055, repeat=1, reached=False)]
    write_records(tmp_path, recs)
    t = time_to_accuracy.table(load.load_records(str(tmp_path))).data.set_index("placement")
    assert t.loc["1x2", "n_reached"] == 1 and t.loc["1x2", "n_runs"] == 2 and not t.loc["1x2", "all_reached"]
    assert t.loc["1x2", "time_to_target_s"] == pytest.approx(0.55)  # the run that reached it; never NaN-pooled
    g = guidelines.from_out_dir(str(tmp_path))
    row = g.table[g.table["basis"] == "time_to_accuracy"].iloc[0]
    # 1x2 is faster but only 1 of 2 runs got there: the placement whose every run did is recommended
    assert row["answer"].startswith("1x1 (1 node(s) x 1): 1 s [")
    assert any("1x2 0.55 s (1/2 reached)" in s for s in g.sentences)


def test_guideline_names_the_placement_that_reaches_the_target_soonest(tmp_path):
    write_records(tmp_path, tta_records())
    g = guidelines.from_out_dir(str(tmp_path))
    t = g.table[g.table["basis"] == "time_to_accuracy"].set_index("group")["answer"]
    assert t["kan, lr_rule=none, strong (global batch 256)"].startswith("1x2 (1 node(s) x 2): 0.555 s [0.55, 0.561]")
    assert t["kan, lr_rule=linear, weak (64 samples per process)"].startswith("1x2 (1 node(s) x 2): 0.253 s")
    assert "0.02 (3/3 runs)" in t["kan, lr_rule=none, strong (global batch 256)"]


def test_a_placement_only_just_outside_the_best_ones_interval_is_tied(tmp_path):
    # two runs each, as the default study has: 1x1 took 68 and 77 ms, 1x2 79 and 92 ms (its two step-time modes).
    # The ranges do not touch, but 1x2's starts within 10% of 1x1's end: the next study run may rank them the
    # other way, so neither is named.
    recs = [tta_rec("1x1", 128, 30, t / 30, repeat=0) for t in (0.068,)] + [tta_rec("1x1", 128, 30, 0.077 / 30 / 1.01, repeat=1)]
    recs += [tta_rec("1x2", 128, 30, 0.079 / 30, repeat=0), tta_rec("1x2", 128, 30, 0.092 / 30 / 1.01, repeat=1)]
    write_records(tmp_path, recs)
    t = guidelines.from_out_dir(str(tmp_path)).table
    ans = t[t["basis"] == "time_to_accuracy"]["answer"].iloc[0]
    assert guidelines.decision(ans) == "no measurable difference between 1x1, 1x2"
    # 1x2 far slower (its runs start 30% above 1x1's last): 1x1 is named
    recs[2:] = [tta_rec("1x2", 128, 30, 0.100 / 30, repeat=0), tta_rec("1x2", 128, 30, 0.110 / 30 / 1.01, repeat=1)]
    write_records(tmp_path / "apart", recs)
    t = guidelines.from_out_dir(str(tmp_path / "apart")).table
    assert guidelines.decision(t[t["basis"] == "time_to_accuracy"]["answer"].iloc[0]) == "1x1 (1 node(s) x 1)"


def test_val_curves_come_from_each_runs_steps_csv(tmp_path):
    write_records(tmp_path, [tta_rec("1x1", 256, 20, 0.01), tta_rec("1x2", 256, 20, 0.005)])
    df = load.load_records(str(tmp_path))
    for _, r in df.iterrows():
        rows = [{"step": s, "step_time_s": r["step_time_s"], "val_loss": 1.0 / (s + 1) if (s + 1) % 10 == 0 else ""}
                for s in range(20)]
        write_steps(os.path.dirname(r["record_path"]), rows)
    c, missing = time_to_accuracy.val_curves(df)
    one = c[c["placement"] == "1x1"].sort_values("steps")
    assert one["steps"].tolist() == [10, 20] and one["samples"].tolist() == [2560, 5120]
    assert one["val_loss"].tolist() == pytest.approx([0.1, 0.05])
    assert one["train_time_s"].tolist() == pytest.approx([0.1, 0.2])  # cumulative step time up to the evaluation
    assert missing == []
    os.remove(os.path.join(os.path.dirname(df["record_path"].iloc[0]), "steps.csv"))
    assert len(time_to_accuracy.val_curves(df)[1]) == 1


def test_compilation_is_kept_out_of_the_time_to_target(tmp_path):
    # what one default study recorded: the first run of a worker group compiles in its first step (4.69 s, 3.28 s),
    # the steps after it take milliseconds. Every run here takes 100 steps of 10 ms (1x1) or 5.5 ms (1x2).
    runs = [tta_run("1x1", 100, 0.010, first_s=4.69 if r == 0 else None, compile_s=4.6 if r == 0 else 0.0,
                    repeat=r) for r in range(3)]
    runs += [tta_run("1x2", 100, 0.0055, first_s=3.28 if r == 0 else None, compile_s=3.2 if r == 0 else 0.0,
                     repeat=r) for r in range(3)]
    write_tta_runs(tmp_path, runs)
    df = time_to_accuracy.without_warmup(load.load_records(str(tmp_path)))
    assert df["recorded_time_to_target_s"].max() == pytest.approx(4.69 + 99 * 0.010)
    # a run whose first step compiled for seconds gets the time of the same run whose kernels were compiled
    assert sorted(df["time_to_target_s"]) == pytest.approx(sorted(100 * t * (1 + 0.01 * r) for t in (0.010, 0.0055)
                                                                  for r in range(3)))
    assert (df["warmup_kept"] == "").all()
    t = time_to_accuracy.table(load.load_records(str(tmp_path))).data.set_index("placement")
    assert t.loc["1x1", "time_to_target_s"] == pytest.approx(1.01)  # median of 1.00, 1.01, 1.02 s
    assert t.loc["1x1", "time_to_target_hi"] == pytest.approx(1.02)  # not 5.68 s: no compilation in the interval
    assert t.loc["1x2", "time_speedup"] == pytest.approx(t.loc["1x2", "step_speedup"], rel=1e-9)
    assert t.loc["1x2", "n_warmup_kept"] == 0


def test_a_run_whose_compilation_cannot_be_kept_out_is_named(tmp_path):
    runs = [tta_run("1x1", 100, 0.010, repeat=0),
            # the first evaluation compiles its no-grad graph (0.15-0.34 s measured here), outside the timed
            # region: compile_s beyond the warm-up alone names nothing
            tta_run("1x1", 100, 0.010, first_s=4.0, compile_s=4.3, repeat=1),
            # no steps.csv: the warm-up cannot be told apart
            tta_run("1x1", 100, 0.010, first_s=4.0, compile_s=3.9, repeat=2),
            # resumed: each attempt warmed up again
            tta_run("1x2", 100, 0.0055, first_s=3.0, compile_s=2.9, repeat=0, attempts=(0, 1)),
            # compiled again in measured step 40 (a shape changed): 3 s of compile_s beyond the warm-up, in step 40
            tta_run("1x2", 100, 0.0055, first_s=2.0, compile_s=5.0, slow_step=(40, 3.0), repeat=1),
            tta_run("1x2", 100, 0.0055, repeat=2)]
    dirs = write_tta_runs(tmp_path, runs, without_steps=(2,))
    names = [os.path.basename(d) for d in dirs]
    df = load.load_records(str(tmp_path))
    out = time_to_accuracy.without_warmup(df).set_index(df["record_path"].map(lambda p: p.split(os.sep)[-2]))
    assert out.loc[names[1], "warmup_kept"] == "" and out.loc[names[1], "time_to_target_s"] == pytest.approx(1.01)
    assert out.loc[names[2], "warmup_kept"] == "no steps.csv: its warm-up steps cannot be told apart"
    assert out.loc[names[3], "warmup_kept"].startswith("resumed (attempts 0, 1)")
    assert out.loc[names[4], "warmup_kept"].startswith("compiled after the warm-up: compile_s 5 s")
    assert "measured step 40 took 3 s" in out.loc[names[4], "warmup_kept"]
    for i in (2, 3, 4):  # the recorded time, compilation and all, is kept
        assert out.loc[names[i], "time_to_target_s"] == pytest.approx(runs[i][0]["time_to_target_s"])
    t = time_to_accuracy.table(df).data.set_index("placement")
    assert t.loc["1x1", "n_warmup_kept"] == 1 and t.loc["1x2", "n_warmup_kept"] == 2
    assert names[2] in t.loc["1x1", "warmup_kept"] and names[1] not in t.loc["1x1", "warmup_kept"]
    lines = time_to_accuracy.analyze(Context.from_frame(df)).lines
    named = [s for s in lines if "could not be taken out" in s]
    assert len(named) == 2 and all(n in " ".join(named) for n in (names[2], names[3], names[4]))
    assert "1x2: the time to target of 2 of 3 run(s) still holds its warm-up and compilation" in named[1]
    shown = time_to_accuracy.display_table(time_to_accuracy.table(df)).set_index("placement")
    assert shown.loc["1x2", "warm-up taken out (s)"].endswith("kept in 2 run(s), named below")


@pytest.mark.slow
def test_the_default_studys_target_takes_more_than_a_few_dozen_steps(tmp_path):
    """Each distinct run of the default study (notebooks/params/study: strong at global batch 128, weak at 64 per
    process with the linear rule), trained as the notebook plans it, reaches its target only after 80 steps or more:
    a target reached in 20-30 steps timed a few steps' noise and the compilation. One process each (a 1x2 run's
    curve is the same to 4 decimals: the same global batch and seed) and the fast kernel (the compiled one gives the
    same curve and only adds its compilation)."""
    import yaml

    from test_notebooks import planned_configs

    from kanlib.train import train

    d = os.path.join(os.path.dirname(__file__), "..", "notebooks", "params", "study")
    params = {**yaml.safe_load(open(os.path.join(d, "launch.yaml"))),
              **yaml.safe_load(open(os.path.join(d, "07_time_to_accuracy.yaml"))), "out_dir": str(tmp_path)}
    distinct = {(c.global_batch, c.lr_rule, c.lr_base_batch): c for c in planned_configs("07_time_to_accuracy", params)}
    assert len(distinct) == 3  # strong 128 (1x1 and 1x2), weak 64 (1x1) and weak 128 with the linear rule (1x2)
    steps = {}
    for key, c in distinct.items():
        rec = train(c.replace(nnodes=1, nproc_per_node=1, kan_impl="fast", repeat=0, backend="gloo"))
        assert rec.reached_target, (key, rec.final_val_loss)
        steps[key] = rec.steps_to_target
    assert min(steps.values()) >= 80, steps



def test_the_gpu_cluster_target_is_well_below_what_a_constant_prediction_gets(tmp_path):
    """highdim's target is not standardised (variance about 0.005): a target above a constant prediction's
    validation loss is met at the first evaluation, before anything is learnt. Every run the gpu_cluster set plans
    must ask for a quarter of it or less (measured on CPU, its curve meets the set's target at step 250: the yaml)."""
    import torch
    import yaml

    from test_notebooks import planned_configs

    from kanlib.data import make_dataset

    d = os.path.join(os.path.dirname(__file__), "..", "notebooks", "params", "gpu_cluster")
    params = {**yaml.safe_load(open(os.path.join(d, "launch.yaml"))),
              **yaml.safe_load(open(os.path.join(d, "07_time_to_accuracy.yaml"))), "out_dir": str(tmp_path)}
    runs = planned_configs("07_time_to_accuracy", params)
    data = make_dataset(runs[0].replace(device="cpu", backend="gloo"))
    constant = float(torch.nn.functional.mse_loss(data.y_val, data.y_train.mean().expand_as(data.y_val)))
    assert 0.003 < constant < 0.008  # exp(mean of 64 sin^2): about 0.005
    assert {(c.task, c.n_val, c.seed) for c in runs} == {(data.task, data.n_val, runs[0].seed)}
    assert max(c.target_val_loss for c in runs) <= constant / 4, (constant, runs[0].target_val_loss)
