# Every target installs what it needs first, so each works as the first command on a fresh clone.
PYTHON_BOOT ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
CONSTRAINTS ?= constraints.txt
STAMP       := $(VENV)/.installed
ARGS        ?=

.PHONY: setup test parity gap bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[test]'
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q $(ARGS)

parity: setup
	$(PY) -m parity check --out reports/parity $(ARGS)

gap: setup
	$(PY) -m gap --out reports/gap $(ARGS)

bench: setup
	$(PY) -m bench --out reports/bench $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
