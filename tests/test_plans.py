"""The studies' config builders (runners/plans.py), and the no-op-hook communication measurement on a real
2-process gloo run."""

import pytest

from kanlib.analysis import load
from kanlib.config import ConfigError, RunConfig
from kanlib.studies import communication
from runners import plans
from runners.sweep import run_sweep


def test_strong_and_weak_builders(tmp_path):
    base = RunConfig(global_batch=64, out_dir=str(tmp_path))
    s = plans.strong_scaling([1, 2, 4], base, repeats=2)
    assert [(c.world_size, c.repeat) for c in s] == [(1, 0), (2, 0), (4, 0), (1, 1), (2, 1), (4, 1)]
    assert {c.global_batch for c in s} == {64} and {c.study for c in s} == {"strong_scaling"}
    w = plans.weak_scaling([1, 2, 4], base, per_process_batches=[16])
    assert [c.global_batch for c in w] == [16, 32, 64] and all(c.local_batch == 16 for c in w)
    topo = plans.strong_scaling([4, 8], base, procs_per_node=4)
    assert [(c.nnodes, c.nproc_per_node) for c in topo] == [(1, 4), (2, 4)]
    with pytest.raises(ConfigError, match="^procs_per_node:"):
        plans.strong_scaling([6], base, procs_per_node=4)
    with pytest.raises(ConfigError, match="^repeats:"):
        plans.strong_scaling([1], base, repeats=0)


def test_a_plan_builds_its_base_from_a_mapping_with_run_configs_defaults_and_checks(tmp_path):
    """What a launch notebook passes (issue 35): a mapping of RunConfig fields, completed by RunConfig's defaults and
    checked by its own rules; a key that is no field, or one the plan sets itself, is refused naming it."""
    s = plans.strong_scaling(base={"steps": 4, "warmup_steps": 1, "out_dir": str(tmp_path)}, placements=["1x1", "1x2"],
                             global_batches=[64])
    assert [(c.steps, c.warmup_steps, c.global_batch, c.optimizer, c.lr) for c in s] == [(4, 1, 64, "lbfgs", 1.0)] * 2
    assert plans.strong_scaling(base={"global_batch": 64}, placements=["1x1"])[0].global_batch == 64  # no batch sweep
    # the base is checked at the plan's first point, not with a default the sweep replaces (16 inputs, batch 1024)
    d = plans.strong_scaling(base={"task": "digits", "n_train": 512}, placements=["1x1"], widths_list=[[64, 8, 10]],
                             global_batches=[256])
    assert [(c.widths, c.global_batch, c.n_train) for c in d] == [((64, 8, 10), 256, 512)]
    with pytest.raises(ConfigError, match=r"^config: 'stpes' is not a RunConfig field \(did you mean 'steps'\?\); "
                                          r"its fields: study, model, "):
        plans.strong_scaling(base={"stpes": 4}, placements=["1x1"])
    with pytest.raises(ConfigError, match="^warmup_steps: must be smaller than steps=4, got 4$"):  # RunConfig's rule
        plans.weak_scaling(base={"steps": 4, "warmup_steps": 4}, placements=["1x1"])
    with pytest.raises(ConfigError, match=r"^config: 'global_batch' is set by the plan \(global_batches\); set it "
                                          r"there, not in config$"):
        plans.strong_scaling(base={"global_batch": 64}, placements=["1x1"], global_batches=[128])
    with pytest.raises(ConfigError, match=r"^config: 'kan_impl' is set by the plan \(impls\)"):
        plans.compounding({"kan_impl": "fast"}, placements=["1x1"])
    with pytest.raises(ConfigError, match=r"^config: 'model' is set by the plan \(model_size: a B-spline KAN"):
        plans.model_size([8], {"model": "kan_rbf"})  # was silently replaced by kan
    with pytest.raises(ConfigError, match=r"^config: 'nnodes' is set by the plan \(placements\)"):
        plans.communication(base={"nnodes": 2, "optimizer": "adam"}, placements=["1x2"])
    with pytest.raises(ConfigError, match="^target_val_loss: time to accuracy trains to a target validation loss"):
        plans.time_to_accuracy({}, placements=["1x1"])
    t = plans.time_to_accuracy({"target_val_loss": 0.1, "eval_every": 10, "lr_warmup_steps": 3}, placements=["1x1"])
    assert [(c.target_val_loss, c.eval_every, c.lr_warmup_steps) for c in t] == [(0.1, 10, 3)]


