#!/usr/bin/env python3
"""Moves the run-once statements of function parts to sql/schema/ (docs/development.md,
"Schema and functions").

    scripts/split-schema.py sql/functions/NN_name.sql ...

For each part: CREATE TABLE / INDEX / SEQUENCE / TYPE / DOMAIN, their COMMENTs, ALTER TABLE /
SEQUENCE and pg_extension_config_dump() calls move, with the comments above them, to
sql/schema/NN_name.sql (appended when it exists); the part keeps its header comment and
everything else. A part moved here from sql/ by a merge (git mv sql/NN_name.sql
sql/functions/) is split this way; what the previous version lacks then goes, by hand, into
the delta sql/upgrade/<previous>--<version>.sql.
"""

from __future__ import annotations

import re
import sys
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = spec_from_file_location("build_upgrade", REPO / "scripts" / "build-upgrade.py")
build = module_from_spec(_spec)
_spec.loader.exec_module(build)

SCHEMA = re.compile(
    r"(CREATE\s+(UNLOGGED\s+)?TABLE|CREATE\s+(UNIQUE\s+)?INDEX|CREATE\s+SEQUENCE|CREATE\s+TYPE"
    r"|CREATE\s+DOMAIN|COMMENT\s+ON\s+(TABLE|TYPE|COLUMN|SEQUENCE|DOMAIN|INDEX)"
    r"|SELECT\s+pg_catalog\.pg_extension_config_dump|ALTER\s+(TABLE|SEQUENCE))\b",
    re.IGNORECASE,
)


def split(path: Path) -> int:
    text = path.read_text()
    header = re.match(r"(--[^\n]*\n)+\n", text)
    header_end = header.end() if header else 0
    keep, take = [], []
    for a, b in build.statements(text):
        chunk = text[a:b]
        at = build.code_start(chunk)
        if at >= 0 and SCHEMA.match(chunk[at:]):
            if a < header_end:
                keep.append(text[a:header_end])
                chunk = text[header_end:b]
            take.append(chunk)
        else:
            keep.append(chunk)
    if not take:
        return 0
    spans = build.statements(text)
    rest = text[spans[-1][1] :] if spans else ""
    target = REPO / "sql" / "schema" / path.name
    part = path.name.split("_", 1)[0]
    head = (
        target.read_text().rstrip("\n") + "\n"
        if target.exists()
        else f"-- Part {part}, schema: the tables and types of sql/functions/{path.name} (run once;"
        ' see\n-- docs/development.md, "Schema and functions").\n'
    )
    target.write_text(head + "\n" + "".join(take).strip("\n") + "\n")
    kept = re.sub(r"\n{3,}", "\n\n", "".join(keep) + rest).strip("\n") + "\n"
    path.write_text(kept)
    return len(take)


def main() -> None:
    for name in sys.argv[1:]:
        moved = split(Path(name).resolve())
        print(f"{name}: {moved} statement(s) moved to sql/schema/{Path(name).name}")


if __name__ == "__main__":
    main()
