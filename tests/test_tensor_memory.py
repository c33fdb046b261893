"""The tensor memory of a training step (kanlib.metrics.step_tensor_peak_bytes): what the step's tensors take as the
allocator counts them, on CPU from torch's profiler's memory events, instead of the process's resident set, which
the framework dominates and which barely moves with the model's size (issue 36, 2(b))."""

import os

import pytest
import torch

from runhelp import tiny

from kanlib import metrics
from kanlib.data import make_dataset
from kanlib.model import KAN, build_model


def _kan_step(width: int, batch: int = 128):
    """A KAN (2, width, width, 1) with Adam after one step (its state exists) and a closure of its next step."""
    torch.manual_seed(0)
    model = KAN((2, width, width, 1), grid_size=5, spline_order=3, impl="reference")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.rand(batch, 2) * 2 - 1, torch.rand(batch, 1)

    def step():
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    return model, opt, step


def test_a_steps_tensor_memory_holds_its_state_and_grows_with_the_model():
    """At least the parameters, their gradients and Adam's two states (4 x the parameters' bytes, which the resident
    set of a 450 MB process does not resolve), more with a larger model and with a larger batch (activations)."""
    cpu = torch.device("cpu")
    peaks = []
    for width in (4, 16, 64):
        model, opt, step = _kan_step(width)
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        assert metrics.state_tensor_bytes(model, opt) >= 3 * param_bytes  # parameters and Adam's two states
        peak = metrics.step_tensor_peak_bytes(step, cpu, model, opt)
        assert peak >= 4 * param_bytes  # the gradients come during the step: the allocator's rise holds them
        peaks.append(peak)
    assert peaks[0] < peaks[1] < peaks[2]
    model, opt, step = _kan_step(16, batch=512)  # four times the batch: more activations, same state
    assert metrics.step_tensor_peak_bytes(step, cpu, model, opt) > peaks[1] + 3 * 128 * 16 * 4


def test_a_run_records_its_tensor_memory_and_keeps_its_trained_model(tmp_path):
    """A real two-process DDP run: the record carries the tensor memory of one extra step (its state with DDP's
    buckets at the least), and that step, taken after the measured ones, leaves model.pt the trained model (its
    validation loss is the record's, computed before the step)."""
    from runners.launch import run

    cfg = tiny(tmp_path, widths=(2, 8, 1))
    rec = run(cfg, echo=False)
    param_bytes = 4 * rec["n_params"]
    assert rec["tensor_peak_bytes"] >= 5 * param_bytes  # parameters, buckets, gradients, Adam's two states
    assert rec["tensor_peak_bytes"] < rec["peak_mem_bytes"] / 100  # not the resident set
    model = build_model(cfg)
    model.load_state_dict(torch.load(os.path.join(cfg.run_dir(), "model.pt"), weights_only=True))
    val = make_dataset(cfg).evaluate(model, torch.device("cpu"), chunk=cfg.local_batch, pad=True)["val_loss"]
    assert val == pytest.approx(rec["final_val_loss"], rel=1e-9, abs=0)
