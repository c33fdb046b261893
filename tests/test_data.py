"""Deterministic synthetic data, disjoint shards per rank."""

import math

import torch

from kanlib.data import SyntheticRegression, target


def test_shards_are_disjoint_and_cover_the_global_batch():
    d = SyntheticRegression("exp_sin", 2, n_train=1000, n_val=100, seed=3)
    for step in (0, 3, 7):  # step 7 crosses an epoch boundary (7 * 128 > 1000 - 128)
        glob = d.global_indices(step, 128)
        assert glob.numel() == 128
        parts = [d.shard(step, 128, r, 4)[0] for r in range(4)]
        assert torch.equal(torch.cat(parts), d.x_train[glob])
    assert len(set(d.global_indices(3, 128).tolist())) == 128  # within one epoch: no repeats
    first_epoch = torch.cat([d.global_indices(s, 128) for s in range(8)])[:1000]
    assert sorted(first_epoch.tolist()) == list(range(1000))  # an epoch visits every sample once


def test_same_seed_same_data_other_seed_other_data():
    a, b = SyntheticRegression("highdim", 5, 256, 32, 1), SyntheticRegression("highdim", 5, 256, 32, 1)
    c = SyntheticRegression("highdim", 5, 256, 32, 2)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.global_indices(2, 64), b.global_indices(2, 64))
    assert not torch.equal(a.x_train, c.x_train)
    assert a.x_val.shape == (32, 5) and not torch.equal(a.x_val, a.x_train[:32])


def test_targets():
    x = torch.tensor([[0.5, 0.0], [0.0, 1.0]])
    assert torch.allclose(target("exp_sin", x)[:, 0], torch.tensor([math.e, math.e]))
    assert torch.allclose(target("product", x)[:, 0], torch.tensor([0.0, 0.0]))
    ones = torch.ones(1, 100)
    assert torch.allclose(target("highdim", ones), torch.tensor([[math.e]]))


# -- real data from a file -------------------------------------------------------------------
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from kanlib.config import ConfigError, RunConfig  # noqa: E402
from kanlib.data import FileRegression, make_dataset  # noqa: E402


def write_csv(path, n=300, seed=0):
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(0, 10, n), rng.uniform(-5, 5, n)
    price = 3 * a - b ** 2 + rng.normal(0, 0.1, n)
    with open(path, "w") as f:
        f.write("rooms,age,price\n")
        for row in zip(a, b, price):
            f.write(",".join(f"{v:.6f}" for v in row) + "\n")
    return a, b, price


def test_csv_split_scaling_and_determinism(tmp_path):
    path = str(tmp_path / "houses.csv")
    write_csv(path)
    d = FileRegression(path, "price", n_train=1000, n_val=50, seed=3)
    assert d.feature_names == ["rooms", "age"] and d.in_dim == 2
    assert (d.n_train, d.n_val) == (250, 50)
    assert d.x_train.min().item() == pytest.approx(-1) and d.x_train.max().item() == pytest.approx(1)
    assert d.y_train.mean().item() == pytest.approx(0, abs=1e-6) and d.y_train.std().item() == pytest.approx(1, rel=1e-5)
    again = FileRegression(path, "price", n_train=1000, n_val=50, seed=3)
    assert torch.equal(d.x_val, again.x_val)
    other = FileRegression(path, "price", n_train=1000, n_val=50, seed=4)
    assert not torch.equal(d.x_val, other.x_val)
    capped = FileRegression(path, "", n_train=100, n_val=50, seed=3)  # default target: last column
    assert capped.n_train == 100 and torch.equal(capped.y_val.argsort(0), d.y_val.argsort(0))  # same rows
    # shards are disjoint slices of each global batch, as for synthetic data
    parts = [d.shard(2, 64, r, 2)[0] for r in range(2)]
    assert torch.equal(torch.cat(parts), d.x_train[d.global_indices(2, 64)])


def test_npz_and_bad_files(tmp_path):
    npz = str(tmp_path / "d.npz")
    np.savez(npz, x=np.arange(40.0).reshape(20, 2), y=np.arange(20.0))
    assert FileRegression(npz, "", n_train=100, n_val=5, seed=0).n_train == 15
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,y\n1,2,3\n4,oops,6\n")
    with pytest.raises(ValueError, match=r"bad.csv: data row 2 \(line 3 of the file\) has a missing or non-numeric"):
        FileRegression(str(bad), "y", 10, 1, 0)
    with pytest.raises(ValueError, match="no target column 'z'"):
        FileRegression(str(bad), "z", 10, 1, 0)
    with pytest.raises(ValueError, match="^n_val: 20 validation rows leave none"):
        FileRegression(npz, "", 10, 20, 0)


def test_file_task_config_errors_name_the_field(tmp_path):
    from runners.launch import check_environment

    path = str(tmp_path / "h.csv")
    write_csv(path)
    with pytest.raises(ConfigError, match="^data_path: task 'file' needs"):
        RunConfig(task="file")
    with pytest.raises(ConfigError, match="^data_path: no such file"):
        RunConfig(task="file", data_path=str(tmp_path / "missing.csv"))
    with pytest.raises(ConfigError, match="^data_path: only task 'file'"):
        RunConfig(data_path=path)
    with pytest.raises(ConfigError, match=r"^widths: .*h.csv has 2 features \(rooms, age\), but widths\[0\]=3"):
        check_environment(RunConfig(task="file", data_path=path, widths=(3, 4, 1), n_val=50))
    with pytest.raises(ConfigError, match="^data_path: .*no target column 'cost'"):
        check_environment(RunConfig(task="file", data_path=path, target="cost", widths=(2, 4, 1)))
    with pytest.raises(ValueError, match="^global_batch: 512 exceeds the 250 training rows"):
        make_dataset(RunConfig(task="file", data_path=path, n_val=50, global_batch=512, widths=(2, 4, 1)))


def test_training_on_a_file_learns(tmp_path):
    from kanlib.train import train

    path = str(tmp_path / "h.csv")
    write_csv(path, n=2000)
    cfg = RunConfig(task="file", data_path=path, target="price", widths=(2, 8, 1), n_val=200, global_batch=128,
                    steps=150, warmup_steps=5, lr=1e-2, out_dir=str(tmp_path / "out"))
    rec = train(cfg).to_dict()
    assert rec["task"] == "file" and rec["data_path"] == path
    assert rec["final_val_loss"] < 0.05  # standardised target: 1.0 is the mean predictor
