"""RunConfig validation, CLI round trip and run keys."""

import pytest

from kanlib.config import ConfigError, RunConfig, field_docs


@pytest.mark.parametrize("kwargs,field", [
    ({"global_batch": 250, "nproc_per_node": 4}, "global_batch"),
    ({"backend": "mpi"}, "backend"),
    ({"model": "transformer"}, "model"),
    ({"device": "tpu"}, "device"),
    ({"widths": (2,)}, "widths"),
    ({"widths": (2, 0, 1)}, "widths"),
    ({"widths": (3, 4, 1)}, "widths"),  # exp_sin has 2 inputs
    ({"grid_size": 0}, "grid_size"),
    ({"steps": -1}, "steps"),
    ({"warmup_steps": 30, "steps": 30}, "warmup_steps"),
    ({"lr": 0.0}, "lr"),
    ({"nproc_per_node": 0}, "nproc_per_node"),
    ({"grid_range": (1.0, -1.0)}, "grid_range"),
    ({"backend": "nccl", "device": "cpu"}, "backend"),
    ({"global_batch": 100000}, "global_batch"),
    ({"comm_hook": "fast"}, "comm_hook"),
    ({"nccl_algo": "Tree", "backend": "gloo"}, "nccl_algo"),  # would be recorded as if used
    ({"pg_timeout_s": float("inf")}, "pg_timeout_s"),  # overflowed after launch
    ({"pg_timeout_s": float("nan")}, "pg_timeout_s"),
    ({"lr": float("nan")}, "lr"),
    ({"seed": 2e13}, "seed"),  # issue 23: passed validation and overflowed in torch's seeding
    ({"pg_timeout_s": 1e15}, "pg_timeout_s"),  # ... and in the process group's timeout
])
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(ConfigError) as e:
        RunConfig(**kwargs)
    assert str(e.value).startswith(f"{field}:")


def test_cli_round_trip_and_types():
    cfg = RunConfig(widths=(4, 8, 1), task="highdim", grid_range=(-2.0, 2.0), lr=0.5, static_graph=True,
                    nproc_per_node=2, global_batch=64)
    back = RunConfig.from_cli(cfg.to_cli())
    assert back == cfg
    assert back.run_key() == cfg.run_key()


def test_cli_rejects_unknown_and_badly_typed_keys():
    with pytest.raises(ConfigError, match="^batch_size: unknown config field"):
        RunConfig.from_cli(["--batch_size=4"])
    with pytest.raises(ConfigError, match="^steps: cannot read 'ten' as int"):
        RunConfig.from_cli(["--steps=ten"])
    with pytest.raises(ConfigError, match="^static_graph: cannot read"):
        RunConfig.from_cli(["--static_graph=maybe"])
    with pytest.raises(ConfigError, match="expected --key=value"):
        RunConfig.from_cli(["steps"])


def test_run_key_depends_on_config_not_out_dir():
    a = RunConfig(out_dir="/a")
    assert a.run_key() == RunConfig(out_dir="/b").run_key()
    assert a.run_key() != RunConfig(repeat=1).run_key()
    assert a.run_key() != a.run_key(code_version="other")
    assert a.run_dir().startswith("/a/adhoc/kan-w1x1-b1024-r0-")


def test_every_field_is_documented():
    from dataclasses import fields

    docs = field_docs()
    assert {f.name for f in fields(RunConfig)} == set(docs)
    assert all(len(d) > 10 for d in docs.values())


def test_numbers_are_coerced_so_equal_configs_share_a_run_key():
    a = RunConfig(pg_timeout_s=5, lr=1, bucket_cap_mb=25)
    b = RunConfig.from_cli(a.to_cli())
    assert isinstance(a.pg_timeout_s, float) and a == b and a.run_key() == b.run_key()
    assert RunConfig(steps=30.0).steps == 30 and isinstance(RunConfig(steps=30.0).steps, int)
    with pytest.raises(ConfigError, match="^static_graph: must be true or false"):
        RunConfig(static_graph="yes")


@pytest.mark.parametrize("kwargs,batch", [
    ({}, 1024),  # exp_sin: n_train
    ({"n_train": 1000}, 1000),  # issue 38: refused, the old default batch 1024 exceeding it
    ({"task": "diabetes", "widths": (10, 1)}, 354),  # 442 rows, 88 validate: refused before
    ({"task": "digits", "widths": (64, 10), "n_train": 5000}, 1438),  # 1797 rows, 359 validate
    ({"task": "feynman:I.6.2", "widths": (2, 1), "n_train": 300}, 300),
    ({"task": "diabetes", "widths": (10, 1), "nproc_per_node": 4}, 352),  # a multiple of the processes
    ({"n_train": 1001, "nproc_per_node": 2, "grad_accum_steps": 2}, 1000),  # ... times the micro-batches
])
def test_the_default_batch_is_the_whole_training_set(kwargs, batch):
    """L-BFGS's natural batch: global_batch=0 (the default) stands for the training rows; the config holds the number
    chosen, so the record, the run key and the command line carry it."""
    cfg = RunConfig(**kwargs)
    assert cfg.global_batch == batch
    assert RunConfig.from_cli(cfg.to_cli()) == cfg
    assert f"-b{batch}-" in cfg.run_key()


def test_the_default_batch_of_a_csv_file_counts_its_rows(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,b,y\n" + "".join(f"{i},{i % 7},{i * 2}\n" + ("\n" if i % 10 == 0 else "") for i in range(130)))
    cfg = RunConfig(task="file", data_path=str(path), widths=(2, 1), n_val=30)
    assert cfg.global_batch == 100  # 130 data rows (blank lines are not rows), 30 validate
    with pytest.raises(ConfigError, match=r"^n_val: .*d.csv has 130 rows; n_val=130 leaves none to train on$"):
        RunConfig(task="file", data_path=str(path), widths=(2, 1), n_val=130)
    with pytest.raises(ConfigError, match=r"^global_batch: 0 stands for the whole training set, 3 rows, fewer than "
                                          r"the 4 processes x 1 micro-batches"):
        RunConfig(n_train=3, nproc_per_node=4)
