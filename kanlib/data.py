"""A run's data, sharded per rank: synthetic tasks, the Feynman equations, bundled data sets, files.

``RunConfig.task`` picks the data (:data:`TASK_DOCS`):

- ``exp_sin``, ``highdim``, ``product``: synthetic regression on inputs uniform in ``[-1, 1]^d``.
- ``feynman:<name>``: an equation of the AI Feynman suite (:data:`FEYNMAN`), generated from its formula
  on its variable ranges, inputs scaled to ``[-1, 1]``.
- ``digits`` (classification, 10 classes) and ``diabetes`` (regression): the data sets bundled inside
  scikit-learn (read from a file in the installed package; no network).
- ``file``: a CSV or ``.npz`` file (``data_path``), parsed by one parser (:func:`read_table`,
  :func:`csv_header`) for both the pre-launch check and the full read.

Every rank builds the same training and validation tensors (from ``seed``, or from the data with a
seeded split); step ``s`` draws a global batch of indices from a per-epoch permutation (also seeded), and
rank ``r`` of ``W`` takes the ``r``-th of ``W`` equal, disjoint slices of it. So the data a run sees
depends only on the config, never on the number of processes.

Real data (bundled sets and files): the last ``n_val`` rows of a seeded shuffle are the validation set,
the training set is the rest, at most ``n_train`` rows; features are scaled to the spline grid's range
``[-1, 1]`` and a regression target to zero mean and unit variance, with training statistics only.

:func:`check_task` (called by ``RunConfig.validate`` for every config) refuses a task the model cannot
train on, naming the field; it stays cheap: it reads a CSV's header line or an ``.npz``'s array headers,
never a whole file, and never imports scikit-learn.
"""

from __future__ import annotations

import csv
import functools
import math
import os
import zipfile
from dataclasses import dataclass
from typing import Callable

import torch

from kanlib.errors import ConfigError

def training_dtype(precision: str) -> torch.dtype:
    """The dtype of a run's data, parameters and loss for ``RunConfig.precision``: float64 for fp64, else float32
    (bf16 autocasts the matrix products of a float32 model)."""
    return torch.float64 if precision == "fp64" else torch.float32


# -- synthetic regression ------------------------------------------------------------------------------
# Inputs of fixed width for the tasks that have one (``highdim`` takes widths[0]).
TASK_INPUT_DIM = {"exp_sin": 2, "product": 2}

SYNTHETIC_DOCS = {
    "exp_sin": "f(x1, x2) = exp(sin(pi x1) + x2^2)  (KAN paper, Fig. 2)",
    "highdim": "f(x) = exp(mean_i sin^2(pi x_i / 2))  (KAN paper's 100-d example, width = widths[0])",
    "product": "f(x1, x2) = x1 x2",
}


def target(task: str, x: torch.Tensor) -> torch.Tensor:
    """x: ``(n, d)`` in ``[-1, 1]^d`` -> ``(n, 1)`` targets of the synthetic ``task``."""
    if task == "exp_sin":
        y = torch.exp(torch.sin(math.pi * x[:, 0]) + x[:, 1] ** 2)
    elif task == "highdim":
        y = torch.exp(torch.sin(math.pi * x / 2).pow(2).mean(dim=1))
    elif task == "product":
        y = x[:, 0] * x[:, 1]
    else:
        raise ValueError(f"task: unknown value {task!r}; choose one of {', '.join(SYNTHETIC_DOCS)}")
    return y.unsqueeze(1)


# -- the Feynman equations -----------------------------------------------------------------------------
@dataclass(frozen=True)
class FeynmanEquation:
    """One equation of the AI Feynman suite: its formula and the range each variable is drawn from.

    ``variables``: ``(name, low, high)`` in the suite's order (that order is the feature order);
    ``fn`` maps ``{name: (n,) float64 tensor}`` to the ``(n,)`` float64 target.
    """

    name: str
    output: str
    formula: str
    variables: tuple[tuple[str, float, float], ...]
    fn: Callable[[dict], torch.Tensor]

    @property
    def in_dim(self) -> int:
        return len(self.variables)

    def __call__(self, **values) -> torch.Tensor:
        """The formula at the given variable values (numbers or tensors), as a float64 tensor."""
        missing = [v for v, _, _ in self.variables if v not in values]
        if missing or len(values) != self.in_dim:
            raise ValueError(f"{self.name} takes {', '.join(v for v, _, _ in self.variables)}; got "
                             f"{', '.join(values) or 'nothing'}")
        return self.fn({k: torch.as_tensor(v, dtype=torch.float64) for k, v in values.items()})


def _eq(name, output, formula, variables, fn) -> FeynmanEquation:
    return FeynmanEquation(name, output, formula, tuple(variables), fn)


_PI = math.pi
_exp, _sin, _cos, _sqrt, _log, _asin = torch.exp, torch.sin, torch.cos, torch.sqrt, torch.log, torch.asin


def _r(low, high, *names):
    """Variables that share one range, in the given order."""
    return [(n, float(low), float(high)) for n in names]


