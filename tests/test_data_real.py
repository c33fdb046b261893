"""Real data with no download: scikit-learn's bundled digits and diabetes, and the Feynman equations
(formulas checked by hand at a few points, ranges as in the AI Feynman suite); check_task for every task."""

import math

import pytest
import torch

from kanlib.config import ConfigError, RunConfig
from kanlib.data import BUNDLED, FeynmanRegression, check_task, make_dataset
from kanlib.feynman import FEYNMAN

PI = math.pi


# -- Feynman equations -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, values, expected", [
    ("I.6.2", dict(sigma=2, theta=2), math.exp(-0.5) / (math.sqrt(2 * PI) * 2)),       # 0.120985
    ("I.6.2b", dict(sigma=1, theta=3, theta1=1), math.exp(-2) / math.sqrt(2 * PI)),     # 0.053991
    ("I.9.18", dict(m1=2, m2=3, G=1, x1=4, x2=1, y1=3, y2=1, z1=3, z2=2), 6 / 14),      # 6 / (9 + 4 + 1)
    ("I.12.11", dict(q=2, Ef=3, B=4, v=5, theta=PI / 2), 46.0),                          # 2 (3 + 20 sin 90deg)
    ("I.13.12", dict(m1=2, m2=3, r1=2, r2=1, G=1), 3.0),                                 # 6 (1 - 1/2)
    ("I.15.3x", dict(x=10, u=1, c=2, t=2), 8 / math.sqrt(0.75)),                         # (10 - 2) / sqrt(1 - 1/4)
    ("I.16.6", dict(c=2, v=4, u=3), 1.75),                                               # 7 / (1 + 12/4)
    ("I.18.4", dict(m1=1, m2=3, r1=2, r2=4), 3.5),                                       # (2 + 12) / 4
    ("I.26.2", dict(n=0.5, theta2=PI / 2), PI / 6),                                      # arcsin(1/2)
    ("I.27.6", dict(d1=2, d2=4, n=2), 1.0),                                              # 1 / (1/2 + 1/2)
    ("I.29.16", dict(x1=3, x2=4, theta1=PI / 2, theta2=0), 5.0),                         # sqrt(9 + 16 - 0)
    ("I.30.3", dict(Int_0=2, theta=PI / 2, n=2), 4.0),                                   # 2 sin^2(90) / sin^2(45)
    ("I.30.5", dict(lambd=1, d=2, n=1), PI / 6),                                         # arcsin(1/2)
    ("I.37.4", dict(I1=1, I2=4, delta=0), 9.0),                                          # 1 + 4 + 2 sqrt(4)
    ("I.40.1", dict(n_0=2, m=1, x=1, T=1, g=1, kb=1), 2 / math.e),
    ("I.44.4", dict(n=1, kb=1, T=2, V1=1, V2=math.e), 2.0),                              # 2 ln e
    ("I.50.26", dict(x1=2, omega=PI, t=1, alpha=3), 4.0),                                # 2 (cos pi + 3 cos^2 pi)
    ("II.2.42", dict(kappa=2, T1=1, T2=4, A=3, d=6), 3.0),                               # 2 * 3 * 3 / 6
    ("II.6.15a", dict(epsilon=1, p_d=4 * PI, r=1, x=3, y=4, z=1), 15.0),                 # 1 * 3 * 1 / 1 * 5
    ("II.11.17", dict(n_0=2, kb=1, T=2, theta=0, p_d=1, Ef=4), 6.0),                     # 2 (1 + 4/2)
    ("II.11.27", dict(n=1, alpha=1, epsilon=2, Ef=1), 3.0),                              # 1 / (2/3) * 2
    ("II.35.18", dict(n_0=2, kb=1, T=1, mom=1, B=1), 1 / math.cosh(1)),                  # 2 / (e + 1/e)
    ("II.36.38", dict(mom=1, H=2, kb=1, T=1, alpha=3, epsilon=1, c=1, M=2), 8.0),        # 2 + 3 * 2
    ("II.38.3", dict(Y=2, A=3, d=4, x=2), 3.0),
    ("III.9.52", dict(p_d=1, Ef=1, t=1, h=2 * PI, omega=3, omega_0=1), math.sin(1) ** 2),  # (1)(sin 1 / 1)^2
    ("III.9.52", dict(p_d=1, Ef=2, t=3, h=2 * PI, omega=2, omega_0=2), 6.0),            # the limit sin(a)/a -> 1
    ("III.10.19", dict(mom=2, Bx=1, By=2, Bz=2), 6.0),                                   # 2 * 3
    ("III.17.37", dict(beta=2, alpha=3, theta=PI), -4.0),                                # 2 (1 - 3)
])
def test_feynman_formulas_at_points_computed_by_hand(name, values, expected):
    assert float(FEYNMAN[name](**values)) == pytest.approx(expected, rel=1e-12)


