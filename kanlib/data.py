"""Synthetic regression tasks, generated deterministically from a seed, sharded per rank.

Every rank builds the same training and validation tensors from ``seed``; step ``s``
draws a global batch of indices from a per-epoch permutation (also seeded), and rank
``r`` of ``W`` takes the ``r``-th of ``W`` equal, disjoint slices of it. So the data a
run sees depends only on the config, never on the number of processes.
"""

from __future__ import annotations

import math

import torch

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


class SyntheticRegression:
    """Training and validation sets of a task, and the per-rank shard of each global batch."""

    def __init__(self, task: str, in_dim: int, n_train: int, n_val: int, seed: int):
        self.task, self.in_dim, self.n_train, self.n_val, self.seed = task, in_dim, n_train, n_val, seed
        g = torch.Generator().manual_seed(seed)
        x = torch.rand(n_train + n_val, in_dim, generator=g) * 2 - 1  # (n, d) uniform on [-1, 1]
        y = target(task, x)
        self.x_train, self.y_train = x[:n_train], y[:n_train]
        self.x_val, self.y_val = x[n_train:], y[n_train:]
        self._perm_epoch, self._perm = -1, None

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


def make_dataset(cfg) -> SyntheticRegression:
    """The dataset of a :class:`kanlib.config.RunConfig`."""
    return SyntheticRegression(cfg.task, cfg.widths[0], cfg.n_train, cfg.n_val, cfg.seed)