# The equations of the KAN paper's Feynman table (Liu et al. 2024, "KAN: Kolmogorov-Arnold Networks",
# Table 2), each with the formula, variable order and sampling ranges of the AI Feynman suite
# (Udrescu & Tegmark 2020, "AI Feynman: a physics-inspired method for symbolic regression", Science
# Advances 6:eaay2631; its table FeynmanEquations.csv). The KAN paper fits dimensionless reductions of
# these equations; here every variable of the suite stays an input, on the suite's own range. The KAN
# paper calls II.11.17 "II.11.7".
FEYNMAN: dict[str, FeynmanEquation] = {e.name: e for e in [
    _eq("I.6.2", "f", "exp(-(theta/sigma)**2/2)/(sqrt(2*pi)*sigma)", _r(1, 3, "sigma", "theta"),
        lambda v: _exp(-(v["theta"] / v["sigma"]) ** 2 / 2) / (math.sqrt(2 * _PI) * v["sigma"])),
    _eq("I.6.2b", "f", "exp(-((theta-theta1)/sigma)**2/2)/(sqrt(2*pi)*sigma)",
        _r(1, 3, "sigma", "theta", "theta1"),
        lambda v: _exp(-((v["theta"] - v["theta1"]) / v["sigma"]) ** 2 / 2) / (math.sqrt(2 * _PI) * v["sigma"])),
    _eq("I.9.18", "F", "G*m1*m2/((x2-x1)**2+(y2-y1)**2+(z2-z1)**2)",
        _r(1, 2, "m1", "m2", "G") + _r(3, 4, "x1") + _r(1, 2, "x2") + _r(3, 4, "y1") + _r(1, 2, "y2")
        + _r(3, 4, "z1") + _r(1, 2, "z2"),
        lambda v: v["G"] * v["m1"] * v["m2"] / ((v["x2"] - v["x1"]) ** 2 + (v["y2"] - v["y1"]) ** 2
                                                + (v["z2"] - v["z1"]) ** 2)),
    _eq("I.12.11", "F", "q*(Ef+B*v*sin(theta))", _r(1, 5, "q", "Ef", "B", "v", "theta"),
        lambda v: v["q"] * (v["Ef"] + v["B"] * v["v"] * _sin(v["theta"]))),
    _eq("I.13.12", "U", "G*m1*m2*(1/r2-1/r1)", _r(1, 5, "m1", "m2", "r1", "r2", "G"),
        lambda v: v["G"] * v["m1"] * v["m2"] * (1 / v["r2"] - 1 / v["r1"])),
    _eq("I.15.3x", "x1", "(x-u*t)/sqrt(1-u**2/c**2)",
        _r(5, 10, "x") + _r(1, 2, "u") + _r(3, 20, "c") + _r(1, 2, "t"),
        lambda v: (v["x"] - v["u"] * v["t"]) / _sqrt(1 - v["u"] ** 2 / v["c"] ** 2)),
    _eq("I.16.6", "v1", "(u+v)/(1+u*v/c**2)", _r(1, 5, "c", "v", "u"),
        lambda v: (v["u"] + v["v"]) / (1 + v["u"] * v["v"] / v["c"] ** 2)),
    _eq("I.18.4", "r", "(m1*r1+m2*r2)/(m1+m2)", _r(1, 5, "m1", "m2", "r1", "r2"),
        lambda v: (v["m1"] * v["r1"] + v["m2"] * v["r2"]) / (v["m1"] + v["m2"])),
    _eq("I.26.2", "theta1", "arcsin(n*sin(theta2))", _r(0, 1, "n") + _r(1, 5, "theta2"),
        lambda v: _asin(v["n"] * _sin(v["theta2"]))),
    _eq("I.27.6", "foc", "1/(1/d1+n/d2)", _r(1, 5, "d1", "d2", "n"),
        lambda v: 1 / (1 / v["d1"] + v["n"] / v["d2"])),
    # (x1 - x2)^2 <= radicand: clamped at 0 so that rounding at theta1 = theta2, x1 = x2 cannot give NaN.
    _eq("I.29.16", "x", "sqrt(x1**2+x2**2-2*x1*x2*cos(theta1-theta2))", _r(1, 5, "x1", "x2", "theta1", "theta2"),
        lambda v: _sqrt((v["x1"] ** 2 + v["x2"] ** 2 - 2 * v["x1"] * v["x2"] * _cos(v["theta1"] - v["theta2"]))
                        .clamp_min(0))),
    _eq("I.30.3", "Int", "Int_0*sin(n*theta/2)**2/sin(theta/2)**2", _r(1, 5, "Int_0", "theta", "n"),
        lambda v: v["Int_0"] * _sin(v["n"] * v["theta"] / 2) ** 2 / _sin(v["theta"] / 2) ** 2),
    _eq("I.30.5", "theta", "arcsin(lambd/(n*d))", _r(1, 2, "lambd") + _r(2, 5, "d") + _r(1, 5, "n"),
        lambda v: _asin(v["lambd"] / (v["n"] * v["d"]))),
    _eq("I.37.4", "Int", "I1+I2+2*sqrt(I1*I2)*cos(delta)", _r(1, 5, "I1", "I2", "delta"),
        lambda v: v["I1"] + v["I2"] + 2 * _sqrt(v["I1"] * v["I2"]) * _cos(v["delta"])),
    _eq("I.40.1", "n", "n_0*exp(-m*g*x/(kb*T))", _r(1, 5, "n_0", "m", "x", "T", "g", "kb"),
        lambda v: v["n_0"] * _exp(-v["m"] * v["g"] * v["x"] / (v["kb"] * v["T"]))),
    _eq("I.44.4", "E_n", "n*kb*T*ln(V2/V1)", _r(1, 5, "n", "kb", "T", "V1", "V2"),
        lambda v: v["n"] * v["kb"] * v["T"] * _log(v["V2"] / v["V1"])),
    _eq("I.50.26", "x", "x1*(cos(omega*t)+alpha*cos(omega*t)**2)", _r(1, 3, "x1", "omega", "t", "alpha"),
        lambda v: v["x1"] * (_cos(v["omega"] * v["t"]) + v["alpha"] * _cos(v["omega"] * v["t"]) ** 2)),
    _eq("II.2.42", "Pwr", "kappa*(T2-T1)*A/d", _r(1, 5, "kappa", "T1", "T2", "A", "d"),
        lambda v: v["kappa"] * (v["T2"] - v["T1"]) * v["A"] / v["d"]),
    _eq("II.6.15a", "Ef", "p_d/(4*pi*epsilon)*3*z/r**5*sqrt(x**2+y**2)",
        _r(1, 3, "epsilon", "p_d", "r", "x", "y", "z"),
        lambda v: v["p_d"] / (4 * _PI * v["epsilon"]) * 3 * v["z"] / v["r"] ** 5 * _sqrt(v["x"] ** 2 + v["y"] ** 2)),
    _eq("II.11.17", "n", "n_0*(1+p_d*Ef*cos(theta)/(kb*T))", _r(1, 3, "n_0", "kb", "T", "theta", "p_d", "Ef"),
        lambda v: v["n_0"] * (1 + v["p_d"] * v["Ef"] * _cos(v["theta"]) / (v["kb"] * v["T"]))),
    _eq("II.11.27", "Pol", "n*alpha/(1-(n*alpha/3))*epsilon*Ef",
        _r(0, 1, "n", "alpha") + _r(1, 2, "epsilon", "Ef"),
        lambda v: v["n"] * v["alpha"] / (1 - v["n"] * v["alpha"] / 3) * v["epsilon"] * v["Ef"]),
    _eq("II.35.18", "n", "n_0/(exp(mom*B/(kb*T))+exp(-mom*B/(kb*T)))", _r(1, 3, "n_0", "kb", "T", "mom", "B"),
        lambda v: v["n_0"] / (_exp(v["mom"] * v["B"] / (v["kb"] * v["T"]))
                              + _exp(-v["mom"] * v["B"] / (v["kb"] * v["T"])))),
    _eq("II.36.38", "f", "mom*H/(kb*T)+(mom*alpha)/(epsilon*c**2*kb*T)*M",
        _r(1, 3, "mom", "H", "kb", "T", "alpha", "epsilon", "c", "M"),
        lambda v: v["mom"] * v["H"] / (v["kb"] * v["T"])
        + v["mom"] * v["alpha"] / (v["epsilon"] * v["c"] ** 2 * v["kb"] * v["T"]) * v["M"]),
    _eq("II.38.3", "F", "Y*A*x/d", _r(1, 5, "Y", "A", "d", "x"),
        lambda v: v["Y"] * v["A"] * v["x"] / v["d"]),
    # sin(a)^2 / a^2 with a = (omega - omega_0) t / 2 is written as sinc(a / pi)^2 (torch.sinc is the
    # normalised sin(pi z) / (pi z)): the same function, and 1 instead of 0/0 where omega = omega_0.
    _eq("III.9.52", "prob", "(p_d*Ef*t/(h/(2*pi)))*sin((omega-omega_0)*t/2)**2/((omega-omega_0)*t/2)**2",
        _r(1, 3, "p_d", "Ef", "t", "h") + _r(1, 5, "omega", "omega_0"),
        lambda v: v["p_d"] * v["Ef"] * v["t"] / (v["h"] / (2 * _PI))
        * torch.sinc((v["omega"] - v["omega_0"]) * v["t"] / 2 / _PI) ** 2),
    _eq("III.10.19", "E_n", "mom*sqrt(Bx**2+By**2+Bz**2)", _r(1, 5, "mom", "Bx", "By", "Bz"),
        lambda v: v["mom"] * _sqrt(v["Bx"] ** 2 + v["By"] ** 2 + v["Bz"] ** 2)),
    _eq("III.17.37", "f", "beta*(1+alpha*cos(theta))", _r(1, 5, "beta", "alpha", "theta"),
        lambda v: v["beta"] * (1 + v["alpha"] * _cos(v["theta"]))),
]}

