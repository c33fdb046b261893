"""kanlib: Kolmogorov-Arnold Networks trained with PyTorch DDP, and the study of how that scales.

The names below are imported on first use, so that importing a part of kanlib that needs no torch (the
analysis, kanlib.config) does not import torch.
"""

import importlib

__version__ = "0.1.0"

GPU_CHECKED: str | None = None
"""Where and when kanlib's CUDA/NCCL path last ran on a GPU (benchmarks/gpu_check.sh; docs/gpu.md), or None while
it never has: the report's bottom line says so."""

_EXPORTS = {
    "kanlib.bspline": ("bspline_basis", "make_grid"),
    "kanlib.config": ("ConfigError", "RunConfig"),
    "kanlib.model": ("KAN", "MLP", "ChebyKAN", "ChebyKANLinear", "KANLinear", "RBFKAN", "RBFKANLinear", "build_model",
                     "compile_seconds", "count_params", "kernel_paths", "matched_mlp", "reset_kernel_paths"),
    "kanlib.grids": ("update_grid_distributed",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = ["bspline_basis", "make_grid", "RunConfig", "ConfigError", "KANLinear", "KAN", "MLP",
           "RBFKANLinear", "RBFKAN", "ChebyKANLinear", "ChebyKAN", "matched_mlp",
           "build_model", "count_params", "update_grid_distributed", "kernel_paths", "reset_kernel_paths",
           "compile_seconds", "__version__"]


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kanlib' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
