# make setup  - install everything (idempotent)
# make lab    - setup, then JupyterLab on labs/00_start_here.ipynb (settings: jupyter/lab-settings)
# make test   - setup, then the whole test suite
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8888

.PHONY: setup lab test test-fast lint gen bench clean probe-fixtures

setup:
	@bash scripts/setup.sh

ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: setup
	cd labs && ../$(VENV)/bin/jupyter lab --port=$(PORT) --ip=$${LAB_IP:-127.0.0.1} $(ROOT_FLAG) \
		"--LabApp.app_settings_dir=$(CURDIR)/jupyter/lab-settings" $${LAB_ARGS:-} 00_start_here.ipynb

test:
	@LABKIT_TEST_TOOLS=1 bash scripts/setup.sh
	$(PY) -m ruff check labkit tests labs solutions
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -v --durations=40

test-fast:
	@LABKIT_TEST_TOOLS=1 bash scripts/setup.sh
	$(PY) -m pytest -m "not slow" -q

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
