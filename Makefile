# make demo · make test · make lint · make bench
# Everything runs from .venv, created on first use.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench soak services engines venv native clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

# policies/ compiled with mypyc (scripts/build_policies.py; docs/architecture.md): a no-op when up to
# date; the sources are used wherever the build is missing or older than them.
native: $(STAMP)
	$(PY) scripts/build_policies.py

demo: native
	$(VENV)/bin/gateway demo

# Installs the servers the tests need (redis-server, prometheus) when missing, and the real engines
# (vLLM, SGLang: one cached environment each in .engines/), then runs the suite: tests/real_engines/
# and the rest side by side (scripts/test.sh; PYTEST_ARGS go to both).
test: native services engines
	VENV=$(VENV) GATEWAY_POLICIES=native scripts/test.sh $(PYTEST_ARGS)

services:
	scripts/ensure-services.sh

# Real vLLM and SGLang for tests/real_engines/ (docs/engines.md); a no-op when the recipes are unchanged.
engines:
	python3 scripts/ensure_engines.py

# ruff, mypy (strict), and scripts/lint_docs.py: no development-process words in the tree, no page of
# the manual over its budget (CONTRIBUTING.md)
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) scripts/lint_docs.py

bench: native services
	$(PY) -m bench $(BENCH_ARGS)

# Bounded soak (not in CI): 10 minutes, 500 concurrent streams, churn and faults; figures in bench/soak/.
# Shorter: make soak SOAK_ARGS="--minutes 3"
soak: native
	$(PY) scripts/soak.py $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache policies/_native