def test_the_kan_papers_feynman_table_is_there_with_the_suites_ranges():
    assert len(FEYNMAN) == 27
    ranges = {n: {v: (lo, hi) for v, lo, hi in eq.variables} for n, eq in FEYNMAN.items()}
    # a few ranges of FeynmanEquations.csv, by hand
    assert ranges["I.15.3x"] == {"x": (5, 10), "u": (1, 2), "c": (3, 20), "t": (1, 2)}
    assert ranges["I.9.18"]["x1"] == (3, 4) and ranges["I.9.18"]["x2"] == (1, 2) and len(ranges["I.9.18"]) == 9
    assert ranges["I.26.2"] == {"n": (0, 1), "theta2": (1, 5)}
    assert ranges["I.30.5"] == {"lambd": (1, 2), "d": (2, 5), "n": (1, 5)}
    assert ranges["III.9.52"]["omega"] == (1, 5) and ranges["III.9.52"]["h"] == (1, 3)
    assert [v for v, _, _ in FEYNMAN["I.40.1"].variables] == ["n_0", "m", "x", "T", "g", "kb"]  # suite's order
    with pytest.raises(ValueError, match=r"I.12.11 takes q, Ef, B, v, theta; got q"):
        FEYNMAN["I.12.11"](q=1)


@pytest.mark.parametrize("name", list(FEYNMAN))
def test_feynman_data_is_the_formula_on_scaled_inputs(name):
    d = FeynmanRegression(f"feynman:{name}", n_train=400, n_val=100, seed=7)
    eq = FEYNMAN[name]
    assert d.x_train.shape == (400, eq.in_dim) and d.x_val.shape == (100, eq.in_dim)
    assert d.x_train.abs().max() <= 1 and d.x_train.min() < -0.9 and d.x_train.max() > 0.9  # fills [-1, 1]
    # undo the scaling: the variable is low + (x + 1) / 2 (high - low), and y is the standardised formula
    x = d.x_train.double()
    values = {v: lo + (x[:, i] + 1) / 2 * (hi - lo) for i, (v, lo, hi) in enumerate(eq.variables)}
    y = (eq.fn(values) - d.y_mean) / d.y_std
    assert torch.allclose(y.float(), d.y_train[:, 0], rtol=1e-4, atol=1e-4)
    assert d.y_train.mean().item() == pytest.approx(0, abs=1e-5) and d.y_train.std().item() == pytest.approx(1, 1e-4)
    assert d.feature_names == [v for v, _, _ in eq.variables]


def test_feynman_data_depends_on_the_seed_only():
    a, b = FeynmanRegression("feynman:I.6.2", 64, 16, 1), FeynmanRegression("feynman:I.6.2", 64, 16, 1)
    c = FeynmanRegression("feynman:I.6.2", 64, 16, 2)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_val, b.y_val) and not torch.equal(a.x_train, c.x_train)


