# The two commands of the README. Each creates .venv from pyproject.toml when it is missing and
# installs what it needs: `make demo` the trainer extra, `make test` the dev extra (trainer, W&B,
# pytest, ruff). `.ci/run` runs `make test`.
PYTHON ?= python3
VENV := .venv
DEMO_STAMP := $(VENV)/.installed-train
TEST_STAMP := $(VENV)/.installed-dev

.PHONY: demo test test-heavy test-slow bench lint clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip

$(DEMO_STAMP): pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/python -m pip install -q -e '.[train]'
	touch $(DEMO_STAMP)

$(TEST_STAMP): pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/python -m pip install -q -e '.[dev]'
	touch $(TEST_STAMP) $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(VENV)/bin/ladder demo --out demo_out

test: $(TEST_STAMP)
	$(VENV)/bin/python -m pytest -q

test-heavy: $(TEST_STAMP)
	$(VENV)/bin/python -m pytest -q -m heavy

test-slow: $(TEST_STAMP)
	$(VENV)/bin/python -m pytest -q -m slow

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) demo_out