FEYNMAN_PREFIX = "feynman:"


def feynman_equation(task: str) -> FeynmanEquation:
    """The equation of ``task = "feynman:<name>"``; an unknown name lists the known ones."""
    name = task[len(FEYNMAN_PREFIX):]
    if name not in FEYNMAN:
        raise ConfigError(f"task: unknown Feynman equation {name!r} in {task!r}; known: {', '.join(FEYNMAN)}")
    return FEYNMAN[name]


# -- data sets bundled with scikit-learn -------------------------------------------------------------
@dataclass(frozen=True)
class BundledSet:
    """A data set that ships inside scikit-learn (``sklearn.datasets.load_<name>``, no download).

    ``rows`` and ``in_dim`` are known without loading it (so :func:`check_task` stays cheap; a test
    checks them against the loaded set); ``n_classes`` is 0 for regression.
    """

    name: str
    rows: int
    in_dim: int
    n_classes: int
    doc: str

    def load(self) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        """``x (rows, in_dim)`` float64, ``y`` (``(rows,)`` int64 labels, or ``(rows, 1)`` float64) and the
        feature names, read from the data file inside the installed scikit-learn."""
        try:
            from sklearn import datasets
        except ImportError as e:
            raise RuntimeError(f"task {self.name!r} needs scikit-learn (pip install scikit-learn): {e}") from None
        if self.name == "digits":
            b = datasets.load_digits()
            y = torch.tensor(b.target, dtype=torch.int64)
        else:
            b = datasets.load_diabetes(scaled=False)  # raw values: we scale with training statistics
            y = torch.tensor(b.target, dtype=torch.float64).reshape(-1, 1)
        x = torch.tensor(b.data, dtype=torch.float64)
        if tuple(x.shape) != (self.rows, self.in_dim):
            raise RuntimeError(f"task {self.name!r}: scikit-learn's copy has shape {tuple(x.shape)}, expected "
                               f"({self.rows}, {self.in_dim})")
        return x, y, [str(n) for n in b.feature_names]


BUNDLED = {
    "digits": BundledSet("digits", 1797, 64, 10, "8x8 images of handwritten digits: 64 pixel intensities "
                         "(0-16) -> digit 0-9 (classification; scikit-learn's load_digits)"),
    "diabetes": BundledSet("diabetes", 442, 10, 0, "10 baseline variables of diabetes patients -> disease "
                           "progression after one year (regression; scikit-learn's load_diabetes)"),
}

TASK_DOCS = {
    **SYNTHETIC_DOCS,
    **{name: b.doc for name, b in BUNDLED.items()},
    "feynman:<name>": f"an equation of the AI Feynman suite on its variable ranges; names: {', '.join(FEYNMAN)}",
    "file": "a CSV (header row, numeric columns) or .npz (arrays x, y) file: data_path, target",
}


# -- data files: one parser for the check and the read ---------------------------------------------
def _csv_reader(f):
    """The one CSV dialect: commas, double quotes, spaces after a comma ignored (``a, b, y``)."""
    return csv.reader(f, delimiter=",", quotechar='"', skipinitialspace=True, strict=True)


