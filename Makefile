# `make demo` and `make test` set up .venv on first use (torch's CPU build first, then the
# library, then the bench, benchmarks/, a distribution of its own, and the peer loaders it
# compares last), then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test test-system lint package docs bench install clean nginx

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml benchmarks/pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,demo,frameworks,docs]'
	$(PY) -m pip install --quiet --disable-pip-version-check -e benchmarks
	$(PY) -m pip install --quiet --disable-pip-version-check -e 'benchmarks[peers]'
	touch $(STAMP)

# `lance-prefetch-bench --local-s3` (and its test) serves object reads with nginx: install
# Debian's nginx-light when no nginx is there (nothing is done when one is).
nginx:
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || { \
		echo "installing nginx-light (for lance-prefetch-bench --local-s3)"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nginx-light >/dev/null; }

install: $(STAMP) nginx

demo: $(STAMP)
	$(PY) -m lance_prefetch demo

# `make test`: every test but the `system` ones (a few minutes); `make test-system`: those
# (process-level scenarios, a few minutes more). CI (.ci/run) runs both.
test: $(STAMP) nginx
	$(PY) -m pytest -m "not system"

test-system: $(STAMP) nginx
	$(PY) -m pytest -m system

# The layout, the formatting and the types: ruff's formatter and linter, mypy on the library
# ([tool.mypy] in pyproject.toml: strict on the public modules) and the layers of the package
# (import-linter's contracts in pyproject.toml). CI runs it.
lint: $(STAMP)
	$(VENV)/bin/ruff format --check lance_prefetch tests benchmarks examples docs/_ext
	$(VENV)/bin/ruff check lance_prefetch tests benchmarks examples docs/_ext
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The wheel and sdist of the library (dist/), built offline with the installed setuptools; then
# .ci/check_wheel.py checks both (py.typed, LICENSE, no bench) and installs the wheel into a fresh
# venv, where it imports and reads a dataset. CI runs it.
package: $(STAMP)
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist .
	$(PY) .ci/check_wheel.py dist

# The documentation site (mkdocs.yml: docs/ and the API reference from the docstrings) into
# site/; strict: a broken link or an unresolved reference fails it. CI runs it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The benchmark (benchmarks/, installed by $(STAMP)) on an emulated S3 (nginx + rclone on
# 127.0.0.1; installs nginx-light if missing).
bench: $(STAMP) nginx
	$(VENV)/bin/lance-prefetch-bench --local-s3

clean:
	rm -rf $(VENV) demo-data site .pytest_cache *.egg-info benchmarks/*.egg-info dist build
