# varpack developer entry points. Every target bootstraps .venv on its own (see `install`).
PY ?= python3
VENV := .venv
BIN := $(abspath $(VENV)/bin)
STAMP := $(VENV)/.installed
export PATH := $(BIN):$(PATH)
# Quiet rich progress bars and keep MPICH from pinning every rank to the same core.
export PYTHONUNBUFFERED := 1
# Some machines set it; then each of the suite's hundreds of processes (MPI ranks, trainers, CLIs)
# would compile varpack's modules, and torch's, from source again.
unexport PYTHONDONTWRITEBYTECODE
DEMO := demo-out

.PHONY: install test demo demo-vlm bench lint format clean clean-numba

install: $(STAMP)

# torch==2.13.0 first: it is a local CPU wheel here; any other torch spec pulls gigabytes of CUDA.
# The rest through uv (its parallel resolver took 8 s where pip took 45 s here), pip if uv fails.
# No bytecode at install: compiling every installed module took 66 s of one core; processes write
# the .pyc of what they import instead (PYTHONDONTWRITEBYTECODE is lifted for every target below).
PIP := $(BIN)/python -m pip install -q --disable-pip-version-check --no-compile
EXTRAS := .[mpi,torch,plot,dev]
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) uv && $(BIN)/uv pip install -q --python $(BIN)/python -e '$(EXTRAS)' \
		|| $(PIP) -e '$(EXTRAS)'
	touch $(STAMP)

# One worker per core; --dist loadfile hands each worker whole modules, heaviest first (the order
# tests/conftest.py gives them), so the run does not end on one worker with a long test.
TEST_WORKERS ?= auto
test: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

demo: install
	bash jobs/demo.sh $(DEMO)

demo-vlm: install
	bash jobs/demo_vlm.sh

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

# numba's on-disk kernel caches (the planner's are keyed to varpack's version and sources, so an
# edit compiles them again by itself: this only frees the space)
clean-numba:
	find varpack -name '*.nbi' -delete -o -name '*.nbc' -delete
