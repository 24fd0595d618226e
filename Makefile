# One entry point per job. Each target builds .venv (if pyproject.toml changed) first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
SCALE  ?= 100000
FUZZ_RUNS ?= 3

export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1
export PREFECT_LOGGING_LEVEL ?= WARNING

.PHONY: setup demo test fuzz bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check uv
	$(VENV)/bin/uv pip install -q -p $(PY) -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

demo: setup           ## seed a small realistic store on the embedded Postgres and consolidate every scope
	$(VENV)/bin/deep-sleep demo --reset

test: setup           ## the whole suite, on the embedded Postgres (or $$DEEP_SLEEP_DSN)
	$(PY) -m pytest -q

fuzz: setup           ## the property tests with fresh random examples (make test's are fixed), $(FUZZ_RUNS) times
	for i in $$(seq $(FUZZ_RUNS)); do HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q -p no:cacheprovider \
	  tests/transforms/test_properties_nodes.py tests/transforms/test_properties_graph.py \
	  tests/transforms/test_properties_episodes.py tests/core/test_embedding.py tests/core/test_fastpaths.py \
	  tests/run/test_isolation.py tests/core/test_canonical.py || exit 1; done

bench: setup          ## make bench SCALE=1000000 ; writes bench-results.json
	$(PY) -m benchmarks.run --scale $(SCALE)

clean:
	rm -rf $(VENV) .deep_sleep build *.egg-info
