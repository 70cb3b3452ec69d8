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

.PHONY: run test install lint faults docs i18n

run: $(STAMP)
	$(BIN)/b2bhub run

# The suite in two processes (pytest-xdist): most of its time waits on the real workers,
# beats and web servers its tests start, so two keep two cores busy where one left half
# of them idle. TEST_PROCESSES=0 runs it in this one process.
# The bytecode of our own modules is written first: the tests start hundreds of worker,
# beat, web and CLI processes, and where PYTHONDONTWRITEBYTECODE is set (as on CI) each
# of them compiled about 200 modules from source again (0.3-0.7 s of CPU a start).
TEST_PROCESSES ?= 2
test: $(STAMP)
	$(BIN)/python -m compileall -q b2bhub plugins tests wsgi.py celeryconfig.py >/dev/null
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

# The UI's catalogs (docs/i18n.md): extract every marked text of the pages, the UI's code,
# the notifications and our plugins into messages.pot, merge it into each language's
# messages.po (new texts untranslated, gone ones marked obsolete) and compile the .mo
# files the hub reads. Translate what is new in each .po, then run it again.
I18N_DIR := b2bhub/translations
I18N_KEYWORDS := -k _l -k lazy_gettext -k N_
i18n: $(STAMP)
	$(BIN)/pybabel extract --no-location --sort-output -F babel.cfg --project=b2bhub \
		--copyright-holder="the b2bhub authors" --msgid-bugs-address="" \
		$(I18N_KEYWORDS) -o $(I18N_DIR)/messages.pot .
	$(BIN)/pybabel update --no-fuzzy-matching -i $(I18N_DIR)/messages.pot \
		-d $(I18N_DIR)
	$(BIN)/pybabel compile -d $(I18N_DIR)

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
