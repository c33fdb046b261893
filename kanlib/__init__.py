"""kanlib: Kolmogorov-Arnold Networks trained with PyTorch DDP, and the study of how that scales."""

__version__ = "0.1.0"

from kanlib.bspline import bspline_basis, make_grid  # noqa: E402
from kanlib.config import ConfigError, RunConfig  # noqa: E402
from kanlib.model import (KAN, MLP, ChebyKAN, ChebyKANLinear, KANLinear, RBFKAN,  # noqa: E402
                          RBFKANLinear, build_model, compile_seconds, count_params, kernel_paths,
                          matched_mlp, reset_kernel_paths, update_grid_distributed)

__all__ = ["bspline_basis", "make_grid", "RunConfig", "ConfigError", "KANLinear", "KAN", "MLP",
           "RBFKANLinear", "RBFKAN", "ChebyKANLinear", "ChebyKAN", "matched_mlp",
           "build_model", "count_params", "update_grid_distributed", "kernel_paths", "reset_kernel_paths",
           "compile_seconds", "__version__"]
