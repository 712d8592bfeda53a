# Two entry points, each doing all set-up on a fresh machine (a venv in .venv):
#   make serve   run the server on examples/model_repository
#   make test    check the installed package, then run the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

serve: $(VENV)/.installed
	$(VENV)/bin/triton-shm --model-repository examples/model_repository

# First the static checks (ruff, mypy: pyproject.toml configures both), then the user's
# path (sdist and wheel built, installed into clean venvs, the console script serving from
# outside the checkout), then the whole suite twice: with the C extensions, then with their
# pure-Python twins.
test: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) tests/check_install.py
	$(PY) -m pytest tests
	TRITON_SHM_NO_EXTENSIONS=1 $(PY) -m pytest tests

bench: $(VENV)/.installed
	$(PY) bench/run_all.py

.PHONY: install serve test bench
