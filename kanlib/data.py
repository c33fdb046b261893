"""A run's data, sharded per rank: synthetic tasks, the Feynman equations, bundled data sets, files.

``RunConfig.task`` picks the data (:data:`TASK_DOCS`):

- ``exp_sin``, ``highdim``, ``product``: synthetic regression on inputs uniform in ``[-1, 1]^d``.
- ``feynman:<name>``: an equation of the AI Feynman suite (``kanlib.feynman.FEYNMAN``), generated from its
  formula on its variable ranges, inputs scaled to ``[-1, 1]``.
- ``digits`` (classification, 10 classes) and ``diabetes`` (regression): the data sets bundled inside
  scikit-learn (read from a file in the installed package; no network).
- ``file``: a CSV or ``.npz`` file (``data_path``), parsed by one parser (``kanlib.datafiles``: ``read_table``,
  ``csv_header``) for both the pre-launch check and the full read.

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

import math
import os
from dataclasses import dataclass

import torch

from kanlib.datafiles import TargetColumnError, csv_rows, file_summary, read_table_with_lines
from kanlib.errors import ConfigError
from kanlib.feynman import FEYNMAN, FEYNMAN_PREFIX, feynman_equation

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
    """Real data from a CSV or NPZ file (:func:`kanlib.datafiles.read_table`), split into training and validation
    rows by ``seed``: the last ``n_val`` rows of a seeded shuffle validate, at most ``n_train`` of the rest train."""

    def __init__(self, path: str, target_column: str, n_train: int, n_val: int, seed: int, dtype=torch.float32):
        x, y, names, target_name, lines = read_table_with_lines(path, target_column)
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
            names, rows = file_summary(path, cfg.target, st.st_mtime_ns, st.st_size)
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
    (those ``n_val`` leaves). A CSV file's rows are counted, with the parser of :func:`kanlib.datafiles.read_table`,
    once per file version: only ``global_batch=0`` needs them before the run reads the file."""
    s = task_shape(cfg)
    if s.train_rows is not None:
        return s.train_rows
    st = os.stat(cfg.data_path)
    try:
        rows = csv_rows(cfg.data_path, st.st_mtime_ns, st.st_size)
    except ValueError as e:
        raise ConfigError(f"data_path: {e}") from None
    if cfg.n_val >= rows:
        raise ConfigError(f"n_val: {cfg.data_path} has {rows} rows; n_val={cfg.n_val} leaves none to train on")
    return min(cfg.n_train, rows - cfg.n_val)



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
