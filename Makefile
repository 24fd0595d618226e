# One entry point per job. Each target builds .venv (if pyproject.toml changed) first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
SCALE  ?= 100000
FUZZ_RUNS ?= 3

export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1
export PREFECT_LOGGING_LEVEL ?= WARNING
# Python may cache the bytecode it compiles (in .venv and __pycache__/): with PYTHONDONTWRITEBYTECODE
# set (it is, on these machines), every process the tests start (CLI runs, killed applies, the Prefect
# server, notebooks) compiled prefect, pandas and polars from source again — 3-5 s each.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: setup demo test fuzz bench notebooks clean

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
	  tests/transforms/test_properties_episodes.py tests/core/test_embedding.py tests/core/test_lookup.py tests/core/test_diff.py tests/transforms/test_cooccurrence.py tests/validation/test_quarantine_paths.py tests/validation/test_diff_checks_paths.py \
	  tests/run/test_isolation.py tests/core/test_canonical.py || exit 1; done

bench: setup          ## make bench SCALE=1000000 ; writes bench-results.json
	$(PY) -m benchmarks.run --scale $(SCALE)

NOTEBOOK_HTML ?= .deep_sleep/notebooks/html
NOTEBOOK_ARGS ?=
notebooks: setup      ## export both marimo notebooks to HTML under $(NOTEBOOK_HTML) (on the demo store; NOTEBOOK_ARGS="--tenant acme")
	mkdir -p $(NOTEBOOK_HTML)
	for nb in phase_effects replay_lab; do \
	  $(VENV)/bin/marimo export html -f notebooks/$$nb.py -o $(NOTEBOOK_HTML)/$$nb.html -- $(NOTEBOOK_ARGS) || exit 1; done
	$(PY) notebooks/offline.py $(NOTEBOOK_HTML)

clean:
	rm -rf $(VENV) .deep_sleep build *.egg-info
