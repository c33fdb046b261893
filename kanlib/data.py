"""Regression data, sharded per rank: synthetic tasks generated from a seed, or real data from a file.

Every rank builds the same training and validation tensors (from ``seed``, or from the file with a
seeded split); step ``s``
draws a global batch of indices from a per-epoch permutation (also seeded), and rank
``r`` of ``W`` takes the ``r``-th of ``W`` equal, disjoint slices of it. So the data a
run sees depends only on the config, never on the number of processes.
"""

from __future__ import annotations

import math
import os

import torch

# Inputs of fixed width for the tasks that have one (``highdim`` takes widths[0]).
TASK_INPUT_DIM = {"exp_sin": 2, "product": 2}

TASK_DOCS = {
    "exp_sin": "f(x1, x2) = exp(sin(pi x1) + x2^2)  (KAN paper, Fig. 2)",
    "highdim": "f(x) = exp(mean_i sin^2(pi x_i / 2))  (KAN paper's 100-d example, width = widths[0])",
    "product": "f(x1, x2) = x1 x2",
}


def target(task: str, x: torch.Tensor) -> torch.Tensor:
    """x: ``(n, d)`` in ``[-1, 1]^d`` -> ``(n, 1)`` targets of ``task``."""
    if task == "exp_sin":
        y = torch.exp(torch.sin(math.pi * x[:, 0]) + x[:, 1] ** 2)
    elif task == "highdim":
        y = torch.exp(torch.sin(math.pi * x / 2).pow(2).mean(dim=1))
    elif task == "product":
        y = x[:, 0] * x[:, 1]
    else:
        raise ValueError(f"task: unknown value {task!r}; choose one of {', '.join(TASK_DOCS)}")
    return y.unsqueeze(1)


class RegressionData:
    """Training and validation tensors, and the per-rank shard of each global batch.

    x_train: ``(n_train, d)``, y_train: ``(n_train, 1)``; likewise the validation set.
    """

    def __init__(self, x_train, y_train, x_val, y_val, seed: int, task: str = ""):
        self.x_train, self.y_train, self.x_val, self.y_val = x_train, y_train, x_val, y_val
        self.task, self.seed = task, seed
        self.in_dim = x_train.shape[1]
        self.n_train, self.n_val = x_train.shape[0], x_val.shape[0]
        self._perm_epoch, self._perm = -1, None

    kind = "regression"
    chance_accuracy = None

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training loss of predictions ``out: (b, out_dim)`` against ``y``: mean squared error."""
        return torch.nn.functional.mse_loss(out.float(), y)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, device, chunk: int = 8192) -> dict:
        """``{"val_loss": ..., "val_accuracy": None}`` of ``model`` on the validation set, in chunks."""
        was_training = model.training
        model.eval()
        total = 0.0
        for i in range(0, self.n_val, chunk):
            xb, yb = self.x_val[i:i + chunk].to(device), self.y_val[i:i + chunk].to(device)
            total += torch.nn.functional.mse_loss(model(xb).float(), yb, reduction="sum").item()
        model.train(was_training)
        return {"val_loss": total / self.n_val, "val_accuracy": None}

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
        """This rank's disjoint slice of step ``step``'s global batch: ``x (b, d), y (b, 1)``."""
        if global_batch % world_size:
            raise ValueError(f"global_batch {global_batch} is not divisible by world_size {world_size}")
        b = global_batch // world_size
        idx = self.global_indices(step, global_batch)[rank * b:(rank + 1) * b]
        return self.x_train[idx], self.y_train[idx]


class SyntheticRegression(RegressionData):
    """A synthetic task on inputs uniform in ``[-1, 1]^in_dim``, generated from ``seed``."""

    def __init__(self, task: str, in_dim: int, n_train: int, n_val: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        x = torch.rand(n_train + n_val, in_dim, generator=g) * 2 - 1  # (n, d) uniform on [-1, 1]
        y = target(task, x)
        super().__init__(x[:n_train], y[:n_train], x[n_train:], y[n_train:], seed, task)


def read_table(path: str, target_column: str = "") -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Features and target of a data file: ``x (n, d)``, ``y (n, 1)`` as float32, and the feature names.

    CSV: a header row and numeric columns; ``target_column`` (default: the last column) is the
    target, every other column a feature. NPZ: arrays ``x`` (n, d) and ``y`` (n,) or (n, 1).
    Rows with a missing or non-numeric value are an error naming the file and the row.
    """
    import numpy as np

    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            if "x" not in z or "y" not in z:
                raise ValueError(f"{path}: an .npz data file needs arrays 'x' and 'y', has {sorted(z.files)}")
            x, y = np.asarray(z["x"], dtype=np.float64), np.asarray(z["y"], dtype=np.float64).reshape(-1, 1)
        if x.ndim != 2:
            raise ValueError(f"{path}: array 'x' must be 2-D (rows, features), got shape {x.shape}")
        names = [f"x{i}" for i in range(x.shape[1])]
    else:
        import pandas as pd

        df = pd.read_csv(path)
        col = target_column or df.columns[-1]
        if col not in df.columns:
            raise ValueError(f"{path}: no target column {col!r} (columns: {', '.join(map(str, df.columns))})")
        num = df.apply(pd.to_numeric, errors="coerce")
        bad = num.isna().any(axis=1).to_numpy()
        if bad.any():
            row = int(bad.argmax())
            raise ValueError(f"{path}: data row {row + 1} (line {row + 2} of the file) has a missing or non-numeric "
                             f"value: {df.iloc[row].to_dict()}")
        names = [c for c in df.columns if c != col]
        x, y = num[names].to_numpy(np.float64), num[[col]].to_numpy(np.float64)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"{path}: x has shape {x.shape} but y has {y.shape[0]} rows")
    return torch.tensor(x), torch.tensor(y), names


