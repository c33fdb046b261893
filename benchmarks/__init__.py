"""Benchmarks; each module runs with ``python -m benchmarks.<name>``."""
