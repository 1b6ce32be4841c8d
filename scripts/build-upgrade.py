#!/usr/bin/env python3
"""Builds the upgrade script pg_mailbox--A--B.sql (`make migration`; docs/development.md).

    build-upgrade.py A B OUT

An upgrade is: the hand-written schema delta sql/upgrade/A--B.sql (tables, types, dropped or
re-signed functions, data), then every part of sql/functions/ re-created, then the
privileges (sql/*.sql), then sql/upgrade/regenerate.sql (per-outbox and per-inbox generated
code rebuilt by the new functions). The function parts are the ones a fresh install runs;
only the head of each top-level statement is rewritten so it can run over the old objects:

    CREATE FUNCTION / PROCEDURE / VIEW / TRIGGER -> CREATE OR REPLACE ...
    CREATE CONSTRAINT TRIGGER t ... ON rel       -> DROP TRIGGER IF EXISTS t ON rel; CREATE ...

COMMENT, GRANT and REVOKE re-run as they are, except in the privileges, where
REVOKE ALL ON ALL FUNCTIONS / TABLES / SEQUENCES IN SCHEMA mailbox FROM PUBLIC becomes the
same REVOKE on each extension member only: the schema also holds objects made at run time
(generated functions, per-inbox views, partitions) whose privileges are not the upgrade's
to rewrite. Any other statement in sql/functions/ cannot
run twice (a table, a type, a config_dump), so it is an error: move it to sql/schema/ and
put what the old version lacks into the delta. @EXTVERSION@ becomes B.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RERUNNABLE = re.compile(r"(COMMENT ON|GRANT|REVOKE)\b", re.IGNORECASE)
REPLACEABLE = re.compile(r"CREATE\s+(FUNCTION|PROCEDURE|VIEW|TRIGGER)\b", re.IGNORECASE)
CONSTRAINT_TRIGGER = re.compile(
    r"CREATE\s+CONSTRAINT\s+TRIGGER\s+(\S+)\s.*?\bON\s+(\S+)", re.IGNORECASE | re.DOTALL
)
REVOKE_ALL = re.compile(
    r"REVOKE\s+ALL\s+ON\s+ALL\s+(FUNCTIONS|TABLES|SEQUENCES)\s+IN\s+SCHEMA\s+mailbox\s+FROM\s+PUBLIC\s*;",
    re.IGNORECASE,
)
# pg_class kinds and the GRANT object word for each REVOKE ALL ON ALL <what>
MEMBERS = {
    "FUNCTIONS": ("pg_proc", "p.prokind IN ('f', 'p')", "ROUTINE"),
    "TABLES": ("pg_class", "c.relkind IN ('r', 'p', 'v', 'm', 'f')", "TABLE"),
    "SEQUENCES": ("pg_class", "c.relkind = 'S'", "SEQUENCE"),
}
DOLLAR = re.compile(r"\$[A-Za-z_][A-Za-z_0-9]*\$|\$\$")


def statements(text: str) -> list[tuple[int, int]]:
    """(start, end) of each top-level statement, the comments before it included: splits at
    semicolons outside comments, quotes and dollar-quoted bodies."""
    spans, start, i, n = [], 0, 0, len(text)
    while i < n:
        if text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            i = text.index("*/", i) + 2
        elif text[i] in "'\"":
            q, j = text[i], i + 1
            while True:
                j = text.index(q, j)
                if text.startswith(q * 2, j):
                    j += 2
                    continue
                break
            i = j + 1
        elif text[i] == "$" and (m := DOLLAR.match(text, i)):
            i = text.index(m.group(0), m.end()) + len(m.group(0))
        elif text[i] == ";":
            spans.append((start, i + 1))
            start = i = i + 1
        else:
            i += 1
    if text[start:].strip():
        spans.append((start, n))
    return spans


def code_start(chunk: str) -> int:
    """Offset of the first character of a statement that is not blank or a comment."""
    i = 0
    while i < len(chunk):
        if chunk[i].isspace():
            i += 1
        elif chunk.startswith("--", i):
            j = chunk.find("\n", i)
            i = len(chunk) if j < 0 else j
        elif chunk.startswith("/*", i):
            i = chunk.index("*/", i) + 2
        else:
            return i
    return -1


def rerunnable(path: Path) -> str:
    text = path.read_text()
    out, pos = [], 0
    for a, b in statements(text):
        chunk = text[a:b]
        at = code_start(chunk)
        if at < 0:
            out.append(chunk)
            continue
        head, body = chunk[:at], chunk[at:]
        if m := CONSTRAINT_TRIGGER.match(body):
            body = f"DROP TRIGGER IF EXISTS {m.group(1)} ON {m.group(2)};\n{body}"
        elif m := REPLACEABLE.match(body):
            body = f"CREATE OR REPLACE {m.group(1)}" + body[m.end() :]
        elif not RERUNNABLE.match(body):
            line = text.count("\n", 0, a + at) + 1
            first = body.splitlines()[0]
            raise SystemExit(
                f"{path.relative_to(REPO)}:{line}: cannot re-run in an upgrade: {first}\n"
                "  sql/functions/ holds what every upgrade re-creates; move this statement to"
                " sql/schema/ and add what the old version lacks to the delta sql/upgrade/."
            )
        out.append(head + body)
        pos = b
    out.append(text[pos:])
    return "".join(out)


def revoke_members(text: str) -> str:
    """REVOKE ALL ON ALL <what> IN SCHEMA mailbox FROM PUBLIC, for extension members only."""

    def block(m: re.Match) -> str:
        catalog, kind, word = MEMBERS[m.group(1).upper()]
        alias = catalog[3]
        ident = "p.oid::regprocedure::text" if catalog == "pg_proc" else "c.oid::regclass::text"
        return (
            f"-- (upgrade) {m.group(0)} -- on the extension's members only\n"
            "DO $revoke$\nDECLARE\n    v_object text;\nBEGIN\n"
            f"    FOR v_object IN SELECT {ident} FROM pg_catalog.{catalog} AS {alias}\n"
            "        JOIN pg_catalog.pg_depend AS d"
            f" ON d.classid = 'pg_catalog.{catalog}'::regclass\n"
            f"         AND d.objid = {alias}.oid AND d.deptype = 'e'\n"
            "        JOIN pg_catalog.pg_extension AS e"
            " ON e.oid = d.refobjid AND e.extname = 'pg_mailbox'\n"
            f"       WHERE {kind} ORDER BY 1\n    LOOP\n"
            f"        EXECUTE pg_catalog.format('REVOKE ALL ON {word} %s FROM PUBLIC', v_object);\n"
            "    END LOOP;\nEND\n$revoke$;"
        )

    return REVOKE_ALL.sub(block, text)


def main() -> None:
    old, new, target = sys.argv[1:4]
    delta = REPO / "sql" / "upgrade" / f"{old}--{new}.sql"
    if not delta.exists():
        raise SystemExit(f"missing the schema delta {delta.relative_to(REPO)}")
    parts = [(delta, delta.read_text())]
    parts += [(p, rerunnable(p)) for p in sorted((REPO / "sql" / "functions").glob("*.sql"))]
    parts += [(p, revoke_members(p.read_text())) for p in sorted((REPO / "sql").glob("*.sql"))]
    regenerate = REPO / "sql" / "upgrade" / "regenerate.sql"
    parts.append((regenerate, regenerate.read_text()))
    lines = [
        f"-- Built by `make migration` from sql/upgrade/{old}--{new}.sql, sql/functions/*.sql,",
        "-- sql/*.sql and sql/upgrade/regenerate.sql (scripts/build-upgrade.py); edit those.",
        f"\\echo Use \"ALTER EXTENSION pg_mailbox UPDATE TO '{new}'\" to load this file. \\quit",
    ]
    for path, text in parts:
        lines.append(f"\n-- {path.relative_to(REPO)}")
        lines.append(text.rstrip("\n"))
    Path(target).write_text("\n".join(lines).replace("@EXTVERSION@", new) + "\n")


if __name__ == "__main__":
    main()
