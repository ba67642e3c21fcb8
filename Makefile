# The two commands of the README. Each creates .venv from pyproject.toml when it is missing.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ladder demo --out demo_out

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

test-slow: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) demo_out
