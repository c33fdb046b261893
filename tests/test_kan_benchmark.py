"""benchmarks/kan_layer.py: rows record the path that ran, acceptance compares ratios from one run."""

from __future__ import annotations

import pytest
import torch

from benchmarks import kan_layer


@pytest.mark.slow  # compiles the default KAN
def test_bench_config_rows_record_paths_and_ratios():
    torch._dynamo.reset()
    rows = kan_layer.bench_config((4, 8, 1), 32, 1, torch.device("cpu"), reps=2, warmup=1, budget_s=5.0,
                                  only={"kan", "kan_fast", "kan_reference", "mlp_matched"})
    by = {r["model"]: r for r in rows}
    assert set(by) == {"kan", "kan_fast", "kan_reference", "mlp_matched"}
    assert by["kan"]["kan_path"] == "compiled"  # the default path, and it really ran compiled
    assert by["kan_fast"]["kan_path"] == "fast" and by["kan_reference"]["kan_path"] == "reference"
    assert "kan_path" not in by["mlp_matched"]
    for r in rows:
        assert r["reps"] == 2 and r["step_ms"] > 0 and r["fwd_bwd_ms"] > 0
        assert abs(r["step_vs_mlp"] - r["step_ms"] / by["mlp_matched"]["step_ms"]) < 1e-12
    assert by["mlp_matched"]["step_vs_mlp"] == 1.0


def _row(model, step_ms, path=""):
    return {"model": model, "widths": [64, 256, 256, 1], "batch": 512, "threads": 1, "device": "cpu",
            "step_ms": step_ms, "step_vs_mlp": step_ms / 10.0, "kan_path": path}


def test_acceptance_compares_side_by_side():
    rows = [_row("mlp_matched", 10.0), _row("kan", 12.0, "compiled"), _row("kan_fast", 14.0, "fast"),
            _row("flashkan", 13.0), _row("inkan", 11.0)]
    cost = {"cold": {"compile_s": 20.0}, "warm": {"compile_s": 1.5}}
    acc = kan_layer.acceptance(rows, cost)
    assert acc["default KAN(widths) within 1.3x of the matched MLP"] == (True, "1.20x (compiled)")
    assert acc["eager fast path within 1.3x of the matched MLP"][0] is False
    assert acc["default KAN faster than flashkan"][0] is True
    assert acc["default KAN faster than inkan"][0] is False
    assert acc["second process compiles in <= 2 s"][0] is True
    assert kan_layer.acceptance([_row("kan", 12.0)]) is None  # no MLP measured: nothing to compare
