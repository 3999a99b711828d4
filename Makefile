# make setup  - install everything (idempotent)
# make lab    - setup, then JupyterLab on labs/00_start_here.ipynb (settings: jupyter/lab-settings)
# make test        - setup, then the test suite CI runs (budget: 35 min on a 2-core machine; docs/testing.md)
# make test-heavy  - what does not fit that budget: the container images, Binder, the second browser state, ...
# make test-fast   - no training, no jobs, no browser (budget: 90 s)
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8888

.PHONY: setup lab test test-heavy test-fast lint gen bench clean probe-fixtures

setup:
	@bash scripts/setup.sh

ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: setup
	cd labs && ../$(VENV)/bin/jupyter lab --port=$(PORT) --ip=$${LAB_IP:-127.0.0.1} $(ROOT_FLAG) \
		"--LabApp.app_settings_dir=$(CURDIR)/jupyter/lab-settings" $${LAB_ARGS:-} 00_start_here.ipynb

# Each tier writes its per-test times to test-artifacts/<tier>.xml (python -m helpers.durations FILE groups them).
PYTEST_REPORT = -v --durations=30 --durations-min=1

test:
	@LABKIT_TEST_TOOLS=1 bash scripts/setup.sh
	$(PY) -m ruff check labkit tests labs solutions
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -m "not heavy" $(PYTEST_REPORT) --budget 2100 --junitxml=test-artifacts/test.xml

test-heavy:
	@LABKIT_TEST_TOOLS=1 bash scripts/setup.sh
	$(PY) -m pytest -m heavy $(PYTEST_REPORT) --junitxml=test-artifacts/test-heavy.xml

test-fast:
	@LABKIT_TEST_TOOLS=1 bash scripts/setup.sh
	$(PY) -m pytest -m "not slow and not heavy" -q --budget 90

# ruff, then the layers' import contract (.importlinter; docs/architecture.md)
lint:
	$(PY) -m ruff check labkit tests labs solutions
	$(VENV)/bin/lint-imports

# Record the checks' probe runs the judges are tested on (tests/fixtures/probes), about 16 minutes.
probe-fixtures:
	cd tests && ../$(PY) -m helpers.probe_cases

gen:
	$(PY) -m labkit.cli gen

clean:
	rm -rf labs/logs labs/runs .pytest_cache