# -- bundled sets ---------------------------------------------------------------------------------------
def test_bundled_sizes_match_the_installed_scikit_learn():
    from sklearn.datasets import load_diabetes, load_digits

    digits, diabetes = load_digits(), load_diabetes()
    assert (BUNDLED["digits"].rows, BUNDLED["digits"].in_dim) == digits.data.shape
    assert BUNDLED["digits"].n_classes == len(set(digits.target.tolist())) == 10
    assert (BUNDLED["diabetes"].rows, BUNDLED["diabetes"].in_dim) == diabetes.data.shape
    assert BUNDLED["diabetes"].n_classes == 0


def test_digits_split_classes_and_chance():
    cfg = RunConfig(task="digits", widths=(64, 16, 10), n_val=300, n_train=100000, global_batch=64, seed=4)
    d = make_dataset(cfg)
    assert d.kind == "classification" and (d.n_train, d.n_val) == (1497, 300)
    assert d.x_train.min() == -1 and d.x_train.max() == 1
    assert set(d.y_train.tolist()) == set(range(10))
    majority = int(torch.bincount(d.y_train).argmax())
    assert d.chance_accuracy == pytest.approx((d.y_val == majority).double().mean().item())
    capped = make_dataset(RunConfig(task="digits", widths=(64, 16, 10), n_val=300, n_train=500, global_batch=64, seed=4))
    assert capped.n_train == 500 and torch.equal(capped.y_val, d.y_val)  # same validation rows
    other = make_dataset(RunConfig(task="digits", widths=(64, 16, 10), n_val=300, global_batch=64, seed=5))
    assert not torch.equal(other.y_val, d.y_val)
    logits = torch.full((4, 10), -5.0)
    logits[torch.arange(4), d.y_train[:4]] = 5.0
    assert d.loss(logits, d.y_train[:4]).item() < 1e-3  # cross-entropy of confident right answers


def test_diabetes_is_standardised_regression():
    d = make_dataset(RunConfig(task="diabetes", widths=(10, 8, 1), n_val=42, global_batch=32))
    assert d.kind == "regression" and (d.n_train, d.n_val) == (400, 42) and d.chance_accuracy is None
    assert d.y_train.mean().item() == pytest.approx(0, abs=1e-6) and d.y_train.std().item() == pytest.approx(1, 1e-5)
    assert d.feature_names == ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"]
    assert d.y_std == pytest.approx(77, rel=0.05)  # disease progression, std about 77 in the raw units


@pytest.mark.slow  # 200 training steps
def test_digits_learns_clearly_above_chance(tmp_path):
    """[64, 32, 10] on the fast path, 200 steps of batch 128: validation accuracy about 0.97 here, against a
    chance accuracy (majority training class) of about 0.08."""
    from kanlib.train import train

    cfg = RunConfig(task="digits", widths=(64, 32, 10), n_val=360, global_batch=128, steps=200, warmup_steps=5,
                    lr=1e-2, optimizer="adam", kan_impl="fast", out_dir=str(tmp_path / "out"))
    rec = train(cfg).to_dict()
    assert rec["chance_accuracy"] == pytest.approx(make_dataset(cfg).chance_accuracy) and rec["chance_accuracy"] < 0.15
    assert rec["final_val_accuracy"] > 0.9 > rec["chance_accuracy"] + 0.7
    assert rec["final_val_loss"] < 0.5  # cross-entropy; ln 10 = 2.30 is a uniform guess


