#!/usr/bin/env bash
# One-GPU check (benchmarks/gpu_check.py): the KAN layer benchmark, the collective benchmark and one
# training run per model size on one CUDA GPU with NCCL, all records under one folder, in a few minutes.
#   bash benchmarks/gpu_check.sh [OUT]        (default outputs/gpu_check; PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m benchmarks.gpu_check --out "${1:-outputs/gpu_check}"