def _header_from_row(row: list[str], path: str) -> list[str]:
    names = [c.strip() for c in row]
    if not names or names == [""]:
        raise ValueError(f"{path}: the first line must be a header row naming the columns, but it is empty")
    for i, n in enumerate(names):
        if not n:
            raise ValueError(f"{path}: header column {i + 1} has no name (header: {row})")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{path}: duplicate column name(s) {', '.join(map(repr, dup))} in the header")
    return names


def _open_csv(path: str):
    # utf-8-sig: a byte-order mark (spreadsheet exports) is not part of the first column's name.
    return open(path, newline="", encoding="utf-8-sig")


def csv_header(path: str) -> list[str]:
    """The column names of a CSV file, from its first line only (the same parse :func:`read_table` uses)."""
    try:
        with _open_csv(path) as f:
            reader = _csv_reader(f)
            return _header_from_row(next(reader, []), path)
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{path}: cannot read the header line as CSV: {e}") from None


class TargetColumnError(ValueError):
    """The ``target`` column a config names is not in the file's header."""


def split_columns(names: list[str], target_column: str, path: str) -> tuple[list[int], int]:
    """Column indices of the features and of the target (``target_column``, default the last column)."""
    col = target_column or names[-1]
    if col not in names:
        raise TargetColumnError(f"{path}: no target column {col!r} (columns: {', '.join(names)})")
    t = names.index(col)
    features = [i for i in range(len(names)) if i != t]
    if not features:
        raise ValueError(f"{path}: only the target column {col!r}; a data file needs at least one feature column")
    return features, t


def _read_csv(path: str, target_column: str):
    """``(table (rows, columns) float64 ndarray, column names, feature column indices, target index, each data
    row's line of the file)``.

    The csv module splits the rows; numpy converts the whole table at once (the same conversion as
    ``float()``). Only when that fails, or a value is not finite, are the rows walked one by one to name
    the first bad value.
    """
    import numpy as np

    rows, lines = [], []
    try:
        with _open_csv(path) as f:
            reader = _csv_reader(f)
            names = _header_from_row(next(reader, []), path)
            features, t = split_columns(names, target_column, path)
            for row in reader:
                if row:  # a blank line is not a data row
                    rows.append(row)
                    lines.append(reader.line_num)
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{path}: cannot read as CSV: {e}") from None
    if not rows:
        raise ValueError(f"{path}: no data rows after the header")
    try:
        table = np.asarray(rows, dtype=np.float64) if all(len(r) == len(names) for r in rows) else None
    except ValueError:
        table = None
    if table is None or not np.isfinite(table).all():
        _raise_first_bad_value(path, names, rows, lines)
    return table, names, features, t, lines


def _raise_first_bad_value(path: str, names: list[str], rows: list[list[str]], lines: list[int]) -> None:
    """Raise the error of the first row, in file order, with the wrong number of values or a value that
    is empty, not a number, or not finite (inf, -inf, nan)."""
    for i, (row, line) in enumerate(zip(rows, lines)):
        where = f"{path}: data row {i + 1} (line {line} of the file)"
        if len(row) != len(names):
            raise ValueError(f"{where} has {len(row)} values, but the header has {len(names)} columns "
                             f"({', '.join(names)})")
        for name, cell in zip(names, row):
            cell = cell.strip()
            if not cell:
                raise ValueError(f"{where}, column {name!r}: empty value")
            try:
                v = float(cell)
            except ValueError:
                raise ValueError(f"{where}, column {name!r}: {cell!r} is not a number") from None
            if not math.isfinite(v):
                raise ValueError(f"{where}, column {name!r}: {cell!r} is not a finite number")
    raise AssertionError(f"{path}: numpy refused the table but every value reads as a finite number")


def _npy_header(zf: zipfile.ZipFile, key: str, path: str):
    """``(shape, dtype)`` of array ``key`` of an .npz, read from the .npy header only."""
    import numpy as np

    with zf.open(f"{key}.npy") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        else:  # rare (3.0: non-latin-1 field names); read the array itself
            with np.load(path, allow_pickle=False) as z:
                a = z[key]
                shape, dtype = a.shape, a.dtype
    return tuple(shape), dtype


def _check_npz_arrays(path: str, x_shape, x_dtype, y_shape, y_dtype) -> None:
    import numpy as np

    for key, dtype in (("x", x_dtype), ("y", y_dtype)):
        if not (np.issubdtype(dtype, np.number) or np.issubdtype(dtype, np.bool_)):
            raise ValueError(f"{path}: array {key!r} must be numeric, got dtype {dtype}")
    if len(x_shape) != 2:
        raise ValueError(f"{path}: array 'x' must be 2-D (rows, features), got shape {x_shape}")
    if not (len(y_shape) == 1 or (len(y_shape) == 2 and y_shape[1] == 1)):
        raise ValueError(f"{path}: array 'y' must have shape (rows,) or (rows, 1), got {y_shape}")
    if x_shape[0] != y_shape[0]:
        raise ValueError(f"{path}: x has {x_shape[0]} rows but y has {y_shape[0]}")
    if x_shape[0] == 0 or x_shape[1] == 0:
        raise ValueError(f"{path}: array 'x' has shape {x_shape}: no rows or no features")


def npz_shape(path: str) -> tuple[int, int]:
    """``(rows, features)`` of an .npz data file, from its array headers only (never the data)."""
    try:
        with zipfile.ZipFile(path) as zf:
            files = sorted(n[:-4] for n in zf.namelist() if n.endswith(".npy"))
            if "x" not in files or "y" not in files:
                raise ValueError(f"{path}: an .npz data file needs arrays 'x' and 'y', has {files}")
            xs, xd = _npy_header(zf, "x", path)
            ys, yd = _npy_header(zf, "y", path)
    except (zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"{path}: not a readable .npz file: {e}") from None
    _check_npz_arrays(path, xs, xd, ys, yd)
    return xs[0], xs[1]


