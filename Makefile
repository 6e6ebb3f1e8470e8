# Every target installs what it needs first, so each works as the first command on a fresh clone.
# Runs write under $(RUNS)/ (default runs/, which git ignores), so a user's run never dirties the tree; the
# committed reports live in reports/ and are refreshed with RUNS=reports (e.g. `make parity RUNS=reports`).
PYTHON_BOOT ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
CONSTRAINTS ?= constraints.txt
STAMP       := $(VENV)/.installed
RUNS        ?= runs
VECTORS     ?= $(RUNS)/vectors
ARGS        ?=

PORTS_STAMP := $(VENV)/.ports-installed
# eggroll-trainer 0.1.0 declares Requires-Python >= 3.12 while its code needs only torch: below 3.12 it is
# installed alone (no dependencies, the Python requirement waived), at the pin of pyproject.toml's `ports` extra.
PORTS_ALONE := eggroll-trainer==0.1.0

.PHONY: help setup c-side c-rng test parity gpu gpu-check vectors int8 gap gap-paper gap-lm gap-int8 bench bench-gpu ports ports-install clean

help:  ## this list
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "  options: ARGS=\"...\" (passed to the command), RUNS=dir (output root, default runs), CONSTRAINTS=file"
	@echo "           TEST_WORKERS=n (make test's pytest-xdist workers, default auto: one per core; 0: one process)"
	@echo "           VECTORS=dir (make vectors' output, default \$$(RUNS)/vectors; VECTORS=vectors refreshes the committed bundles)"

setup: $(STAMP) c-side c-rng  ## create .venv, install the project (pins from constraints.txt), build the C sides

# The integer EGGROLL's C side (c_int8/egg_int8.c -> build/c_int8/) with the system C compiler (cc, C99, -O2
# -fwrapv). Optional: with no compiler it says so and the tests that need it skip; a compiler error is printed
# (exit 2, ignored here), so neither ever fails setup or `make test`.
c-side: $(STAMP)  ## build the int8 C side (c_int8) with the system C compiler, or say why not
	-@$(PY) -m c_int8.build

# JAX's generator in C (c_rng/jax_normal.c -> build/c_rng/), which torch_impl.random's CPU normals use when built;
# optional as c-side: no compiler, and torch_impl.random keeps its torch paths (the same numbers, slower).
c-rng: $(STAMP)  ## build the C generator (c_rng: JAX's threefry and normal) with the system C compiler, or say why not
	-@$(PY) -m c_rng.build

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[all,test]'
	touch $(STAMP)

# On every core (pytest-xdist, one test file per worker at a time: the files' shared fixtures are built once);
# TEST_WORKERS=0 runs it in one process. tests/conftest.py splits the cores' threads between the workers and orders
# the files (a Ray test that mostly waits first, then by number of tests).
# Bytecode is written (into __pycache__/, which git ignores) even where PYTHONDONTWRITEBYTECODE is set: each worker
# and each of the ~80 subprocesses the tests start would otherwise compile the project's modules and pytest rewrite
# the test files again, about 1 s per process (collection 13.7 -> 6.9 s measured here on two cores).
TEST_WORKERS ?= auto

test: setup  ## the pytest suite (unit tests, the suite's self-tests, the Ray executor test) on every core
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

parity: setup  ## the parity suite on every task (CartPole MLP, byte-level LM, integer LM), on the CPU -> runs/parity*, runs/int8
	$(PY) -m parity check --out $(RUNS)/parity $(ARGS)
	$(PY) -m parity check --task lm --out $(RUNS)/parity-lm
	$(PY) -m parity check --task int8 --out $(RUNS)/int8

# On a machine with CUDA and jax[cuda], in one command within 9 minutes (bench/gpu_check.py; `python -m bench.gpu_check
# --dry-run` prints the plan and budgets): every test marked gpu, every suite with --device cuda against the JAX
# reference on the same GPU at default (TF32) and highest precision, then the bench's GPU section. Exit 2 before any
# work where torch sees no CUDA device; ARGS="--steps suites" reruns one stage. make exits 2 on any failure: the
# command's own code (0 passed, 1 a finding, 2 cannot run here) is its last line and in $(RUNS)/gpu/README.md.
gpu: setup  ## on a machine with CUDA: the CUDA tests, every suite on CUDA at both precisions, the bench's GPU section (9 min) -> runs/gpu, runs/bench-gpu
	$(PY) -m bench.gpu_check --runs $(RUNS) $(ARGS)

gpu-check: gpu  ## the same as make gpu (its former name for the suites on CUDA)

# The committed conformance vectors (vectors/) are refreshed with VECTORS=vectors.
vectors: setup  ## record the JAX reference's conformance vectors (check --against needs no JAX) -> runs/vectors/{cartpole,lm}-quick
	$(PY) -m parity record --task cartpole --size quick --out $(VECTORS)/cartpole-quick $(ARGS)
	$(PY) -m parity record --task lm --size quick --out $(VECTORS)/lm-quick $(ARGS)

int8: setup  ## integer EGGROLL three ways (JAX, torch, C), bit for bit -> runs/int8
	$(PY) -m parity check --task int8 --out $(RUNS)/int8 $(ARGS)

gap: setup  ## the CPU-sized gap study (resumes from the committed reports/gap) -> runs/gap
	$(PY) -m gap --out $(RUNS)/gap --from reports/gap $(ARGS)

gap-paper: setup  ## the published question at its own preset (resumes from reports/gap-paper) -> runs/gap-paper
	$(PY) -m gap --study paper --out $(RUNS)/gap-paper --from reports/gap-paper $(ARGS)

gap-lm: setup  ## the byte-level LM study: does the torch port learn as fast? (resumes from reports/gap-lm) -> runs/gap-lm
	$(PY) -m gap --task lm --out $(RUNS)/gap-lm $(if $(wildcard reports/gap-lm/runs.csv),--from reports/gap-lm) $(ARGS)

gap-int8: setup  ## the integer study: does egg.c learn the byte LM as fast as nano-egg? (resumes from reports/gap-int8) -> runs/gap-int8
	$(PY) -m gap --task int8 --out $(RUNS)/gap-int8 $(if $(wildcard reports/gap-int8/runs.csv),--from reports/gap-int8) $(ARGS)

bench: setup  ## throughput and time to solve, torch_impl against JAX -> runs/bench
	$(PY) -m bench --out $(RUNS)/bench $(ARGS)

bench-gpu: gpu  ## the same as make gpu (its former name for the GPU tests and the bench's GPU section)

ports: $(PORTS_STAMP)  ## the EGGROLL ports on PyPI (pinned extra) through the suite -> runs/ports
	$(PY) -m ports --out $(RUNS)/ports $(ARGS)

ports-install: $(PORTS_STAMP)  ## install the pinned ports extra only (then `make test` runs the adapter and survey tests too)

$(PORTS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[all,test,ports]'
	$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 12))' || \
		$(PY) -m pip install --quiet --no-deps --ignore-requires-python $(PORTS_ALONE)
	touch $(PORTS_STAMP)

clean:  ## remove .venv, caches and the C build (never runs/ or reports/)
	rm -rf $(VENV) .pytest_cache build/c_int8
