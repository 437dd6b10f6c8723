# `make demo` and `make test` set up .venv on first use (torch's CPU build first), then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,demo]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m lance_prefetch demo

test: $(STAMP)
	$(PY) -m pytest

clean:
	rm -rf $(VENV) demo-data .pytest_cache *.egg-info
