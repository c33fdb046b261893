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
