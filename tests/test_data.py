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
