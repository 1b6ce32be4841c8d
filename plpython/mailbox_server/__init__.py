"""Server-side Python for pg_mailbox (the control plane).

Every function here takes ``plpy`` as its first argument instead of importing it, so the
modules import and unit-test outside PostgreSQL with a fake ``plpy``.
"""

__version__ = "0.2.0"
