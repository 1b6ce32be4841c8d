# pg_mailbox: PGXS build of a SQL + PL/Python extension.
#
#   make                  build pg_mailbox--$(EXTVERSION).sql from sql/ (schema, functions, privileges)
#   make install          install it, migrations/ and the server-side Python package
#   make installcheck     pg_regress smoke test against a running server (PGHOST/PGPORT/PGUSER)
#   make test             bootstrap + build + install + lint + the whole pytest suite
#   make lint             ruff + sqlfluff only
#   make demo             bootstrap + build + install, then `pg-mailbox demo` (DEMO_ARGS=...)
#   make dist             the PGXN distribution pg_mailbox-$(EXTVERSION).zip (docs/install.md)
#   make migration        (re)build migrations/pg_mailbox--<previous>--$(EXTVERSION).sql
#   make check-migration  fail if that committed script is not what the sources build
#   make check-released   fail if a released file in migrations/ changed (also part of `make`)
#
# See docs/development.md.

EXTENSION = pg_mailbox
# The control file is the one version source; everything else reads or checks it.
EXTVERSION := $(shell sed -n "s/^[[:space:]]*default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" $(EXTENSION).control)

# Prefer PostgreSQL 15 when Debian has several versions installed: Debian's
# /usr/bin/pg_config wrapper would pick the newest one.
PG_CONFIG ?= $(firstword $(wildcard /usr/lib/postgresql/15/bin/pg_config) pg_config)

