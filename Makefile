# Two commands matter: `make study` (run the default study on CPU) and `make test`.
# Both create .venv if it is missing and install kanlib with its notebook and test extras.
PYTHON ?= python3
VENV ?= .venv
# Quoted: a virtual environment at a path with a space (VENV=/home/me/My Projects/kanlib/.venv) still runs; STAMP, a
# make target, cannot hold a space: set STAMP= to a path without one there.
PY := "$(VENV)/bin/python"
# CPU wheel of torch; the package itself accepts any torch >= 2.6 (see pyproject.toml).
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.kanlib-installed
OUT ?= outputs

.PHONY: install study test test-fast bench clean-outputs

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv "$(VENV)"
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[notebooks,test]"
	touch $(STAMP)

# The notebooks are notebooks/*.py (jupytext percent format, no outputs); papermill and nbval run the
# .ipynb generated from them under build/notebooks/ (ignored). Executed notebooks, their offline HTML
# exports, records, figures and the report go under $(OUT); OUT may be absolute and may contain spaces.
NB_BUILD := build/notebooks
# Which notebooks run, and in what order, is the registry's (kanlib/studies/__init__.py: each study's launch and
# analysis notebooks; the launch notebooks run first, then the analyses, then 05_guidelines, which writes the report).
# Extra papermill arguments for every notebook. A notebook refuses a parameter it does not declare, and the
# launch and analysis notebooks declare different ones, so a value for some notebooks goes in a PARAMS_SET file
PARAMS ?=
# A folder of per-notebook parameter files (notebooks/params/<set>/): launch.yaml for every launch
# notebook, then <notebook>.yaml. A notebook refuses a parameter it does not have, so each file holds only
# its notebook's keys. The default, `study`, runs five repeats per point on a 2-core machine in about 8
# minutes (11 cold); the notebooks' own defaults are tiny (CI runs them under nbval); PARAMS_SET=gpu_cluster
# for a GPU cluster; PARAMS_SET= for the notebooks' defaults. A set that does not exist is refused.
PARAMS_SET ?= study
# Analysis notebooks run this many at a time, after every launch notebook has finished (nothing they do is timed),
# each started 3 s after the one before; one whose kernel did not start runs again (two kernels starting at once
# can pick the same free port: jupyter_client's ports are chosen before the kernel binds them).
JOBS ?= 2
# Further options of the study driver (python -m runners.study --help), e.g. STUDY_ARGS=--dry-run to print the
# commands, STUDY_ARGS=--only=01_strong_scaling,05_guidelines to run some notebooks.
STUDY_ARGS ?=
LAB_PORT ?= 8888
# Extra JupyterLab arguments, e.g. LAB_ARGS=--ServerApp.token=secret
LAB_ARGS ?=

.PHONY: notebooks lab

notebooks: $(STAMP)
	$(PY) -m runners.notebook ipynb

# The study driver (runners/study.py) generates and runs the registry's notebooks. A parameter set that launches
# through SLURM (its launch.yaml says launcher: slurm) runs as one allocation: outside one, make study submits one
# batch job that runs make study on its first node, where every sweep's worker groups are job steps; inside one
# (salloc, then make study) it runs here. Every study starts with a look at the machine (runners/preflight.py, kept
# in OUT/preflight/), and ends with one screen: the guidelines' decisions, their intervals and which rest on unstable
# or disturbed points (python -m kanlib.guidelines --summary OUT).
study: $(STAMP)
	@$(PY) -m runners.study "$(OUT)" --params-set="$(PARAMS_SET)" --jobs="$(JOBS)" $(STUDY_ARGS) -- $(PARAMS)

# JupyterLab on 127.0.0.1 with jupytext, rooted at notebooks/: the notebooks/*.py open as notebooks (double-click) and
# save back as text without outputs; the library's .py files are not under that root, so none opens as a notebook.
# --allow-root only when run as root. Settings live in build/lab (ignored).
lab: $(STAMP)
	@mkdir -p build/lab/user-settings/@jupyterlab/docmanager-extension
	@test -f build/lab/user-settings/@jupyterlab/docmanager-extension/plugin.jupyterlab-settings || \
	  echo '{"defaultViewers": {"python": "Jupytext Notebook"}}' \
	  > build/lab/user-settings/@jupyterlab/docmanager-extension/plugin.jupyterlab-settings
	$(PY) -m jupyter lab --no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) \
	  --LabApp.user_settings_dir=build/lab/user-settings --LabApp.workspaces_dir=build/lab/workspaces \
	  $$([ "$$(id -u)" = 0 ] && echo --allow-root) --ServerApp.root_dir=notebooks --ServerApp.default_url=/lab/tree $(LAB_ARGS)

test: notebooks
	$(PY) -m pytest -q -p no:cacheprovider tests $(NB_BUILD) --nbval-lax

test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests -m "(not slow and not slurm and not browser) or smoke"

clean-outputs:
	rm -rf $(OUT)/*
	touch $(OUT)/.gitkeep

# KAN layer benchmark (benchmarks/kan_layer.py): installs the published peers beside the pinned
# torch (--no-deps, so torch is not replaced), then measures; BENCH_ARGS=--quick for a smoke run.
bench: $(STAMP)
	$(PY) -m pip install -q --no-deps pykan==0.2.8 flashkan==0.2.0 inkan==0.5.2
	$(PY) -m pip install -q scikit-learn matplotlib pyyaml  # what pykan imports (torch untouched)
	$(PY) -m benchmarks.kan_layer $(BENCH_ARGS)

# Accuracy against pykan (benchmarks/pykan_accuracy.py): pykan 0.2.8's recipe and kanlib's on the same data, 3 seeds,
# 1 and 2 processes; installs pykan with --no-deps beside the pinned torch; BENCH_ARGS=--quick for a smoke run.
.PHONY: bench-pykan
bench-pykan: $(STAMP)
	$(PY) -m pip install -q --no-deps pykan==0.2.8
	$(PY) -m pip install -q scikit-learn matplotlib pyyaml  # what pykan imports (torch untouched)
	$(PY) -m benchmarks.pykan_accuracy $(BENCH_ARGS)
