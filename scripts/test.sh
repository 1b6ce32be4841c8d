#!/usr/bin/env bash
# `make test`: install what is missing, build and install the extension, lint, and run
# the whole pytest suite (unit, behaviour, slow, packaging, installcheck). Lint and
# tests both run so one report shows everything; any failure fails the run.
# Extra arguments go to pytest (make test PYTEST_ARGS='-k outbox -x').
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/bootstrap.sh all
bash scripts/install-extension.sh

lint_status=0
bash scripts/lint.sh || lint_status=$?

test_status=0
.venv/bin/python -m pytest "$@" || test_status=$?
if [ $test_status -eq 5 ]; then
    echo "error: pytest collected no tests; that is a failure, not a pass" >&2
fi

if [ $lint_status -ne 0 ] || [ $test_status -ne 0 ]; then
    echo "make test: FAILED (lint exit $lint_status, pytest exit $test_status)" >&2
    exit 1
fi
echo "make test: ok"
