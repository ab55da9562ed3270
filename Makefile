# make demo · make check · make test · make lint · make bench
# Everything runs from .venv, created on first use. `make demo` installs what the gateway needs to run
# (the package, and mypy to compile policies/); `make check`, `make test`, `make lint`, `make bench` and
# `make soak` also install the `dev` extra (test, lint, benchmark and client libraries). pip's output
# goes to .venv/install.log, shown only when an install fails (scripts/quiet.sh).
VENV    ?= .venv
PY      := $(VENV)/bin/python
LOG     := $(VENV)/install.log
QUIET   := scripts/quiet.sh $(LOG)
RUNTIME := $(VENV)/.installed-runtime
NATIVE  := $(VENV)/.installed-native-tools
DEV     := $(VENV)/.installed-dev

.PHONY: demo check test lint bench soak services engines venv native clean

venv: $(DEV)

$(PY):
	@python3 -m venv $(VENV)

$(RUNTIME): pyproject.toml | $(PY)
	@echo "make: installing the gateway and its runtime dependencies into $(VENV) (log: $(LOG))"
	@$(QUIET) $(VENV)/bin/pip install -q --upgrade pip
	@$(QUIET) $(VENV)/bin/pip install -q -e .
	@touch $@

# what scripts/build_policies.py compiles with (the Dockerfile's builder installs the same)
$(NATIVE): $(RUNTIME)
	@$(QUIET) $(VENV)/bin/pip install -q 'mypy>=1.10' 'setuptools>=68'
	@touch $@

$(DEV): $(RUNTIME)
	@echo "make: installing the development tools into $(VENV) (log: $(LOG))"
	@$(QUIET) $(VENV)/bin/pip install -q -e '.[dev]'
	@touch $@

# policies/ compiled with mypyc (scripts/build_policies.py; docs/architecture.md): a no-op when up to
# date; the sources are used wherever the build is missing or older than them.
native: $(NATIVE)
	@$(PY) scripts/build_policies.py

demo: native
	@$(VENV)/bin/gateway demo

# The unit and in-process tests: no subprocess, no real engine, no browser (tests/conftest.py fails a
# test outside `make test` that starts a process). What to run on every change: under a minute.
check: $(DEV)
	$(VENV)/bin/pytest -m "not processes" -n 2 $(PYTEST_ARGS)

# Everything: installs the servers the tests need (redis-server, prometheus, Chromium's driver) when
# missing, and the real engines (vLLM, SGLang: one cached environment each in .engines/), then runs the
# suite on pytest-xdist workers. Most tests wait on other processes (gateways, simulators, the engines),
# so there are more workers than cores; tests that share a server stay on one worker (tests/conftest.py).
# The suite starts hundreds of Python processes: with PYTHONDONTWRITEBYTECODE set, each would compile
# this project's modules again, so their bytecode goes to the git-ignored __pycache__/ directories.
TEST_WORKERS ?= 3
test: $(DEV) native services engines
	env -u PYTHONDONTWRITEBYTECODE GATEWAY_POLICIES=native \
		$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

services:
	scripts/ensure-services.sh

# Real vLLM and SGLang for tests/real_engines/ (docs/engines.md); a no-op when the recipes are unchanged.
engines:
	python3 scripts/ensure_engines.py

# ruff, mypy (strict), and scripts/lint_docs.py: no development-process words in the tree, no page of
# the manual over its budget (CONTRIBUTING.md)
lint: $(DEV)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) scripts/lint_docs.py

bench: $(DEV) native services
	$(PY) -m bench $(BENCH_ARGS)

# Bounded soak (not in CI): 10 minutes, 500 concurrent streams, churn and faults; figures in bench/soak/.
# Shorter: make soak SOAK_ARGS="--minutes 3"
soak: $(DEV) native
	$(PY) scripts/soak.py $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache policies/_native