def _first_non_finite(a, path: str, key: str, names: list[str] | None = None) -> None:
    import numpy as np

    bad = np.argwhere(~np.isfinite(a))
    if len(bad):
        r, c = (int(bad[0][0]), int(bad[0][1])) if a.ndim == 2 else (int(bad[0][0]), 0)
        column = f"column {c + 1} ({names[c]})" if names else "the target"
        index = f"{key}[{r}, {c}]" if a.ndim == 2 else f"{key}[{r}]"
        raise ValueError(f"{path}: data row {r + 1}, {column}: {a[(r, c) if a.ndim == 2 else r]} is not a finite "
                         f"number (array {index})")


def read_table(path: str, target_column: str = "") -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Features and target of a data file: ``x (n, d)``, ``y (n, 1)`` as float64, and the feature names.

    CSV: a header row (names may be quoted; spaces after commas are ignored) and numeric columns;
    ``target_column`` (default: the last column) is the target, every other column a feature. Blank lines
    are skipped. NPZ: arrays ``x`` (n, d) and ``y`` (n,) or (n, 1); feature names ``x0 .. x{d-1}``.
    A missing, non-numeric or non-finite value (inf, -inf, nan, empty), or a row with the wrong number
    of values, is an error naming the file, the data row (and for CSV the line) and the column.
    """
    x, y, names, _, _ = _read_table(path, target_column)
    return x, y, names


def _read_table(path: str, target_column: str):
    """:func:`read_table`'s ``x, y, feature names``, the target's name, and each data row's line of the file (CSV;
    None for NPZ, whose rows are array rows)."""
    import numpy as np

    if path.endswith(".npz"):
        npz_shape(path)  # shapes and dtypes, with the same messages as the pre-launch check
        with np.load(path, allow_pickle=False) as z:
            x, y = np.asarray(z["x"], dtype=np.float64), np.asarray(z["y"], dtype=np.float64).reshape(-1, 1)
        names = [f"x{i}" for i in range(x.shape[1])]
        _first_non_finite(x, path, "x", names)
        _first_non_finite(y[:, 0], path, "y")
        return torch.from_numpy(x), torch.from_numpy(y), names, "y", None
    table, names, features, t, lines = _read_csv(path, target_column)
    return (torch.from_numpy(np.ascontiguousarray(table[:, features])),
            torch.from_numpy(np.ascontiguousarray(table[:, [t]])), [names[i] for i in features], names[t], lines)


@functools.lru_cache(maxsize=64)
def _file_summary(path: str, target_column: str, mtime_ns: int, size: int) -> tuple[tuple[str, ...], int | None]:
    """``(feature names, rows or None)`` of a data file from its header only; cached per file version."""
    if path.endswith(".npz"):
        rows, d = npz_shape(path)
        return tuple(f"x{i}" for i in range(d)), rows
    names = csv_header(path)
    features, _ = split_columns(names, target_column, path)
    return tuple(names[i] for i in features), None  # counting CSV rows would read the whole file


def file_features(path: str, target_column: str = "") -> list[str]:
    """Feature names of a data file, reading only its header line (CSV) or array headers (NPZ)."""
    st = os.stat(path)
    return list(_file_summary(path, target_column, st.st_mtime_ns, st.st_size)[0])


# -- datasets ------------------------------------------------------------------------------------------
class Dataset:
    """Training and validation tensors, and the per-rank shard of each global batch.

    x_train: ``(n_train, in_dim)``, x_val: ``(n_val, in_dim)``, in the training dtype (:func:`training_dtype`:
    float32, or float64 for fp64); the targets are :class:`RegressionData`'s ``(n, 1)`` of the same dtype or
    :class:`ClassificationData`'s ``(n,)`` int64 labels. All tensors live on the CPU; the trainer moves each shard
    to its device. ``y_mean``, ``y_std``: what a standardised regression target was standardised with (None when the
    target is used as it is: synthetic tasks, classification).
    """

    kind = ""
    chance_accuracy: float | None = None
    y_mean: float | None = None
    y_std: float | None = None

    def __init__(self, x_train, y_train, x_val, y_val, seed: int, task: str = ""):
        self.x_train, self.y_train, self.x_val, self.y_val = x_train, y_train, x_val, y_val
        self.task, self.seed = task, seed
        self.in_dim, self.dtype = x_train.shape[1], x_train.dtype
        self.n_train, self.n_val = x_train.shape[0], x_val.shape[0]
        self._perm_epoch, self._perm = -1, None

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training loss of predictions ``out: (b, out_dim)`` against targets ``y``: a scalar of the data's
        dtype (a bf16 output is cast up)."""
        raise NotImplementedError

    def _val_sums(self, out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise NotImplementedError

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, device, chunk: int = 8192, pad: bool = False) -> dict:
        """``{"val_loss": float, "val_accuracy": float | None}`` of ``model`` on the validation set.

        Deterministic (fixed chunks, summed in float64 on ``device``, one host transfer at the end);
        call it on every rank under FSDP, whose forward is collective. ``pad``: every forward gets
        exactly ``chunk`` rows (the last chunk padded with copies of the first rows, whose outputs are
        dropped), so a compiled model evaluated in chunks of its training batch runs only the kernels
        its training compiled, instead of tracing new ones for another shape.
        """
        if chunk < 1:
            raise ValueError(f"chunk must be at least 1, got {chunk}")
        was_training = model.training
        model.eval()
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        correct = torch.zeros((), dtype=torch.float64, device=device)
        for i in range(0, self.n_val, chunk):
            xb, yb = self.x_val[i:i + chunk].to(device), self.y_val[i:i + chunk].to(device)
            n = len(xb)
            if pad and n < chunk:  # the first rows again, cycling when the set is smaller than one chunk
                xb = torch.cat([xb, self.x_val[torch.arange(chunk - n) % self.n_val].to(device)])
            s, c = self._val_sums(model(xb)[:n].to(self.dtype), yb)
            loss_sum += s
            if c is not None:
                correct += c
        model.train(was_training)
        sums = torch.stack([loss_sum, correct]).cpu().tolist()
        return {"val_loss": sums[0] / self.n_val,
                "val_accuracy": sums[1] / self.n_val if self.kind == "classification" else None}

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._perm_epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch + 1)
            self._perm, self._perm_epoch = torch.randperm(self.n_train, generator=g), epoch
        return self._perm

    def global_indices(self, step: int, global_batch: int) -> torch.Tensor:
        """Indices of the samples of step ``step``'s global batch: ``(global_batch,)``."""
        start = step * global_batch
        out = []
        while len(out) == 0 or sum(len(o) for o in out) < global_batch:
            epoch, offset = divmod(start, self.n_train)
            take = min(global_batch - sum(len(o) for o in out), self.n_train - offset)
            out.append(self._permutation(epoch)[offset:offset + take])
            start += take
        return torch.cat(out)

    def shard(self, step: int, global_batch: int, rank: int, world_size: int):
        """This rank's disjoint slice of step ``step``'s global batch: ``x (b, d)`` and its targets."""
        if global_batch % world_size:
            raise ValueError(f"global_batch {global_batch} is not divisible by world_size {world_size}")
        b = global_batch // world_size
        idx = self.global_indices(step, global_batch)[rank * b:(rank + 1) * b]
        return self.x_train[idx], self.y_train[idx]


