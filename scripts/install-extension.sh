#!/usr/bin/env bash
# Builds the extension and installs it into the PostgreSQL that PG_CONFIG names.
# Installing needs write access to the server's share directory (root on Debian).
set -euo pipefail
cd "$(dirname "$0")/.."

make -s --no-print-directory
sharedir="$(make -s --no-print-directory print-datadir)"
extdir="$sharedir/extension"
if [ -w "$extdir" ]; then
    make -s --no-print-directory install >/dev/null
    echo "installed pg_mailbox $(make -s --no-print-directory print-EXTVERSION) into $extdir"
    exit 0
fi

# Not writable (not root): fine only if someone already installed exactly this build.
version="$(make -s --no-print-directory print-EXTVERSION)"
script="pg_mailbox--$version.sql"
if cmp -s "$script" "$extdir/$script" \
    && diff -rq -x __pycache__ plpython/mailbox_server \
        "$extdir/pg_mailbox/python/$version/mailbox_server" >/dev/null 2>&1; then
    echo "note: $extdir is not writable, but the installed pg_mailbox $version is up to date"
    exit 0
fi
echo "error: cannot install pg_mailbox: $extdir is not writable by $(id -un)." >&2
echo "       Run 'sudo make install' (or run this as root), then try again." >&2
exit 1
