# make demo · make test · make lint · make bench
# Everything runs from .venv, created on first use.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench soak services engines venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gateway demo

# Installs the servers the tests need (redis-server, prometheus) when missing, and the real engines
# (vLLM, SGLang: one cached environment each in .engines/), then runs the suite: tests/real_engines/
# and the rest side by side (scripts/test.sh; PYTEST_ARGS go to both).
test: $(STAMP) services engines
	VENV=$(VENV) scripts/test.sh $(PYTEST_ARGS)

services:
	scripts/ensure-services.sh

# Real vLLM and SGLang for tests/real_engines/ (docs/engines.md); a no-op when the recipes are unchanged.
engines:
	python3 scripts/ensure_engines.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(STAMP) services
	$(PY) -m bench $(BENCH_ARGS)

# Bounded soak (not in CI): 10 minutes, 500 concurrent streams, churn and faults; figures in docs/soak/.
# Shorter: make soak SOAK_ARGS="--minutes 3"
soak: $(STAMP)
	$(PY) scripts/soak.py $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
