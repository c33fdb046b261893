"""Every task's dataset: deterministic data, disjoint shards per rank, and the loss and evaluation the
trainer calls (synthetic tasks, Feynman equations, bundled sets, files)."""

import math

import numpy as np
import pytest
import torch

from kanlib.config import RunConfig
from kanlib.data import SyntheticRegression, make_dataset, target
from kanlib.model import build_model


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


def _file_configs(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, (300, 3))
    y = x[:, 0] * x[:, 1] - x[:, 2]
    csv_path, npz_path = tmp_path / "t.csv", tmp_path / "t.npz"
    csv_path.write_text("u,v,w,y\n" + "".join(",".join(f"{v:.6f}" for v in (*r, t)) + "\n" for r, t in zip(x, y)))
    np.savez(npz_path, x=x, y=y)
    return {"file-csv": dict(task="file", data_path=str(csv_path), widths=(3, 8, 1), n_val=60),
            "file-npz": dict(task="file", data_path=str(npz_path), widths=(3, 8, 1), n_val=60)}


TASKS = {
    "exp_sin": dict(task="exp_sin", widths=(2, 8, 1)),
    "highdim": dict(task="highdim", widths=(6, 8, 1)),
    "product": dict(task="product", widths=(2, 8, 1)),
    "feynman": dict(task="feynman:I.9.18", widths=(9, 8, 1)),
    "digits": dict(task="digits", widths=(64, 8, 10), n_val=360),
    "diabetes": dict(task="diabetes", widths=(10, 8, 1), n_val=88),
    "file-csv": None,
    "file-npz": None,
}


@pytest.mark.parametrize("name", list(TASKS))
def test_every_task_builds_shards_and_evaluates(name, tmp_path):
    kw = TASKS[name] or _file_configs(tmp_path)[name]
    cfg = RunConfig(**{"n_train": 512, "n_val": 64, "global_batch": 64, "seed": 5, **kw})
    d, again = make_dataset(cfg), make_dataset(cfg)
    assert d.in_dim == cfg.widths[0] and d.x_train.dtype == torch.float32
    assert torch.equal(d.x_train, again.x_train) and torch.equal(d.y_val, again.y_val)  # the config decides
    for step in (0, 2):  # within the first epoch of every task's training rows (>= 240)
        parts = [d.shard(step, 64, r, 2) for r in range(2)]
        glob = d.global_indices(step, 64)
        assert len(set(glob.tolist())) == 64  # disjoint slices of one global batch
        assert torch.equal(torch.cat([p[0] for p in parts]), d.x_train[glob])
        assert torch.equal(torch.cat([p[1] for p in parts]), d.y_train[glob])
    model = build_model(cfg)
    x, y = d.shard(0, 64, 0, 1)
    out = model(x)
    loss = d.loss(out, y)
    assert loss.dtype == torch.float32 and loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()  # the trainer's backward goes through it
    ev = d.evaluate(model, torch.device("cpu"))
    assert d.evaluate(model, torch.device("cpu")) == ev  # deterministic: every rank gets the same numbers
    chunked = d.evaluate(model, torch.device("cpu"), chunk=37)  # other GEMM shapes: float32 rounding only
    assert chunked["val_loss"] == pytest.approx(ev["val_loss"], rel=1e-5)
    for chunk in (37, d.n_val + 5, 3 * d.n_val + 1):  # padded: every forward the same shape, pads dropped
        padded = d.evaluate(model, torch.device("cpu"), chunk=chunk, pad=True)
        assert padded["val_loss"] == pytest.approx(ev["val_loss"], rel=1e-5)
        if ev["val_accuracy"] is not None:
            assert padded["val_accuracy"] == pytest.approx(ev["val_accuracy"])
    with pytest.raises(ValueError, match="chunk must be at least 1"):
        d.evaluate(model, torch.device("cpu"), chunk=0)
    with torch.no_grad():
        logits = model(d.x_val)
    if d.kind == "classification":
        assert d.y_train.dtype == torch.int64 and d.y_train.dim() == 1
        assert ev["val_loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, d.y_val).item(), rel=1e-5)
        assert ev["val_accuracy"] == pytest.approx((logits.argmax(1) == d.y_val).double().mean().item())
        assert 0 < d.chance_accuracy < 0.2
    else:
        assert d.kind == "regression" and d.y_train.shape == (d.n_train, 1) and d.chance_accuracy is None
        assert ev["val_loss"] == pytest.approx(torch.nn.functional.mse_loss(logits, d.y_val).item(), rel=1e-5)
        assert ev["val_accuracy"] is None
        assert d.loss(d.y_train[:8], d.y_train[:8]).item() == 0.0