class RegressionData(Dataset):
    """Regression: ``y`` is ``(n, 1)`` of the data's dtype; the loss is the mean squared error."""

    kind = "regression"

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(out.to(y.dtype), y)

    def _val_sums(self, out, y):
        return torch.nn.functional.mse_loss(out, y, reduction="sum").double(), None


class ClassificationData(Dataset):
    """Classification: ``y`` is ``(n,)`` int64 class labels in ``[0, n_classes)``; the model outputs
    ``(b, n_classes)`` logits; the loss is cross-entropy (nats per sample) and ``val_accuracy`` the
    fraction of validation rows whose largest logit is the label.

    ``chance_accuracy``: the validation accuracy of always predicting the most frequent training class
    (ties: the smallest label), the floor a model must clearly beat.
    """

    kind = "classification"

    def __init__(self, x_train, y_train, x_val, y_val, seed: int, task: str, n_classes: int):
        super().__init__(x_train, y_train, x_val, y_val, seed, task)
        self.n_classes = n_classes
        majority = int(torch.bincount(y_train, minlength=n_classes).argmax())
        self.chance_accuracy = float((y_val == majority).double().mean())

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(out.to(self.dtype), y)

    def _val_sums(self, out, y):
        s = torch.nn.functional.cross_entropy(out, y, reduction="sum").double()
        return s, (out.argmax(dim=1) == y).double().sum()


class SyntheticRegression(RegressionData):
    """A synthetic task on inputs uniform in ``[-1, 1]^in_dim``, generated from ``seed``."""

    def __init__(self, task: str, in_dim: int, n_train: int, n_val: int, seed: int, dtype=torch.float32):
        g = torch.Generator().manual_seed(seed)
        x = torch.rand(n_train + n_val, in_dim, generator=g, dtype=dtype) * 2 - 1  # (n, d) uniform on [-1, 1]
        y = target(task, x)
        super().__init__(x[:n_train], y[:n_train], x[n_train:], y[n_train:], seed, task)


class FeynmanRegression(RegressionData):
    """``n_train + n_val`` samples of a Feynman equation, generated from ``seed``.

    Each variable is uniform on its range ``[low, high]`` of the suite; the feature is the variable
    scaled to ``[-1, 1]`` by that range (``2 (v - low) / (high - low) - 1``), and the target is the
    formula's value standardised with the training samples' mean and standard deviation
    (``y_mean``, ``y_std`` keep them). Computed in float64, stored in ``dtype``.
    """

    def __init__(self, task: str, n_train: int, n_val: int, seed: int, dtype=torch.float32):
        eq = feynman_equation(task)
        g = torch.Generator().manual_seed(seed)
        u = torch.rand(n_train + n_val, eq.in_dim, generator=g, dtype=torch.float64) * 2 - 1
        lo = torch.tensor([v[1] for v in eq.variables], dtype=torch.float64)
        hi = torch.tensor([v[2] for v in eq.variables], dtype=torch.float64)
        values = lo + (u + 1) / 2 * (hi - lo)
        y = eq.fn({name: values[:, i] for i, (name, _, _) in enumerate(eq.variables)}).reshape(-1, 1)
        if not torch.isfinite(y).all():  # the ranges keep every formula finite; a bug if not
            raise RuntimeError(f"{task}: the formula gave non-finite values on its own ranges")
        mu, sd = y[:n_train].mean(), y[:n_train].std().clamp_min(1e-12)
        ys = ((y - mu) / sd).to(dtype)
        self.equation, self.feature_names = eq, [v[0] for v in eq.variables]
        self.y_mean, self.y_std = float(mu), float(sd)
        super().__init__(u[:n_train].to(dtype), ys[:n_train], u[n_train:].to(dtype), ys[n_train:], seed, task)


