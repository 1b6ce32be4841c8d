#!/usr/bin/env bash
# Installs what building, testing and the demo need on Debian 12: PostgreSQL 15 and
# its extensions from apt (as root), and .venv with the client package (editable)
# and the dev tools. Idempotent and fast on re-runs.
#
#   scripts/bootstrap.sh [all|apt|venv]      (default: all)
#   MAILBOX_SKIP_APT=1   skip the apt step (non-Debian machines, packages from elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
    postgresql-15 postgresql-plpython3-15 postgresql-server-dev-15
    postgresql-15-cron postgresql-15-pgq3 make
)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

ensure_apt() {
    [ "${MAILBOX_SKIP_APT:-0}" = 1 ] && return 0
    local wanted=("${APT_PACKAGES[@]}") missing=() p
    # A python3 with venv/ensurepip (pyenv's counts) is enough; else Debian's.
    if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then wanted+=(python3 python3-venv); fi
    for p in "${wanted[@]}"; do installed "$p" || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: missing Debian packages: ${missing[*]}" >&2
        echo "run:   sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
    echo "bootstrap: apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

ensure_venv() {
    local stamp=.venv/.bootstrap-stamp want
    # Reinstall only when what pip would install changes: pyproject.toml (deps, extras,
    # entry points) or this script. The client is editable, so code edits need nothing.
    want="$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)"
    if [ -x .venv/bin/python ] && .venv/bin/python -c '' 2>/dev/null \
        && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    # A venv whose interpreter disappeared (pyenv upgrade) is rebuilt from scratch.
    if ! .venv/bin/python -c '' 2>/dev/null; then
        rm -rf .venv
        echo "bootstrap: creating .venv"
        python3 -m venv .venv
    fi
    echo "bootstrap: pip install -e '.[dev]'"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
    echo "$want" > "$stamp"
}

case "${1:-all}" in
    all) ensure_apt; ensure_venv ;;
    apt) ensure_apt ;;
    venv) ensure_venv ;;
    *) echo "usage: $0 [all|apt|venv]" >&2; exit 2 ;;
esac
