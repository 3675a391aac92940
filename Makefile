# varpack developer entry points. Every target bootstraps .venv on its own (see `install`).
PY ?= python3
VENV := .venv
BIN := $(abspath $(VENV)/bin)
STAMP := $(VENV)/.installed
export PATH := $(BIN):$(PATH)
# Quiet rich progress bars and keep MPICH from pinning every rank to the same core.
export PYTHONUNBUFFERED := 1
DEMO := demo-out

.PHONY: install test demo bench lint format clean clean-numba

install: $(STAMP)

# torch==2.13.0 first: it is a local CPU wheel here; any other torch spec pulls gigabytes of CUDA.
PIP := $(BIN)/python -m pip install -q --disable-pip-version-check
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e '.[mpi,torch,plot,dev]'
	touch $(STAMP)

# One worker per core; --dist loadfile hands each worker whole modules, heaviest first (the order
# tests/conftest.py gives them), so the run does not end on one worker with a long test.
TEST_WORKERS ?= auto
# The suite starts hundreds of processes (MPI ranks, trainers, CLIs): with PYTHONDONTWRITEBYTECODE
# set (as on some machines) each one compiles varpack's modules from source again, 0.3-0.8 s of CPU.
test: install
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

demo: install
	bash jobs/demo.sh $(DEMO)

bench: install
	bash tests/benchmarks/run_all.sh

lint: install
	$(BIN)/ruff check varpack tests jobs
	$(BIN)/ruff format --check varpack tests jobs
	$(BIN)/mypy

format: install
	$(BIN)/ruff format varpack tests jobs
	$(BIN)/ruff check --fix varpack tests jobs

clean: clean-numba
	rm -rf $(VENV) $(DEMO) bench-out .pytest_cache .mypy_cache .ruff_cache .hypothesis

# numba's on-disk kernel caches (stale after editing a kernel another module's kernel calls)
clean-numba:
	find varpack -name '*.nbi' -delete -o -name '*.nbc' -delete