def test_settings_put_base_config_under_config_and_name_where_a_bad_key_came_from():
    """base_config (the notebook's tiny defaults, or a parameter set's launch.yaml) under config (the notebook's own);
    a string is read as the command line reads it (YAML reads 1e-3 as a string)."""
    got = plans.settings({"steps": 10, "optimizer": "adam"}, {"steps": 40, "lr": "1e-3", "widths": "2,8,1"},
                         out_dir="o")
    assert got == {"steps": 40, "optimizer": "adam", "lr": 0.001, "widths": (2, 8, 1), "out_dir": "o"}
    with pytest.raises(ConfigError, match=r"^base_config: 'stepz' is not a RunConfig field \(did you mean 'steps'"):
        plans.settings({"stepz": 1}, {})
    with pytest.raises(ConfigError, match=r"^config: expected a mapping of RunConfig fields, e\.g\. \{'steps': 40\}, "
                                          r"got \[\('steps', 4\)\]$"):
        plans.settings({}, [("steps", 4)])
    with pytest.raises(ConfigError, match=r"^lr: cannot read 'fast' as float$"):
        plans.settings({}, {"lr": "fast"})


def test_communication_builder_pairs_timed_and_noop(tmp_path):
    base = RunConfig(global_batch=64, out_dir=str(tmp_path), optimizer="adam")  # lbfgs has no no-op twin
    c = plans.communication([2, 4], base, bucket_caps_mb=[1, 25])
    assert len(c) == 8 and sum(x.comm_hook == "noop" for x in c) == 4
    assert len({x.run_key() for x in c}) == 8


def test_model_size_builder_pairs_each_kan_with_a_matched_mlp_at_each_placement(tmp_path):
    from kanlib.model import KAN, MLP

    base = RunConfig(global_batch=64, out_dir=str(tmp_path), widths=(2, 8, 1))
    c = plans.model_size([8, 32], base, parallelisms=["ddp", "fsdp"], placements=["1x2", "2x1"])
    assert len(c) == 2 * 2 * 2 * 2  # widths x parallelisms x placements x (kan, mlp)
    assert {(x.nnodes, x.nproc_per_node) for x in c} == {(1, 2), (2, 1)}
    n_params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    for kan, mlp in zip(c[0::2], c[1::2]):  # each KAN is followed by its matched MLP, at the same point
        assert (kan.model, mlp.model) == ("kan", "mlp") and kan.widths[1] in (8, 32)
        assert (kan.nnodes, kan.nproc_per_node, kan.parallelism) == (mlp.nnodes, mlp.nproc_per_node, mlp.parallelism)
        k, m = n_params(KAN(list(kan.widths), impl="reference")), n_params(MLP(list(mlp.widths)))
        assert abs(k - m) <= 0.05 * k
    # without placements: world_size processes on one node
    assert {(x.nnodes, x.nproc_per_node) for x in plans.model_size([8], base, world_size=2)} == {(1, 2)}


def test_calibration_without_emulated_placements_benchmarks_the_machines_links(tmp_path):
    """The notebooks' CI defaults emulate nothing: no emulated DDP runs, the plain benchmark still runs."""
    from kanlib.collbench import BenchConfig

    base = RunConfig(global_batch=64, out_dir=str(tmp_path), optimizer="adam")  # lbfgs has no no-op twin
    runs, bench = plans.calibration(base, BenchConfig(out_dir=str(tmp_path)), placements=[],
                                      bench_placements=["1x2"])
    assert runs == [] and [(b.nnodes, b.nproc_per_node, b.emulate_latency_s) for b in bench] == [(1, 2, 0.0)]
    runs, bench = plans.calibration(base, BenchConfig(out_dir=str(tmp_path)), placements=["2x1"],
                                      emulate_latency_s=0.005, bench_placements=["1x2"])
    assert {(c.nnodes, c.comm_hook, c.emulate_latency_s) for c in runs} == {(2, "timed", 0.005), (2, "noop", 0.0)}
    assert sorted((b.nnodes, b.emulate_latency_s) for b in bench) == [(1, 0.0), (2, 0.005)]
    # a notebook's bench_config: BenchConfig fields, on the training runs' machine settings
    runs, bench = plans.calibration({"optimizer": "adam", "global_batch": 64, "threads": 2, "out_dir": str(tmp_path)},
                                    {"max_bytes": 1024, "iters": 3}, placements=[], bench_placements=["1x2"])
    assert [(b.out_dir, b.threads, b.max_bytes, b.iters) for b in bench] == [(str(tmp_path), 2, 1024, 3)]
    with pytest.raises(ConfigError, match=r"^bench_config: 'threads' is set by the plan"):
        plans.calibration({"optimizer": "adam"}, {"threads": 2}, placements=[], bench_placements=["1x2"])
    with pytest.raises(ConfigError, match=r"^bench_config: 'max_byte' is not a BenchConfig field \(did you mean "
                                          r"'max_bytes'\?\)"):
        plans.calibration({"optimizer": "adam"}, {"max_byte": 2}, placements=[], bench_placements=["1x2"])


