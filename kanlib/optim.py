"""L-BFGS for data-parallel KAN training, with pykan's settings.

:class:`LBFGS` is pykan 0.2.8's L-BFGS (``kan/LBFGS.py``, itself torch's ``torch.optim.LBFGS`` with a
``tolerance_ys`` threshold), written so that every rank of a DDP or FSDP run takes the same step:

- the closure returns the loss *averaged over the ranks* (the caller all-reduces it), so the strong
  Wolfe line search makes the same decisions, and the same number of closure calls, on every rank;
- under DDP the gradients are already all-reduced and the parameters replicated: every rank runs the
  same arithmetic on the same numbers and ends bitwise equal;
- under FSDP each rank holds a shard of the parameters and gradients: the flat vectors of the
  algorithm are this rank's shards, and every scalar the algorithm reads from them (dot products,
  max and sum of absolute values) is all-reduced over the ranks (``all_reduce``), so the shards move
  as one vector would.

Differences from ``torch.optim.LBFGS``: pykan's defaults (:data:`PYKAN_DEFAULTS`: history 10, strong
Wolfe line search, tolerances 1e-32 so that a step always runs its ``max_iter`` iterations unless the
line search stalls), ``tolerance_ys`` (torch hard-codes 1e-10) and ``step(closure, loss=...)``: the
first loss and gradients of a step may come from the caller's own forward and backward (the trainer
times them as the step's forward and backward and checks them for NaN first), which saves one of the
step's evaluations. pykan also reseeds torch's RNG at each step (``torch.manual_seed(0)``); kanlib does
not (nothing in the step draws random numbers).

Mini-batches. L-BFGS's natural batch is the whole training set (``RunConfig.global_batch`` = 0, the default), where
every step evaluates the same function. With a smaller batch each step's closure evaluates other samples, and two
things torch's (and pykan's) L-BFGS does went wrong on digits (64-32-10, batches of 256 of 1024 training rows: a NaN
loss at step 17 here, 119 in issue 34): (1) the first curvature pair of a step spans two batches, ``y = g_B(x_k) -
g_A(x_k-1)``, the difference of two batches' gradients rather than curvature; it set the scaling ``H_diag`` up to
7e5 and trial steps reached losses of 1e25; ``step(new_batch=True)`` forms no such pair (the trainer passes it when
the global batch is smaller than the training set). (2) The line search took a trial with a non-finite loss for
progress and its cubic interpolation through it gave a NaN step length; here such a trial counts as overshooting
(:func:`_strong_wolfe`). Neither changes a step whose losses are finite on one batch: full-batch iterates equal
torch's to the bit.

:attr:`LBFGS.last_evals` is the number of loss and gradient evaluations of the last step (the first
one included): the cost of an L-BFGS step in forward and backward passes (1 for Adam or SGD).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch.optim import Optimizer

PYKAN_DEFAULTS = dict(lr=1.0, max_iter=20, max_eval=25, history_size=10, tolerance_grad=1e-32,
                      tolerance_change=1e-32, tolerance_ys=1e-32)
"""pykan 0.2.8's ``MultKAN.fit(opt="LBFGS")``: ``LBFGS(lr=1, history_size=10, line_search_fn="strong_wolfe",
tolerance_grad=1e-32, tolerance_change=1e-32, tolerance_ys=1e-32)`` with the class defaults ``max_iter=20``,
``max_eval = max_iter * 5 // 4``; its line search keeps torch's ``c1=1e-4, c2=0.9, tolerance_change=1e-9,
max_ls=25``."""

LINE_SEARCH = dict(c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25)
"""The strong Wolfe line search's constants (torch's and pykan's; pykan does not pass its own tolerance)."""


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (possibly FSDP-sharded) tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


