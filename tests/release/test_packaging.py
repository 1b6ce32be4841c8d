"""Packaging invariants; no server needed. The control file is the one version source."""

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

import pg_mailbox

REPO = Path(__file__).resolve().parents[2]


def control_version() -> str:
    text = (REPO / "pg_mailbox.control").read_text()
    found = re.findall(r"^\s*default_version\s*=\s*'([^']+)'", text, re.MULTILINE)
    assert len(found) == 1, "pg_mailbox.control must set default_version exactly once"
    return found[0]


def meta() -> dict:
    return json.loads((REPO / "META.json").read_text())


def test_meta_json_version_matches_control():
    data = meta()
    assert data["version"] == control_version()
    assert data["provides"]["pg_mailbox"]["version"] == control_version()


def test_client_package_version_matches_control():
    assert pg_mailbox.__version__ == control_version()


def test_pyproject_version_matches_control():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["version"] == control_version()


def test_server_python_package_version_matches_control():
    text = (REPO / "plpython" / "mailbox_server" / "__init__.py").read_text()
    assert re.findall(r'^__version__ = "([^"]+)"', text, re.MULTILINE) == [control_version()]


def test_makefile_reads_version_from_control():
    made = subprocess.run(
        ["make", "-s", "--no-print-directory", "print-EXTVERSION"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    assert made.stdout.strip() == control_version()
    # ... and does not merely happen to agree: no version literal in the Makefile.
    assert control_version() not in (REPO / "Makefile").read_text()


def test_meta_json_is_pgxn_1_0_0():
    data = meta()
    assert data["meta-spec"]["version"] == "1.0.0"
    assert data["name"] == "pg_mailbox"
    for key in ("abstract", "maintainer", "license", "provides"):
        assert data.get(key), f"META.json lacks {key}"
    assert data["license"] == "postgresql"
    assert data["prereqs"]["runtime"]["requires"]["PostgreSQL"] == "13.0.0"


@pytest.mark.parametrize("name", sorted(meta()["provides"]))
def test_meta_json_provided_files_exist(name):
    entry = meta()["provides"][name]
    assert (REPO / entry["docfile"]).is_file(), f"provides.{name}.docfile is missing"
    # `file` is the built script (`make` makes it; `make dist` adds it to the zip, which
    # tests/release/test_pgxn.py checks): pgxn load skips an extension whose file is not *.sql
    assert entry["file"] == f"pg_mailbox--{control_version()}.sql"


def test_meta_json_is_complete_for_pgxn():
    data = meta()
    assert len(data["abstract"]) < 100 and len(data["description"]) > len(data["abstract"])
    for maintainer in data["maintainer"]:
        assert re.fullmatch(r"[^<>]+ <[^<>@\s]+@[^<>@\s]+>", maintainer), maintainer
    runtime = data["prereqs"]["runtime"]
    assert {"PostgreSQL", "plpython3u"} <= set(runtime["requires"])
    assert "pg_cron" in runtime["recommends"]
    resources = data["resources"]
    assert resources["bugtracker"]["web"].startswith("https://")
    assert resources["repository"]["url"].startswith("https://")
    assert resources["repository"]["web"].startswith("https://")
    assert resources["repository"]["type"] == "git"
    assert data["release_status"] in ("stable", "testing", "unstable")


def test_install_docs_match_release_status():
    """docs/install.md's `pgxn install` line works for META.json's release_status: pgxn
    only accepts a testing or unstable release when told to."""
    status = meta()["release_status"]
    flag = "" if status == "stable" else f"--{status} "
    text = (REPO / "docs" / "install.md").read_text()
    lines = re.findall(r"^pgxn install .*pg_mailbox$", text, re.MULTILINE)
    assert lines == [f"pgxn install {flag}pg_mailbox"], lines
    assert f"release_status` in META.json is **{status}**" in text


def test_dev_files_are_export_ignored():
    """`make dist` is a git archive: development files stay out of the distribution."""
    attributes = (REPO / ".gitattributes").read_text()
    ignored = set(re.findall(r"^(\S+)\s+export-ignore$", attributes, re.MULTILINE))
    assert {"/tests", "/bench", "/.ci", "/dbt/integration_tests"} <= ignored
    for path in ("test", "sql", "plpython", "migrations", "docs", "dbt"):
        assert f"/{path}" not in ignored, path


def test_control_file_shape():
    text = (REPO / "pg_mailbox.control").read_text()
    assert re.search(r"^schema\s*=\s*mailbox\s*$", text, re.MULTILINE)
    assert re.search(r"^relocatable\s*=\s*false\s*$", text, re.MULTILINE)


def test_the_contract_ships_in_docs():
    """Comments cite "SPEC §x": the contract they mean is docs/spec.md, a copy of the team's
    shared/SPEC.md (beside the repository in development and CI). When that file is present
    the copy must equal it; without it (an exported tarball) the copy must at least exist."""
    root = Path(__file__).resolve().parents[2]
    shipped = root / "docs" / "spec.md"
    assert shipped.read_text().startswith("# pg_mailbox — product contract")
    team = root.parent / "shared" / "SPEC.md"
    if team.exists():
        assert shipped.read_text() == team.read_text(), "cp ../shared/SPEC.md docs/spec.md"


def test_dbt_package_version_matches_control():
    text = (REPO / "dbt" / "dbt_project.yml").read_text()
    assert re.findall(r'^version: "([^"]+)"', text, re.MULTILINE) == [control_version()]