def file_features(path: str, target_column: str = "") -> list[str]:
    """Feature names of a data file, reading only its header (CSV) or array shape (NPZ)."""
    import numpy as np

    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            if "x" not in z or z["x"].ndim != 2:
                raise ValueError(f"{path}: an .npz data file needs a 2-D array 'x' and an array 'y', "
                                 f"has {sorted(z.files)}")
            return [f"x{i}" for i in range(z["x"].shape[1])]
    with open(path) as f:
        header = [c.strip() for c in f.readline().rstrip("\n").split(",")]
    col = target_column or header[-1]
    if col not in header:
        raise ValueError(f"{path}: no target column {col!r} (columns: {', '.join(header)})")
    return [c for c in header if c != col]


class FileRegression(RegressionData):
    """Real data from a CSV or NPZ file, split into training and validation sets by ``seed``.

    The last ``n_val`` rows of a seeded shuffle are the validation set; the training set is the rest,
    at most ``n_train`` rows. Features are scaled to ``[-1, 1]`` (the spline grid's range) and the
    target to zero mean and unit variance, with statistics of the training set only.
    """

    def __init__(self, path: str, target_column: str, n_train: int, n_val: int, seed: int):
        x, y, self.feature_names = read_table(path, target_column)
        n = x.shape[0]
        if n_val >= n:
            raise ValueError(f"n_val: {n_val} validation rows leave none to train on in {path} ({n} rows)")
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        tr, va = perm[: min(n_train, n - n_val)], perm[n - n_val:]
        lo, hi = x[tr].min(dim=0).values, x[tr].max(dim=0).values
        span = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
        mu, sd = y[tr].mean(), y[tr].std().clamp_min(1e-12)
        xs = ((x - lo) / span * 2 - 1).float()  # training features in [-1, 1]
        ys = ((y - mu) / sd).float()
        self.path, self.x_scale = path, (lo, span)
        self.y_mean, self.y_std = float(mu), float(sd)
        super().__init__(xs[tr], ys[tr], xs[va], ys[va], seed, "file")


def check_task(cfg) -> None:
    """Refuse, naming the field, a task or data file the config cannot train on (called by RunConfig).

    Reads only a data file's header (CSV) or array shapes (NPZ), never the whole file.
    """
    from kanlib.config import ConfigError

    known = (*TASK_DOCS, "file")
    if cfg.task not in known:
        raise ConfigError(f"task: unknown value {cfg.task!r}; choose one of {', '.join(known)}")
    if cfg.task == "file":
        if not cfg.data_path:
            raise ConfigError("data_path: task 'file' needs a data file (CSV or .npz), got ''")
        if not os.path.isfile(cfg.data_path):
            raise ConfigError(f"data_path: no such file {cfg.data_path!r}")
        if not cfg.data_path.endswith((".csv", ".npz")):
            raise ConfigError(f"data_path: expected a .csv or .npz file, got {cfg.data_path!r}")
        try:
            names = file_features(cfg.data_path, cfg.target)
        except ValueError as e:
            raise ConfigError(f"data_path: {e}") from None
        if len(names) != cfg.widths[0]:
            raise ConfigError(f"widths: {cfg.data_path} has {len(names)} features ({', '.join(names)}), "
                              f"but widths[0]={cfg.widths[0]}")
    elif cfg.data_path or cfg.target:
        raise ConfigError(f"data_path: only task 'file' reads a data file, but task={cfg.task!r}")
    want = TASK_INPUT_DIM.get(cfg.task)
    if want is not None and cfg.widths[0] != want:
        raise ConfigError(f"widths: task {cfg.task!r} has {want} inputs, but widths[0]={cfg.widths[0]}")
    if cfg.widths[-1] != 1:
        raise ConfigError(f"widths: the regression tasks have 1 output, but widths[-1]={cfg.widths[-1]}")
    if cfg.global_batch > cfg.n_train and cfg.task != "file":
        raise ConfigError(f"global_batch: {cfg.global_batch} exceeds n_train={cfg.n_train}")


def make_dataset(cfg) -> RegressionData:
    """The dataset of a :class:`kanlib.config.RunConfig`; checks that it fits the model and batch."""
    if cfg.task == "file":
        data = FileRegression(cfg.data_path, cfg.target, cfg.n_train, cfg.n_val, cfg.seed)
        if data.in_dim != cfg.widths[0]:
            raise ValueError(f"widths: {cfg.data_path} has {data.in_dim} features "
                             f"({', '.join(data.feature_names)}), but widths[0]={cfg.widths[0]}")
    else:
        data = SyntheticRegression(cfg.task, cfg.widths[0], cfg.n_train, cfg.n_val, cfg.seed)
    if cfg.global_batch > data.n_train:
        raise ValueError(f"global_batch: {cfg.global_batch} exceeds the {data.n_train} training rows")
    return data
