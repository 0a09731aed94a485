# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
# CPU build locally; on a machine with CUDA the same pin resolves to the CUDA build.
TORCH_PIN := torch==2.13.0

export RAY_AUTH_MODE ?= disabled
export PYTHONUNBUFFERED := 1

.PHONY: venv demo test test-slow test-cluster test-postgres postgres-server test-browser browser bench-dashboard lint docs bench bench-postgres audit clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_PIN)
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/raydp-hpo demo

# The fast tier (target: <= 8 min on 2 idle cores, issue #43): every unit and property test and one small
# end-to-end search per path; pyproject's addopts leave out the slow, cluster and postgres tests.
test: $(STAMP)
	$(PY) -m pytest -q --durations=10
	$(PY) -m pytest -q -p no:cacheprovider --doctest-modules raydp_hpo

# The slow tier: the full privacy audits and the audits' power checks, the examples' --smoke
# runs, the docs' long blocks and the long searches. Disjoint from test-cluster and
# test-postgres (each test runs in exactly one of the four targets); CI runs all four.
test-slow: $(STAMP)
	$(PY) -m pytest -q -m "slow and not cluster and not postgres"

# Real clusters: `ray start --head` + `ray job submit`, simulated multi-node, failures.
test-cluster: $(STAMP)
	$(PY) -m pytest -q -m "cluster and not postgres"

# PostgreSQL ledgers against a real throw-away server (initdb + pg_ctl under a temp dir, run as
# the `postgres` system user when we are root). Installs Debian's postgresql package if missing.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
postgres-server:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || \
		{ $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y postgresql; }

test-postgres: $(STAMP) postgres-server
	$(PY) -m pytest -q -m postgres

# The dashboard in a real browser: Debian's chromium driven by Selenium through chromedriver
# (installed here if missing), against a demo run's storage and a throw-away PostgreSQL server;
# the screenshots go to docs/how-to/img (the how-to page shows them).
browser:
	@{ [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; } || \
		{ $(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y chromium chromium-driver; }

test-browser: $(STAMP) browser postgres-server
	RAYDP_HPO_SCREENSHOTS=docs/how-to/img $(PY) -m pytest -q -m browser

bench-dashboard: $(STAMP)
	$(PY) benchmarks/dashboard.py

bench-postgres: $(STAMP) postgres-server
	$(PY) benchmarks/ledger_postgres.py

# Style, types (tests/typecheck/ holds the public-API and LedgerLike checks) and the import
# contracts of pyproject.toml. CI runs it after `make test`.
lint: $(STAMP)
	$(VENV)/bin/ruff check raydp_hpo search_algs trainables cluster tests benchmarks examples
	$(VENV)/bin/mypy raydp_hpo tests/typecheck
	$(VENV)/bin/lint-imports

# The documentation site (mkdocs.yml, docs/), warnings as errors, into site/ (git-ignored).
# CI runs it; tests/test_docs.py runs every code block of the pages.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(PY) benchmarks/ledger.py

# Empirical privacy audit of every search algorithm on neighbouring datasets (lower bound vs
# claimed ε, plus property checks); writes benchmarks/results/privacy_audit/privacy_audit.md.
audit: $(STAMP)
	$(PY) benchmarks/privacy_audit.py

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache .mypy_cache .ruff_cache