class _Ops:
    """The reductions of the algorithm over the flat vectors: local, or all-reduced over the shards."""

    def __init__(self, all_reduce: Callable[[torch.Tensor, str], torch.Tensor] | None):
        self.all_reduce = all_reduce

    def dot(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        v = a.dot(b)
        return v if self.all_reduce is None else self.all_reduce(v, "sum")

    def abs_max(self, a: torch.Tensor) -> torch.Tensor:
        v = a.abs().max() if a.numel() else a.new_zeros(())
        return v if self.all_reduce is None else self.all_reduce(v, "max")

    def abs_sum(self, a: torch.Tensor) -> torch.Tensor:
        v = a.abs().sum()
        return v if self.all_reduce is None else self.all_reduce(v, "sum")


class LBFGS(Optimizer):
    """L-BFGS with a strong Wolfe line search; pykan's settings by default (module docstring).

    ``all_reduce(tensor, op)`` (``op`` "sum" or "max") returns a 0-d tensor reduced over the ranks that
    hold the other shards of the parameters (FSDP); None when every rank holds all of them (one process,
    DDP). The closure must zero nothing itself: :meth:`step` zeroes the gradients before each call; it
    runs forward and backward and returns the loss averaged over the ranks (a float or 0-d tensor).
    """

    def __init__(self, params, lr: float = 1.0, max_iter: int = 20, max_eval: int | None = None,
                 history_size: int = 10, tolerance_grad: float = 1e-32, tolerance_change: float = 1e-32,
                 tolerance_ys: float = 1e-32, all_reduce=None):
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        if not lr > 0 or max_iter < 1 or max_eval < 1 or history_size < 1:
            raise ValueError(f"LBFGS: lr > 0, max_iter, max_eval, history_size >= 1 needed, got lr={lr}, "
                             f"max_iter={max_iter}, max_eval={max_eval}, history_size={history_size}")
        defaults = dict(lr=lr, max_iter=max_iter, max_eval=max_eval, history_size=history_size,
                        tolerance_grad=tolerance_grad, tolerance_change=tolerance_change, tolerance_ys=tolerance_ys)
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS takes one parameter group")
        self._params = self.param_groups[0]["params"]
        self._ops = _Ops(all_reduce)
        self.last_evals = 0

    # -- flat vectors of this rank's (shards of the) parameters -----------------------------------------
    def _flat_grad(self) -> torch.Tensor:
        views = []
        for p in self._params:
            local = _local(p)
            views.append(local.new_zeros(local.numel()) if p.grad is None else _local(p.grad).reshape(-1))
        return torch.cat(views)

    def _add(self, step: float | torch.Tensor, d: torch.Tensor) -> None:
        offset = 0
        for p in self._params:
            local = _local(p)
            n = local.numel()
            local.add_(d[offset:offset + n].view_as(local), alpha=step)
            offset += n

    def _clone(self) -> list[torch.Tensor]:
        return [_local(p).clone(memory_format=torch.contiguous_format) for p in self._params]

    def _set(self, values: list[torch.Tensor]) -> None:
        for p, v in zip(self._params, values):
            _local(p).copy_(v)

    def _evaluate(self, closure) -> tuple[float, torch.Tensor]:
        self.zero_grad(set_to_none=True)
        with torch.enable_grad():
            loss = float(closure())
        return loss, self._flat_grad()

    def _directional_evaluate(self, closure, x, t, d) -> tuple[float, torch.Tensor]:
        self._add(t, d)
        loss, flat_grad = self._evaluate(closure)
        self._set(x)
        return loss, flat_grad

    @torch.no_grad()
    def step(self, closure, loss: float | None = None, new_batch: bool = False) -> float:
        """One L-BFGS step of up to ``max_iter`` iterations (``max_eval`` evaluations); returns the loss at its
        start. ``loss``: the loss of the current parameters, whose gradients are already in ``.grad`` (the
        caller's forward and backward); None: the closure evaluates them first. ``new_batch``: the closure
        evaluates other samples than the last step's (a mini-batch), so no curvature pair is formed across the two
        steps (module docstring)."""
        group = self.param_groups[0]
        lr, max_iter, max_eval = group["lr"], group["max_iter"], group["max_eval"]
        tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
        tolerance_ys, history_size = group["tolerance_ys"], group["history_size"]
        ops = self._ops

        # Only global state, kept under the first parameter (so load_state_dict casts it like the others).
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        if loss is None:
            loss, flat_grad = self._evaluate(closure)
        else:
            loss, flat_grad = float(loss), self._flat_grad()
        orig_loss = loss
        current_evals = 1
        state["func_evals"] += 1
        self.last_evals = current_evals
        if ops.abs_max(flat_grad) <= tolerance_grad:
            return orig_loss

        d, t = state.get("d"), state.get("t")
        old_dirs, old_stps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
        H_diag, prev_flat_grad, prev_loss = state.get("H_diag"), state.get("prev_flat_grad"), state.get("prev_loss")

        n_iter = 0
        across_batches = new_batch  # this step's first gradient and the last step's are of different samples
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            # -- the direction: steepest descent first, then the two-loop recursion over the history
            if state["n_iter"] == 1:
                d = flat_grad.neg()
                old_dirs, old_stps, ro = [], [], []
                H_diag = 1
            else:
                y, s = flat_grad.sub(prev_flat_grad), d.mul(t)
                ys = ops.dot(y, s)
                if ys > tolerance_ys and not across_batches:
                    if len(old_dirs) == history_size:
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    H_diag = ys / ops.dot(y, y)
                d = _two_loop(ops, flat_grad, old_dirs, old_stps, ro, H_diag)
            across_batches = False
            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.clone(memory_format=torch.contiguous_format)
            else:
                prev_flat_grad.copy_(flat_grad)
            prev_loss = loss

            # -- the step length: a strong Wolfe line search from t = lr (the very first: min(1, 1/|g|_1) lr)
            t = min(1.0, 1.0 / ops.abs_sum(flat_grad)) * lr if state["n_iter"] == 1 else lr
            gtd = ops.dot(flat_grad, d)
            if not gtd < -tolerance_change:  # not a descent direction (or not finite): no step
                break
            x_init = self._clone()

            def obj_func(x, t, d):
                return self._directional_evaluate(closure, x, t, d)

            loss, flat_grad, t, ls_func_evals = _strong_wolfe(obj_func, x_init, t, d, loss, flat_grad, gtd, ops,
                                                              **LINE_SEARCH)
            self._add(t, d)
            opt_cond = ops.abs_max(flat_grad) <= tolerance_grad
            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals

            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if ops.abs_max(d.mul(t)) <= tolerance_change:  # lack of progress
                break
            if abs(loss - prev_loss) < tolerance_change:
                break

        state.update(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=H_diag,
                     prev_flat_grad=prev_flat_grad, prev_loss=prev_loss)
        self.last_evals = current_evals
        return orig_loss


def _two_loop(ops, flat_grad, old_dirs, old_stps, ro, H_diag):
    """L-BFGS's two-loop recursion (torch's): the direction -H g from the curvature pairs kept in the history."""
    al = [None] * len(old_dirs)
    q = flat_grad.neg()
    for i in range(len(old_dirs) - 1, -1, -1):
        al[i] = ops.dot(old_stps[i], q) * ro[i]
        q.add_(old_dirs[i], alpha=-al[i])
    d = r = torch.mul(q, H_diag)
    for i in range(len(old_dirs)):
        be_i = ops.dot(old_dirs[i], r) * ro[i]
        r.add_(old_stps[i], alpha=al[i] - be_i)
    return d


# -- the line search: torch's / pykan's, with the reductions of _Ops ----------------------------------------
def _cubic_interpolate(x1, f1, g1, x2, f2, g2, bounds=None):
    """Minimiser of the cubic through (x1, f1, g1), (x2, f2, g2), clipped to ``bounds`` (torch's); the middle of
    the bounds where there is none, or where it is not finite (an end at an infinite loss, or an overflow: torch
    returns NaN there, and ``min``/``max`` pass a NaN through)."""
    if bounds is not None:
        xmin_bound, xmax_bound = bounds
    else:
        xmin_bound, xmax_bound = (x1, x2) if x1 <= x2 else (x2, x1)
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1 ** 2 - g1 * g2
    if d2_square >= 0:
        d2 = d2_square.sqrt()
        if x1 <= x2:
            min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        if math.isfinite(float(min_pos)):
            return min(max(min_pos, xmin_bound), xmax_bound)
    return (xmin_bound + xmax_bound) / 2.0


def _strong_wolfe(obj_func, x, t, d, f, g, gtd, ops: _Ops, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25):
    """Step length satisfying the strong Wolfe conditions (torch's ``_strong_wolfe``, its dot products and
    max through ``ops``); returns ``(f_new, g_new, t, evaluations)``.

    Unlike torch's, a trial point whose loss or directional derivative is not finite counts as overshooting
    (loss +inf: the step is too long), and a bracket with such an end is bisected (:func:`_cubic_interpolate`).
    torch's comparisons with NaN are all false, so there a NaN trial extrapolated to ten times the step, and a cubic
    through an infinite loss gave a NaN step that turned every parameter into NaN. With the guard the search
    returns a finite point, or its start (step 0) when it found none."""
    d_norm = ops.abs_max(d)
    g = g.clone(memory_format=torch.contiguous_format)

    def evaluate(t):
        f_t, g_t = obj_func(x, t, d)
        gtd_t = ops.dot(g_t, d)
        if not (math.isfinite(f_t) and bool(torch.isfinite(gtd_t))):
            return math.inf, g_t, gtd_t
        return f_t, g_t, gtd_t

    f_new, g_new, gtd_new = evaluate(t)
    ls_func_evals = 1

    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done = False
    ls_iter = 0
    while ls_iter < max_ls:
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.clone(memory_format=torch.contiguous_format)], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.clone(memory_format=torch.contiguous_format)], [gtd_prev, gtd_new]
            break
        # extrapolate
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        tmp = t
        t = _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step))
        t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new.clone(memory_format=torch.contiguous_format), gtd_new
        f_new, g_new, gtd_new = evaluate(t)
        ls_func_evals += 1
        ls_iter += 1
    if ls_iter == max_ls:  # reached the maximum number of extrapolations
        bracket, bracket_f, bracket_g = [0, t], [f, f_new], [g, g_new]

    # zoom: the bracket holds a point satisfying the conditions
    insuf_progress = False
    low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1])
        # a point too close to a bracket end makes little progress: move it inside, once
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            if insuf_progress or t >= max(bracket) or t <= min(bracket):
                t = max(bracket) - eps if abs(t - max(bracket)) < abs(t - min(bracket)) else min(bracket) + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False
        f_new, g_new, gtd_new = evaluate(t)
        ls_func_evals += 1
        ls_iter += 1
        if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low_pos]:
            bracket[high_pos], bracket_f[high_pos] = t, f_new
            bracket_g[high_pos] = g_new.clone(memory_format=torch.contiguous_format)
            bracket_gtd[high_pos] = gtd_new
            low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high_pos] - bracket[low_pos]) >= 0:
                bracket[high_pos], bracket_f[high_pos] = bracket[low_pos], bracket_f[low_pos]
                bracket_g[high_pos], bracket_gtd[high_pos] = bracket_g[low_pos], bracket_gtd[low_pos]
            bracket[low_pos], bracket_f[low_pos] = t, f_new
            bracket_g[low_pos] = g_new.clone(memory_format=torch.contiguous_format)
            bracket_gtd[low_pos] = gtd_new
    return bracket_f[low_pos], bracket_g[low_pos], bracket[low_pos], ls_func_evals