@pytest.mark.slow
def test_exposed_communication_on_two_gloo_processes(tmp_path):
    base = RunConfig(widths=(2, 64, 64, 1), global_batch=128, steps=25, warmup_steps=5, n_train=2048, kan_impl="fast",
                     optimizer="adam", lr=1e-3, out_dir=str(tmp_path))
    cfgs = plans.communication([2], base, bucket_caps_mb=[0.05, 25.0])
    res = run_sweep(cfgs, progress=False, rerun_disturbed=False)
    assert res.ok, res.failures
    df = load.load_records(str(tmp_path), disturbed="keep")  # what ran, busy test machine or not
    timed = df[df["comm_hook"] == "timed"].set_index("bucket_cap_mb")
    noop = df[df["comm_hook"] == "noop"]
    assert (timed["comm_total_s"] > 0).all()
    assert noop["comm_total_s"].isna().all() and noop["n_buckets"].isna().all()  # nothing timed without network
    # the hook saw DDP's real buckets: 43k float32 gradients (172 kB) fit one 25 MiB bucket and need more
    # than one 0.05 MiB bucket (a parameter tensor is never split, so not 172/52 of them)
    assert timed.loc[25.0, "n_buckets"] == 1 and timed.loc[0.05, "n_buckets"] >= 2
    # one population, disturbed or not: with disturbed runs kept they form groups of their own, and a busy machine
    # (CI: 2 of 4 runs still disturbed) leaves a timed run without its no-op twin; what is checked here is the plumbing
    t = communication.table(df.drop(columns=["disturbed", "disturbed_why"], errors="ignore")).data
    t = t.set_index("bucket_cap_mb")
    assert (t["exposed_s"] >= 0).all() and (t["exposed_s"] <= t["comm_total_s"]).all()
    # the raw difference is kept, and clipping it into [0, total] is flagged, never silent
    assert (t["exposed_raw_s"] == t["t_allreduce_s"] - t["t_noop_s"]).all()
    assert (t["exposed_clipped"] == ~t["exposed_raw_s"].between(0, t["comm_total_s"])).all()


def test_communication_builder_runs_the_kan_beside_its_matched_mlp_in_the_same_rounds(tmp_path):
    """mlp_bucket_caps_mb: at that bucket size every placement's KAN runs beside its matched-parameter MLP (timed and
    no-op, same global batch and repeats), the two with the parameter count, so gradient bytes, within 1% (fp32: 4
    bytes each), and each repeat of both in one round and one worker group (runners/sweep.py)."""
    from kanlib.config import group_key
    from kanlib.model import build_model, count_params
    from runners.sweep import _rounds

    base = RunConfig(widths=(2, 64, 64, 1), global_batch=256, optimizer="adam", out_dir=str(tmp_path))
    c = plans.communication(base=base, placements=["1x2", "2x1"], bucket_caps_mb=[0.01, 25.0], repeats=3,
                            mlp_bucket_caps_mb=[25.0])
    mlp = [x for x in c if x.model == "mlp"]
    assert len(c) == 3 * 2 * 2 * 3 and len(mlp) == 2 * 2 * 3  # (2 KAN buckets + the MLP) x placements x hooks x rounds
    assert {x.bucket_cap_mb for x in mlp} == {25.0} and {x.widths for x in mlp} == {(2, 205, 205, 1)}
    n_kan, n_mlp = count_params(build_model(base.replace(kan_impl="reference"))), count_params(build_model(mlp[0]))
    assert (n_kan, n_mlp) == (42880, 43051) and abs(n_mlp - n_kan) <= 0.01 * n_kan
    for m in mlp:
        [kan] = [x for x in c if x.model == "kan" and (x.nnodes, x.nproc_per_node, x.bucket_cap_mb, x.comm_hook,
                                                        x.repeat) == (m.nnodes, m.nproc_per_node, 25.0, m.comm_hook,
                                                                      m.repeat)]
        assert (kan.global_batch, kan.steps, kan.emulate_latency_s) == (m.global_batch, m.steps, m.emulate_latency_s)
        assert group_key(kan) == group_key(m)  # one worker group: run back to back
    assert [(r, sum(x.model == "mlp" for x in cs)) for r, cs in _rounds(c)] == [(0, 4), (1, 4), (2, 4)]
    # a bucket size only the twins name adds the KAN's runs there too
    c = plans.communication(base=base, placements=["1x2"], bucket_caps_mb=[0.01], mlp_bucket_caps_mb=[25.0])
    assert sorted((x.model, x.bucket_cap_mb, x.comm_hook) for x in c) == [
        ("kan", 0.01, "noop"), ("kan", 0.01, "timed"), ("kan", 25.0, "noop"), ("kan", 25.0, "timed"),
        ("mlp", 25.0, "noop"), ("mlp", 25.0, "timed")]
    with pytest.raises(ConfigError, match="^mlp_bucket_caps_mb: the study's model is already the MLP"):
        plans.communication(base=base.replace(model="mlp"), placements=["1x2"], mlp_bucket_caps_mb=[25.0])
