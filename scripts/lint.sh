#!/usr/bin/env bash
# The linters, exactly as `make test` and CI run them. Runs all, fails if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."

status=0
run() { echo "lint: $*"; "$@" || status=1; }

run .venv/bin/ruff check .
run .venv/bin/ruff format --check .
# The sources only: the scripts in migrations/ are built from them (the full scripts and the
# upgrades by scripts/build-upgrade.py) and released ones never change. nullglob: git keeps
# no empty directories.
shopt -s nullglob
sql_files=(sql/*.sql sql/schema/*.sql sql/functions/*.sql sql/upgrade/*.sql)
if [ ${#sql_files[@]} -gt 0 ]; then
    run .venv/bin/sqlfluff lint --disable-progress-bar --nocolor "${sql_files[@]}"
fi

[ $status -eq 0 ] && echo "lint: ok" || echo "lint: FAILED" >&2
exit $status