# -- check_task covers every task ----------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    (dict(task="mnist"), r"^task: unknown value 'mnist'; choose one of exp_sin, highdim, product, digits, diabetes, "
                         r"feynman:<name>, file$"),
    (dict(task="feynman:I.99"), r"^task: unknown Feynman equation 'I.99' in 'feynman:I.99'; known: I.6.2, I.6.2b, "),
    (dict(task="feynman:"), r"^task: unknown Feynman equation '' .*known: .*III.17.37$"),
    (dict(task="exp_sin", widths=(3, 4, 1)), r"^widths: task 'exp_sin' has 2 inputs, but widths\[0\]=3$"),
    (dict(task="exp_sin", widths=(2, 4, 2)), r"^widths: task 'exp_sin' has 1 output \(regression\), so widths\[-1\] "
                                             r"must be 1, got widths\[-1\]=2$"),
    (dict(task="highdim", widths=(7, 4, 1), n_train=100, global_batch=128),
     r"^global_batch: 128 exceeds the 100 training rows of task 'highdim'$"),
    (dict(task="feynman:I.6.2", widths=(3, 4, 1)),
     r"^widths: task 'feynman:I.6.2' \(exp.*\) has 2 inputs \(sigma, theta\), but widths\[0\]=3$"),
    (dict(task="feynman:I.6.2", widths=(2, 4, 3)), r"^widths: task 'feynman:I.6.2' .* so widths\[-1\] must be 1"),
    (dict(task="digits", widths=(64, 8, 10), n_val=2048), r"^n_val: task 'digits' has 1797 rows; n_val=2048 leaves "
                                                          r"none to train on \(e.g. n_val=359\)$"),
    (dict(task="digits", widths=(64, 8, 1), n_val=300), r"^widths: task 'digits' has 10 classes, so widths\[-1\] must "
                                                         r"be 10, got widths\[-1\]=1$"),
    (dict(task="digits", widths=(8, 8, 10), n_val=300), r"^widths: task 'digits' has 64 inputs, but widths\[0\]=8$"),
    (dict(task="digits", widths=(64, 8, 10), n_val=1700, global_batch=128),
     r"^global_batch: 128 exceeds the 97 training rows of task 'digits'$"),
    (dict(task="diabetes", widths=(10, 8, 1), n_val=400, global_batch=64),
     r"^global_batch: 64 exceeds the 42 training rows of task 'diabetes'$"),
    (dict(task="diabetes", widths=(10, 8, 10), n_val=40), r"^widths: task 'diabetes' has 1 output \(regression\)"),
    (dict(task="digits", widths=(64, 8, 10), n_val=300, data_path="x.csv"), r"^data_path: only task 'file' reads"),
])
def test_check_task_refuses_naming_the_field(kw, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(**kw)


def test_check_task_accepts_every_task_at_its_widths():
    for kw in (dict(task="exp_sin", widths=(2, 4, 1)), dict(task="highdim", widths=(9, 4, 1)),
               dict(task="feynman:II.36.38", widths=(8, 4, 1)), dict(task="digits", widths=(64, 4, 10), n_val=300),
               dict(task="diabetes", widths=(10, 4, 1), n_val=42, global_batch=400)):
        check_task(RunConfig(**kw))  # RunConfig already called it; calling again is harmless and cheap


def test_check_task_does_not_load_the_bundled_sets(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "sklearn", raising=False)
    monkeypatch.setitem(sys.modules, "sklearn", None)  # any import of scikit-learn now fails
    RunConfig(task="digits", widths=(64, 4, 10), n_val=300)
    with pytest.raises(RuntimeError, match="task 'digits' needs scikit-learn"):
        make_dataset(RunConfig(task="digits", widths=(64, 4, 10), n_val=300))


@pytest.mark.slow
def test_digits_on_two_gloo_processes_matches_one(tmp_path):
    """The labels travel with their rows through the per-rank shards: 2 processes train what 1 does."""
    from runners.launch import run

    base = dict(task="digits", widths=(64, 16, 10), n_val=360, global_batch=128, steps=60, warmup_steps=2, lr=1e-2,
                optimizer="adam", device="cpu", backend="gloo", out_dir=str(tmp_path))
    one = run(RunConfig(**base, nproc_per_node=1), echo=False)
    two = run(RunConfig(**base, nproc_per_node=2), echo=False)
    assert two["world_size"] == 2 and two["chance_accuracy"] == one["chance_accuracy"]
    assert two["final_val_loss"] == pytest.approx(one["final_val_loss"], rel=1e-4)
    assert two["final_val_accuracy"] == pytest.approx(one["final_val_accuracy"], abs=1 / 360)  # one row at most
    assert two["final_val_accuracy"] > 0.85