# -- what the trainer calls ------------------------------------------------------------------------------
def make_lbfgs(model: torch.nn.Module, cfg) -> LBFGS:
    """The L-BFGS of ``cfg`` over ``model``'s parameters (after any FSDP sharding: sharded parameters make it
    reduce its scalars over the ranks)."""
    params = list(model.parameters())
    sharded = any(hasattr(p, "to_local") for p in params)
    return LBFGS(params, lr=cfg.lr, max_iter=cfg.lbfgs_max_iter, history_size=cfg.lbfgs_history,
                 all_reduce=_all_reduce if sharded else None)


def state_tensors(cfg) -> int:
    """Parameter-sized tensors L-BFGS keeps (memory accounting): two per curvature pair, the direction and the
    previous gradient."""
    return 2 * cfg.lbfgs_history + 2


def _all_reduce(t: torch.Tensor, op: str) -> torch.Tensor:
    import torch.distributed as dist

    out = t.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return out


def global_loss(loss: torch.Tensor, info) -> float:
    """This rank's loss averaged over the ranks (one small all-reduce): the loss of the global batch when the
    ranks hold equal shards, and the same number on every rank, as L-BFGS's line search needs."""
    if not info.distributed:
        return float(loss)
    from kanlib import distributed

    wide = loss.detach().to(torch.promote_types(loss.dtype, torch.float32))  # float32, or float64 (fp64)
    return float(distributed.all_reduce(wide.reshape(1), info, "sum")) / info.world_size