# sql/schema/*.sql: tables, types, sequences, indexes, config_dump, roles: run once, by the
# install script of a version; an upgrade changes them with a hand-written delta.
# sql/functions/*.sql: functions, procedures, views, triggers: re-created by every upgrade.
# sql/*.sql: privileges, applied after both (fresh install and upgrade alike).
# A fresh install runs them in that order, each group in lexical order (docs/development.md).
SCHEMA_PARTS := $(sort $(wildcard sql/schema/*.sql))
FUNCTION_PARTS := $(sort $(wildcard sql/functions/*.sql))
PRIVILEGE_PARTS := $(sort $(wildcard sql/*.sql))
SQL_PARTS := $(SCHEMA_PARTS) $(FUNCTION_PARTS) $(PRIVILEGE_PARTS)
DATA_built = $(EXTENSION)--$(EXTVERSION).sql
# Upgrade scripts and the frozen full scripts of released versions install flat into extension/.
DATA = $(sort $(wildcard migrations/$(EXTENSION)--*.sql))

# The upgrade into this version: built from the schema delta sql/upgrade/PREV--$(EXTVERSION).sql,
# sql/functions/, the privileges and sql/upgrade/regenerate.sql by scripts/build-upgrade.py.
# It is committed (a PGXN user needs no Python to install) and rebuilt until the version is
# released; tests/upgrade/test_migrations.py and `make check-migration` say when it is stale.
UPGRADE_DELTA := $(wildcard sql/upgrade/*--$(EXTVERSION).sql)
UPGRADE_FROM := $(patsubst sql/upgrade/%--$(EXTVERSION).sql,%,$(UPGRADE_DELTA))
UPGRADE_SCRIPT := $(if $(UPGRADE_FROM),migrations/$(EXTENSION)--$(UPGRADE_FROM)--$(EXTVERSION).sql)
UPGRADE_SOURCES := $(UPGRADE_DELTA) sql/upgrade/regenerate.sql $(FUNCTION_PARTS) $(PRIVILEGE_PARTS) \
	scripts/build-upgrade.py $(EXTENSION).control

REGRESS = smoke
REGRESS_OPTS = --inputdir=test

EXTRA_CLEAN = $(EXTENSION)--$(EXTVERSION).sql.tmp

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

.DEFAULT_GOAL := all

# Released files (frozen full scripts, their server Python, released upgrade scripts) are
# listed with their SHA-256 in migrations/released.sha256: `make` fails if one changed.
all: check-released

.PHONY: check-released migration check-migration
check-released:
	@if command -v sha256sum >/dev/null 2>&1; then \
	  sha256sum --check --quiet --strict migrations/released.sha256 \
	  || { echo "error: a released file in migrations/ changed (migrations/released.sha256); released files never change" >&2; exit 1; }; \
	fi

migration:
	@test -n "$(UPGRADE_SCRIPT)" || { echo "error: no schema delta sql/upgrade/*--$(EXTVERSION).sql" >&2; exit 1; }
	@if grep -qF '  $(UPGRADE_SCRIPT)' migrations/released.sha256; then \
	  echo "error: $(UPGRADE_SCRIPT) is released and never changes" >&2; exit 1; fi
	python3 scripts/build-upgrade.py $(UPGRADE_FROM) $(EXTVERSION) $(UPGRADE_SCRIPT)

check-migration:
	@test -n "$(UPGRADE_SCRIPT)" || { echo "error: no schema delta sql/upgrade/*--$(EXTVERSION).sql" >&2; exit 1; }
	@mkdir -p build
	@python3 scripts/build-upgrade.py $(UPGRADE_FROM) $(EXTVERSION) build/upgrade.sql
	@cmp -s build/upgrade.sql $(UPGRADE_SCRIPT) \
	  || { echo "error: $(UPGRADE_SCRIPT) is not what the sources build: run 'make migration' and commit it" >&2; exit 1; }
	@echo "$(UPGRADE_SCRIPT) is up to date"

# The sql directories are prerequisites so that adding or removing a part rebuilds.
# @EXTVERSION@ in a part becomes the control file's version (e.g. the PL/Python path).
$(EXTENSION)--$(EXTVERSION).sql: $(SQL_PARTS) $(wildcard sql sql/schema sql/functions) $(EXTENSION).control
	@test -n "$(SCHEMA_PARTS)" -a -n "$(FUNCTION_PARTS)" || { echo "error: no sql/schema or sql/functions parts to build $@ from" >&2; exit 1; }
	@{ printf '%s\n' '-- Built from sql/*.sql by the Makefile; edit those files, not this one.' \
	     '\echo Use "CREATE EXTENSION $(EXTENSION)" to load this file. \quit'; \
	   for f in $(SQL_PARTS); do printf '\n-- %s\n' "$$f"; cat "$$f"; done; } \
	  | sed 's/@EXTVERSION@/$(EXTVERSION)/g' > $@.tmp
	@mv $@.tmp $@
	@echo "built $@ from $(words $(SQL_PARTS)) part(s)"

# Server-side Python: one directory per version, so a pooled session that still runs
# the old version's SQL finds the matching Python after ALTER EXTENSION UPDATE.
PY_PARTS := $(shell find plpython/mailbox_server -name '*.py' 2>/dev/null | sort)
PY_DEST = $(DESTDIR)$(datadir)/extension/$(EXTENSION)/python/$(EXTVERSION)
# Released versions' server Python, frozen with their scripts: migrations/python/<version>/.
# A database still on that version (not yet updated) keeps loading it.
PY_FROZEN := $(shell find migrations/python -name '*.py' 2>/dev/null | sort)
PY_BASE = $(DESTDIR)$(datadir)/extension/$(EXTENSION)/python

install: install-python
uninstall: uninstall-python

.PHONY: install-python uninstall-python
install-python:
	rm -rf '$(PY_DEST)/mailbox_server'
	$(MKDIR_P) '$(PY_DEST)/mailbox_server'
	@set -e; for f in $(PY_PARTS); do \
	  rel=$${f#plpython/}; \
	  $(MKDIR_P) "$(PY_DEST)/$$(dirname $$rel)"; \
	  $(INSTALL_DATA) "$$f" "$(PY_DEST)/$$rel"; \
	done
	@echo "installed $(words $(PY_PARTS)) Python file(s) into $(PY_DEST)"
	@set -e; for d in $(sort $(dir $(PY_FROZEN))); do \
	  v=$${d#migrations/python/}; v=$${v%%/*}; rm -rf "$(PY_BASE)/$$v/mailbox_server"; done; \
	for f in $(PY_FROZEN); do \
	  rel=$${f#migrations/python/}; \
	  $(MKDIR_P) "$(PY_BASE)/$$(dirname $$rel)"; \
	  $(INSTALL_DATA) "$$f" "$(PY_BASE)/$$rel"; \
	done
	@echo "installed $(words $(PY_FROZEN)) frozen Python file(s) of released versions into $(PY_BASE)"

uninstall-python:
	rm -rf '$(PY_DEST)'
	@set -e; for d in $(sort $(dir $(PY_FROZEN))); do \
	  v=$${d#migrations/python/}; v=$${v%%/*}; rm -rf "$(PY_BASE)/$$v"; done

.PHONY: bootstrap venv lint test demo dist
bootstrap:
	bash scripts/bootstrap.sh all

venv:
	bash scripts/bootstrap.sh venv

lint: venv
	bash scripts/lint.sh

test:
	bash scripts/test.sh $(PYTEST_ARGS)

demo:
	bash scripts/bootstrap.sh all
	bash scripts/install-extension.sh
	.venv/bin/pg-mailbox demo $(DEMO_ARGS)

# PGXN release archive: the committed tree (HEAD; .gitattributes export-ignores the
# development files) plus the built script META.json's `provides` names.
# `make dist DIST=/elsewhere/x.zip` writes it elsewhere (a read-only checkout).
DIST ?= $(EXTENSION)-$(EXTVERSION).zip
dist: $(EXTENSION)--$(EXTVERSION).sql
	@git diff --quiet HEAD -- || echo "warning: uncommitted changes are not in $(DIST) (git archive of HEAD)" >&2
	git archive --format zip --prefix=$(EXTENSION)-$(EXTVERSION)/ \
	  --add-file=$(EXTENSION)--$(EXTVERSION).sql -o $(DIST) HEAD

# `make -s print-EXTVERSION`: lets scripts and tests read what make computed.
print-%:
	@echo '$($*)'
