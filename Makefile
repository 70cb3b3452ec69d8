# The two commands of the README. Both create .venv when it is missing and install what
# they need (again only when setup.cfg or pyproject.toml changed). packaging/oscrypto
# stands in for pyas2lib's pinned oscrypto (README "AS2 and oscrypto"). The tests' third-
# party protocol plugin (tests/plugin_pkgs/b2bhub_echo) is installed as a user would.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.install-stamp
# The extras installed with b2bhub: the test suite's tools by default. The container image
# (Dockerfile) installs with EXTRAS= : the hub alone, without the tests' plugin either.
EXTRAS ?= test

.PHONY: run test install lint faults docs

run: $(STAMP)
	$(BIN)/b2bhub run

# The suite in two processes (pytest-xdist): most of its time waits on the real workers,
# beats and web servers its tests start, so two keep two cores busy where one left half
# of them idle. TEST_PROCESSES=0 runs it in this one process.
TEST_PROCESSES ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_PROCESSES) $(PYTEST_ARGS)

install: $(STAMP)

# The fault-injection suite (bench/faults.py; README "Reliability"): real processes,
# kill -9, outages, on both backends; its PostgreSQL and Redis are servers it starts
# itself. FAULTS_ARGS=--short is the CI form.
faults: $(STAMP)
	$(BIN)/python bench/faults.py $(FAULTS_ARGS)

# The documentation site (docs/, mkdocs.yml) into site/; --strict fails on a broken link.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

lint: $(STAMP)
	$(BIN)/ruff check b2bhub plugins tests bench

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "b2bhub needs Python 3.11 or newer ($(PYTHON) is older)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP): setup.cfg pyproject.toml packaging/oscrypto/pyproject.toml \
		tests/plugin_pkgs/b2bhub_echo/pyproject.toml \
		$(wildcard tests/plugin_pkgs/b2bhub_echo/b2bhub_echo/*.py) | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet ./packaging/oscrypto -e '.$(if $(EXTRAS),[$(EXTRAS)])'
	$(if $(EXTRAS),$(BIN)/python -m pip install --quiet --no-deps ./tests/plugin_pkgs/b2bhub_echo)
	@touch $(STAMP)