def lbfgs_step(optimizer: LBFGS, forward_backward, loss: torch.Tensor, info, clock, new_batch: bool = False) -> None:
    """One L-BFGS step from the step's first evaluation (``loss``, gradients in ``.grad``). ``forward_backward()``
    re-evaluates the step's batch (forward and backward, timed by ``clock`` as those phases); the time between
    evaluations (the line search's arithmetic, the loss all-reduce) counts as the optimizer phase. ``new_batch``:
    the step's batch holds other samples than the last step's (:meth:`LBFGS.step`)."""
    def closure() -> float:
        clock.mark("optimizer")
        return global_loss(forward_backward(), info)

    optimizer.step(closure, loss=global_loss(loss, info), new_batch=new_batch)


def gather_state(optimizer: LBFGS, info) -> dict:
    """Under FSDP: every rank's L-BFGS state (its shards of the history) for a checkpoint, in rank order
    (collective). Loaded back by :func:`load_state` on the same world size."""
    import torch.distributed as dist

    ranks = [None] * info.world_size
    dist.all_gather_object(ranks, optimizer.state_dict())
    return {"lbfgs_ranks": ranks}


def load_state(optimizer: LBFGS, state: dict, info) -> None:
    """Restore this rank's part of what :func:`gather_state` saved."""
    optimizer.load_state_dict(state["lbfgs_ranks"][info.rank])


def record_fields(evals: list[int], first: int, model: torch.nn.Module) -> dict:
    """The record's cost and grid fields (kanlib.records.RunRecord): the median over the measured steps
    (``evals[first:]``) of the loss-and-gradient evaluations per step, their total over this attempt's steps,
    and the grid size at the end."""
    import statistics

    from kanlib.model import grid_size_of

    measured = evals[first:]
    return {"evals_per_step": float(statistics.median(measured)) if measured else float("nan"),
            "n_evals": int(sum(evals)), "final_grid_size": grid_size_of(model)}
