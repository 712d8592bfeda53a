# Two entry points, each doing all set-up on a fresh machine (a venv in .venv):
#   make serve   run the server on examples/model_repository
#   make test    check the installed package, run the whole test suite, then its core on protobuf 7
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

# PyTorch's CPU wheel, for the PyTorch backend's tests. Pinned: a plain `torch` pulls a
# multi-GB CUDA build. `make test TORCH_VERSION=` leaves it out (those tests then skip).
TORCH_VERSION ?= 2.13.0

# A second venv on protobuf 7: the pins allow 6.31.1+ and 7.x (pyproject.toml says why).
PB7_VENV ?= .venv-pb7
PB7_PY := $(PB7_VENV)/bin/python
PROTOBUF7_VERSION ?= 7.36.2
# The suite's core, run again there (about 100 s on 2 cores): config parsing and auto-complete,
# model loading, ensembles, both gRPC servers, HTTP, the wire codecs checked against protobuf,
# statistics, model control, the command line.
PB7_TESTS ?= tests/test_model_config.py tests/test_models.py tests/test_pipelines.py tests/test_grpc.py \
	tests/test_grpc_native.py tests/test_grpc_infer_wire.py tests/test_http.py tests/test_wire_codecs.py \
	tests/test_validation.py tests/test_metrics.py tests/test_model_control.py tests/test_cli.py

# The files that concern the transports, run again over the fallbacks (aiohttp alone, grpc.aio).
FALLBACK_TESTS ?= tests/test_http.py tests/test_http_lean.py tests/test_grpc.py tests/test_hostile.py

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

$(VENV)/.torch: $(VENV)/.installed
	$(PY) -m pip install -q 'torch==$(TORCH_VERSION)'
	touch $@

# $(VENV)'s packages at the same versions, except protobuf 7 (and no torch). It imports the
# checkout through a .pth file, so it runs the stubs (protobuf-6 gencode) and extensions that
# $(VENV)'s editable install built, as a protobuf-7 machine runs a wheel built on protobuf 6.
# tritonclient[grpc] 2.73 requires protobuf<7: it goes in with --no-deps (its dependencies
# are in the frozen list).
$(PB7_VENV)/.installed: $(VENV)/.installed
	rm -rf $(PB7_VENV)
	$(PYTHON) -m venv $(PB7_VENV)
	$(PB7_PY) -m pip install -q -U pip
	$(PY) -m pip freeze --exclude-editable | grep -viE '^(protobuf|tritonclient|torch|triton-shm)(==| @)' \
		> $(PB7_VENV)/requirements.txt
	$(PB7_PY) -m pip install -q -r $(PB7_VENV)/requirements.txt 'protobuf==$(PROTOBUF7_VERSION)'
	$(PB7_PY) -m pip install -q --no-deps "$$($(PY) -m pip freeze | grep -iE '^tritonclient==')"
	echo '$(CURDIR)' > "$$($(PB7_PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/triton-shm.pth"
	touch $@

install: $(VENV)/.installed

serve: $(VENV)/.installed
	$(VENV)/bin/triton-shm --model-repository examples/model_repository

# First the static checks (ruff, mypy: pyproject.toml configures both; no import cycle in
# the package that is not type-only: tools/check_import_cycles.py), then the user's
# path (sdist and wheel built, installed into clean venvs, the console script serving from
# outside the checkout), then the whole suite twice: with the C extensions, then the same
# server with their pure-Python twins; the transport tests over the fallback transports;
# last the suite's core on protobuf 7.
test: $(VENV)/.installed $(if $(TORCH_VERSION),$(VENV)/.torch)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) tools/check_import_cycles.py
	$(PY) tests/check_install.py
	$(PY) -m pytest tests
	TRITON_SHM_NO_EXTENSIONS=1 $(PY) -m pytest tests
	TRITON_SHM_FALLBACK_TRANSPORTS=1 $(PY) -m pytest $(FALLBACK_TESTS)
	$(MAKE) test-pb7

# The suite's core on protobuf 7: the last step of `make test`, and a target of its own.
test-pb7: $(PB7_VENV)/.installed
	$(PB7_PY) -c 'import google.protobuf as p; assert p.__version__ == "$(PROTOBUF7_VERSION)", p.__version__'
	$(PB7_PY) -m pytest $(PB7_TESTS)

bench: $(VENV)/.installed
	$(PY) bench/run_all.py

# The real Model Analyzer (its own venv: it pins many packages) profiling triton-shm in remote
# mode on a small model: it must run through and write its reports (docs/tune.md). Not part of
# `make test` (about 2 minutes on 2 cores); tests/test_model_analyzer.py runs a shorter profile
# when TRITON_SHM_MODEL_ANALYZER names the executable.
MA_VENV ?= .venv-ma
MODEL_ANALYZER_VERSION ?= 1.58.0

$(MA_VENV)/.installed:
	$(PYTHON) -m venv $(MA_VENV)
	$(MA_VENV)/bin/python -m pip install -q 'triton-model-analyzer==$(MODEL_ANALYZER_VERSION)'
	touch $@

model-analyzer: $(VENV)/.installed $(MA_VENV)/.installed
	$(PY) tools/model_analyzer.py --model-analyzer $(MA_VENV)/bin/model-analyzer

.PHONY: install serve test test-pb7 bench model-analyzer
