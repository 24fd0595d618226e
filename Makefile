# One entry point per job. Each target builds .venv (if pyproject.toml changed) first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
SCALE  ?= 100000

export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1
export PREFECT_LOGGING_LEVEL ?= WARNING

.PHONY: setup demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check uv
	$(VENV)/bin/uv pip install -q -p $(PY) -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

demo: setup           ## seed a small realistic store on the embedded Postgres and consolidate every scope
	$(VENV)/bin/deep-sleep demo

test: setup           ## the whole suite, on the embedded Postgres (or $$DEEP_SLEEP_DSN)
	$(PY) -m pytest -q

bench: setup          ## make bench SCALE=1000000 ; writes bench-results.json
	$(PY) -m benchmarks.run --scale $(SCALE)

clean:
	rm -rf $(VENV) .deep_sleep build *.egg-info
