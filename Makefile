# Two commands matter: `make study` (run the default study on CPU) and `make test`.
# Both create .venv if it is missing and install kanlib with its notebook and test extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU wheel of torch; the package itself accepts any torch >= 2.6 (see pyproject.toml).
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.kanlib-installed
OUT ?= outputs
NB_OUT := $(OUT)/notebooks
PAPERMILL := $(PY) -m papermill --cwd notebooks --log-output --progress-bar

.PHONY: install study test test-fast bench clean-outputs

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[notebooks,test]"
	touch $(STAMP)

# The launch notebooks run first, then the analyses, then the guidelines (which write the report).
NOTEBOOKS := 01_strong_scaling 02_weak_scaling 03_communication_overhead 04_model_size_scaling \
	01_strong_scaling_analysis 02_weak_scaling_analysis 03_communication_overhead_analysis \
	04_model_size_scaling_analysis 05_guidelines
# Extra papermill arguments, e.g. PARAMS="-f notebooks/params/gpu_cluster.yaml"
PARAMS ?=

study: $(STAMP)
	mkdir -p $(NB_OUT)
	@for nb in $(NOTEBOOKS); do \
	  echo "== $$nb"; \
	  $(PAPERMILL) -p out_dir ../$(OUT) $(PARAMS) notebooks/$$nb.ipynb $(NB_OUT)/$$nb.ipynb || exit 1; \
	done
	@echo "Study written under $(OUT)/: records per study, figures in $(OUT)/figures/, executed notebooks in $(NB_OUT)/"
	@echo "Report: $(OUT)/report.html"

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests notebooks --nbval-lax

test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests -m "not slow and not slurm"

clean-outputs:
	rm -rf $(OUT)/*
	touch $(OUT)/.gitkeep

# KAN layer benchmark (benchmarks/kan_layer.py): installs the published peers beside the pinned
# torch (--no-deps, so torch is not replaced), then measures; BENCH_ARGS=--quick for a smoke run.
bench: $(STAMP)
	$(PY) -m pip install -q --no-deps pykan==0.2.8 flashkan==0.2.0 inkan==0.5.2
	$(PY) -m pip install -q scikit-learn matplotlib pyyaml  # what pykan imports (torch untouched)
	$(PY) -m benchmarks.kan_layer $(BENCH_ARGS)