def _split(n: int, n_train: int, n_val: int, seed: int, source: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Training and validation row indices of a seeded shuffle of ``n`` rows."""
    if n_val >= n:
        raise ValueError(f"n_val: {n_val} validation rows leave none to train on in {source} ({n} rows)")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[: min(n_train, n - n_val)], perm[n - n_val:]


def _scale_features(x: torch.Tensor, tr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` (float64) scaled so the training rows span ``[-1, 1]`` per feature (a constant feature maps to -1),
    still float64."""
    lo, hi = x[tr].min(dim=0).values, x[tr].max(dim=0).values
    span = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    return (x - lo) / span * 2 - 1, lo, span


@dataclass(frozen=True)
class RowNames:
    """How errors name a row of real data: ``source`` (a file, or ``task 'digits'``) and, for a CSV file, the line
    of each data row."""

    source: str
    lines: list[int] | None = None

    def __call__(self, i: int) -> str:
        line = f" (line {self.lines[i]} of the file)" if self.lines else ""
        return f"{self.source}: data row {i + 1}{line}"


def check_scaled(raw: torch.Tensor, scaled: torch.Tensor, rows: torch.Tensor, names: list[str], where: RowNames,
                 dtype: torch.dtype, how: str) -> None:
    """Refuse, naming the row and column of the first such cell in file order, a value of ``rows`` (``raw``, float64,
    and its scaled value ``scaled``: both ``(n, columns)``) the run cannot train on in ``dtype``: a value beyond
    ``dtype``'s range, or a scaled value that is not finite or so large that its square (a squared error) overflows
    ``dtype``. A finite outlier (1e308 in a CSV) passes the file's own float64 check, but in float32, or scaled with
    the training rows' statistics, it is infinite, and the run would end in non-finite losses that blame the
    training, not the data."""
    kind = str(dtype).split(".")[-1]
    big = torch.finfo(dtype).max
    limit = math.sqrt(big)  # float32: 1.8e19; float64: 1.3e154
    used = torch.zeros(raw.shape[0], dtype=torch.bool)
    used[rows] = True
    too_big = ~(raw.abs() <= big)
    bad = (too_big | ~(scaled.abs() <= limit)) & used.unsqueeze(1)  # NaN counts as bad
    if not bool(bad.any()):
        return
    r, c = bad.nonzero()[0].tolist()
    where = f"{where(r)}, column {names[c]!r}: {raw[r, c].item()!r}"
    if too_big[r, c]:
        raise ValueError(f"{where} is beyond {kind}'s range (|value| <= {big:.4g}), the training precision; remove or "
                         f"correct the outlier")
    raise ValueError(f"{where} {how} is {scaled[r, c].item():.4g}, beyond what training in {kind} holds "
                     f"(|value| <= {limit:.3g}, so that a squared error stays finite); remove or correct the outlier")


def standardise_target(y: torch.Tensor, tr: torch.Tensor, name: str, where: RowNames) -> tuple[float, float]:
    """Mean and standard deviation of the training rows of ``y: (n, 1)`` float64 (the std at least 1e-12), or an
    error naming the training row with the largest value when they overflow float64."""
    mu, sd = y[tr].mean(), y[tr].std().clamp_min(1e-12)
    if not (math.isfinite(float(mu)) and math.isfinite(float(sd))):
        r = int(tr[y[tr, 0].abs().argmax()])
        raise ValueError(f"{where(r)}, column {name!r}: {y[r, 0].item()!r} makes the training rows' mean or standard "
                         f"deviation overflow float64 (mean {float(mu):g}, std {float(sd):g}); the target cannot be "
                         f"standardised: remove or correct the outlier")
    return float(mu), float(sd)


class TableRegression(RegressionData):
    """Regression on a table of real data (a file or a bundled set), split and scaled (module docstring). Every
    feature and the standardised target of the rows used must fit ``dtype`` (:func:`check_scaled`)."""

    def __init__(self, x, y, names: list[str], n_train: int, n_val: int, seed: int, task: str, where: RowNames,
                 target_name: str = "target", dtype=torch.float32):
        tr, va = _split(x.shape[0], n_train, n_val, seed, where.source)
        used = torch.cat([tr, va])
        xs, lo, span = _scale_features(x, tr)
        check_scaled(x, xs, used, names, where, dtype, "scaled to the training rows' range [-1, 1]")
        mu, sd = standardise_target(y, tr, target_name, where)
        ys = (y - mu) / sd
        check_scaled(y, ys, used, [target_name], where, dtype,
                     f"standardised with the training rows' mean {mu:.4g} and std {sd:.4g}")
        self.feature_names, self.x_scale = names, (lo, span)
        self.y_mean, self.y_std = mu, sd
        xs, ys = xs.to(dtype), ys.to(dtype)
        super().__init__(xs[tr], ys[tr], xs[va], ys[va], seed, task)


class FileRegression(TableRegression):
    """Real data from a CSV or NPZ file (:func:`read_table`), split into training and validation rows by
    ``seed``: the last ``n_val`` rows of a seeded shuffle validate, at most ``n_train`` of the rest train."""

    def __init__(self, path: str, target_column: str, n_train: int, n_val: int, seed: int, dtype=torch.float32):
        x, y, names, target_name, lines = _read_table(path, target_column)
        self.path = path
        super().__init__(x, y, names, n_train, n_val, seed, "file", RowNames(path, lines), target_name, dtype)


def bundled_dataset(name: str, n_train: int, n_val: int, seed: int, dtype=torch.float32) -> Dataset:
    """A scikit-learn bundled set, split by ``seed`` (n_val validation rows, at most n_train training rows)
    and scaled with training statistics: :class:`ClassificationData` for digits, regression for diabetes."""
    spec = BUNDLED[name]
    x, y, names = spec.load()
    where = RowNames(f"task {name!r}")
    if not spec.n_classes:
        return TableRegression(x, y, names, n_train, n_val, seed, name, where, dtype=dtype)
    tr, va = _split(x.shape[0], n_train, n_val, seed, where.source)
    xs, _, _ = _scale_features(x, tr)
    check_scaled(x, xs, torch.cat([tr, va]), names, where, dtype, "scaled to the training rows' range [-1, 1]")
    xs = xs.to(dtype)
    data = ClassificationData(xs[tr], y[tr], xs[va], y[va], seed, name, spec.n_classes)
    data.feature_names = names
    return data


# -- the config's task ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskShape:
    """What :func:`check_task` knows about a task without building it.

    ``in_dim``: inputs (None: any width, ``highdim``); ``out_dim``: 1 for regression, the classes
    for classification; ``train_rows``: the training rows a run gets (None when only a full read of a
    CSV would tell).
    """

    kind: str
    in_dim: int | None
    out_dim: int
    train_rows: int | None
    what: str  # how errors name the data: "task 'digits'", "data.csv"
    feature_names: tuple[str, ...] = ()


def task_shape(cfg) -> TaskShape:
    """The shape of ``cfg.task``, from constants, the equation table, or a data file's header only.

    Raises :class:`kanlib.errors.ConfigError` naming the field (``task``, ``data_path``, ``target``,
    ``n_val``) for a task or file that cannot be used at all.
    """
    task = cfg.task
    if task != "file" and (cfg.data_path or cfg.target):
        field = "data_path" if cfg.data_path else "target"
        raise ConfigError(f"{field}: only task 'file' reads a data file, but task={task!r}")
    if task in SYNTHETIC_DOCS:
        return TaskShape("regression", TASK_INPUT_DIM.get(task), 1, cfg.n_train, f"task {task!r}")
    if task.startswith(FEYNMAN_PREFIX):
        eq = feynman_equation(task)
        return TaskShape("regression", eq.in_dim, 1, cfg.n_train, f"task {task!r} ({eq.formula})",
                         tuple(v[0] for v in eq.variables))
    if task in BUNDLED:
        b = BUNDLED[task]
        if cfg.n_val >= b.rows:
            raise ConfigError(f"n_val: task {task!r} has {b.rows} rows; n_val={cfg.n_val} leaves none to train on "
                              f"(e.g. n_val={b.rows // 5})")
        kind = "classification" if b.n_classes else "regression"
        return TaskShape(kind, b.in_dim, b.n_classes or 1, min(cfg.n_train, b.rows - cfg.n_val), f"task {task!r}")
    if task == "file":
        path = cfg.data_path
        if not path:
            raise ConfigError("data_path: task 'file' needs a data file (CSV or .npz), got ''")
        if not os.path.isfile(path):
            raise ConfigError(f"data_path: no such file {path!r}")
        if not path.endswith((".csv", ".npz")):
            raise ConfigError(f"data_path: expected a .csv or .npz file, got {path!r}")
        if path.endswith(".npz") and cfg.target:
            raise ConfigError(f"target: names a CSV column; an .npz file's target is its array 'y', got "
                              f"target={cfg.target!r}")
        try:
            st = os.stat(path)
            names, rows = _file_summary(path, cfg.target, st.st_mtime_ns, st.st_size)
        except TargetColumnError as e:
            raise ConfigError(f"target: {e}") from None
        except ValueError as e:
            raise ConfigError(f"data_path: {e}") from None
        if rows is not None and cfg.n_val >= rows:
            raise ConfigError(f"n_val: {path} has {rows} rows; n_val={cfg.n_val} leaves none to train on")
        train_rows = None if rows is None else min(cfg.n_train, rows - cfg.n_val)
        return TaskShape("regression", len(names), 1, train_rows, path, names)
    known = [*SYNTHETIC_DOCS, *BUNDLED, FEYNMAN_PREFIX + "<name>", "file"]
    raise ConfigError(f"task: unknown value {task!r}; choose one of {', '.join(known)}")


def check_task(cfg) -> None:
    """Refuse, naming the field, a task the config cannot train on (called by ``RunConfig.validate``).

    Checks the task name, the input width (``widths[0]``), the output width (``widths[-1]``: 1 for
    regression, the number of classes for classification) and that ``global_batch`` fits the training
    rows where they are known without reading data (every task but a CSV file, whose rows are counted
    when the run reads it). Reads only a data file's header line (CSV) or array headers (NPZ).
    """
    s = task_shape(cfg)
    if s.in_dim is not None and cfg.widths[0] != s.in_dim:
        names = f" ({', '.join(s.feature_names)})" if s.feature_names else ""
        unit = "features" if cfg.task == "file" else "inputs"
        raise ConfigError(f"widths: {s.what} has {s.in_dim} {unit}{names}, but widths[0]={cfg.widths[0]}")
    if cfg.widths[-1] != s.out_dim:
        what = f"{s.out_dim} classes" if s.kind == "classification" else "1 output (regression)"
        raise ConfigError(f"widths: {s.what} has {what}, so widths[-1] must be {s.out_dim}, "
                          f"got widths[-1]={cfg.widths[-1]}")
    if s.train_rows is not None and cfg.global_batch > s.train_rows:
        raise ConfigError(f"global_batch: {cfg.global_batch} exceeds the {s.train_rows} training rows of {s.what}")


def training_rows(cfg) -> int:
    """The training rows a run of ``cfg`` gets: ``n_train``, or at most that many of a data set's or file's rows
    (those ``n_val`` leaves). A CSV file's rows are counted, with the parser of :func:`read_table`, once per file
    version: only ``global_batch=0`` needs them before the run reads the file."""
    s = task_shape(cfg)
    if s.train_rows is not None:
        return s.train_rows
    st = os.stat(cfg.data_path)
    try:
        rows = _csv_rows(cfg.data_path, st.st_mtime_ns, st.st_size)
    except ValueError as e:
        raise ConfigError(f"data_path: {e}") from None
    if cfg.n_val >= rows:
        raise ConfigError(f"n_val: {cfg.data_path} has {rows} rows; n_val={cfg.n_val} leaves none to train on")
    return min(cfg.n_train, rows - cfg.n_val)


@functools.lru_cache(maxsize=64)
def _csv_rows(path: str, mtime_ns: int, size: int) -> int:
    """Data rows of a CSV file (blank lines are not rows), without converting a value; cached per file version."""
    try:
        with _open_csv(path) as f:
            reader = _csv_reader(f)
            next(reader, None)  # the header
            return sum(1 for row in reader if row)
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{path}: cannot read as CSV: {e}") from None


def make_dataset(cfg) -> Dataset:
    """The dataset of a :class:`kanlib.config.RunConfig`; checks that it fits the model and batch."""
    dtype = training_dtype(cfg.precision)
    if cfg.task == "file":
        data = FileRegression(cfg.data_path, cfg.target, cfg.n_train, cfg.n_val, cfg.seed, dtype)
        if data.in_dim != cfg.widths[0]:
            raise ValueError(f"widths: {cfg.data_path} has {data.in_dim} features "
                             f"({', '.join(data.feature_names)}), but widths[0]={cfg.widths[0]}")
    elif cfg.task in BUNDLED:
        data = bundled_dataset(cfg.task, cfg.n_train, cfg.n_val, cfg.seed, dtype)
    elif cfg.task.startswith(FEYNMAN_PREFIX):
        data = FeynmanRegression(cfg.task, cfg.n_train, cfg.n_val, cfg.seed, dtype)
    else:
        data = SyntheticRegression(cfg.task, cfg.widths[0], cfg.n_train, cfg.n_val, cfg.seed, dtype)
    if cfg.global_batch > data.n_train:
        raise ValueError(f"global_batch: {cfg.global_batch} exceeds the {data.n_train} training rows")
    return data
