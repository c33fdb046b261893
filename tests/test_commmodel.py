"""The alpha-beta all-reduce model: formulas, fit, extrapolation."""

import numpy as np
import pandas as pd
import pytest

from kanlib import commmodel


def test_ring_and_tree_formulas():
    # ring, 4 ranks, 1 bucket of 1e6 bytes: 6 alpha + 1.5e6 beta
    assert commmodel.allreduce_time(4, 1e6, 1e-5, 1e-9) == pytest.approx(6e-5 + 1.5e-3)
    # tree, 8 ranks: 2*3 alpha + 2e6 beta
    assert commmodel.allreduce_time(8, 1e6, 1e-5, 1e-9, "tree") == pytest.approx(6e-5 + 2e-3)
    assert commmodel.allreduce_time(1, 1e6, 1e-5, 1e-9) == 0
    with pytest.raises(ValueError, match="^algo: unknown value 'mesh'"):
        commmodel.allreduce_time(2, 1, 1, 1, "mesh")


def synthetic(alpha, beta, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for n in (2, 4, 8):
        for buckets in (1, 4, 16):
            for params in (1e4, 1e6):
                t = commmodel.allreduce_time(n, params * 4, alpha, beta, n_buckets=buckets)
                rows.append({"world_size": n, "n_buckets": buckets, "n_params": params, "comm_hook": "timed",
                             "comm_total_s": t * (1 + noise * rng.standard_normal())})
    rows.append({"world_size": 2, "n_buckets": None, "n_params": 1e4, "comm_hook": "noop", "comm_total_s": None})
    return pd.DataFrame(rows)


def test_fit_recovers_alpha_and_beta():
    m = commmodel.fit(synthetic(2e-5, 4e-10))
    assert m.alpha == pytest.approx(2e-5, rel=1e-6) and m.beta == pytest.approx(4e-10, rel=1e-6)
    assert m.n_points == 18 and m.rel_rmse < 1e-9
    noisy = commmodel.fit(synthetic(2e-5, 4e-10, noise=0.05))
    assert noisy.alpha == pytest.approx(2e-5, rel=0.2) and noisy.beta == pytest.approx(4e-10, rel=0.2)
    with pytest.raises(ValueError, match="at least 2 timed multi-process runs"):
        commmodel.fit(synthetic(1e-5, 1e-9).iloc[-1:])


def test_extrapolation_efficiency_falls_and_overlap_helps():
    m = commmodel.CommModel(alpha=1e-5, beta=1e-9)
    n = commmodel.powers_of_two(4096)
    assert n[0] == 1 and n[-1] == 4096
    p0 = commmodel.extrapolate(m, compute_1_s=1.0, n_params=10_000_000, world_sizes=n)
    p1 = commmodel.extrapolate(m, compute_1_s=1.0, n_params=10_000_000, world_sizes=n, overlap_fraction=0.8)
    assert p0["efficiency"].iloc[0] == pytest.approx(1.0)
    assert (np.diff(p0["efficiency"]) < 0).all()
    assert (p1["efficiency"].iloc[1:] > p0["efficiency"].iloc[1:]).all()
    n80 = commmodel.largest_world_size_at(p0, 0.8)
    assert p0.set_index("world_size").loc[n80, "efficiency"] >= 0.8
    assert p0.set_index("world_size").loc[n80 * 2, "efficiency"] < 0.8
