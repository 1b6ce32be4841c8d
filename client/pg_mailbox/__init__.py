"""pg_mailbox client: relay, CLI and helpers for the pg_mailbox PostgreSQL extension."""

# Must equal default_version in pg_mailbox.control (enforced by tests/release/test_packaging.py).
__version__ = "0.2.0"
