# Quick start: `make serve` (the embedded tiny model on this machine) and `make test` (the CPU test tier).
VENV ?= .venv
PY := $(VENV)/bin/python
export RAY_USAGE_STATS_ENABLED ?= 0

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.13.0          # the CPU wheel; an unpinned torch pulls a CUDA build
	$(VENV)/bin/pip install -q -e ".[test,serve]"
	touch $@

install: $(VENV)/.installed

serve: $(VENV)/.installed
	$(VENV)/bin/glmserve serve $(ARGS)          # e.g. make serve ARGS="--port 8001"

generate: $(VENV)/.installed
	$(VENV)/bin/glmserve generate "The old man said" --max-tokens 48

test: export RAY_AUTH_MODE ?= disabled   # the tests' Ray clusters (a served one keeps Ray's token auth)
test: $(VENV)/.installed
	$(PY) -m pytest -q

.PHONY: install serve generate test
