"""Throwaway PostgreSQL clusters for the test suite and the demo.

PostgreSQL refuses to run as root, while CI runs everything as root in a clone whose
parents (e.g. /root) other users cannot traverse. So when we are uid 0 every server
binary runs as the ``postgres`` OS user, and a base directory that user cannot write
is replaced by a symlink to a private directory under /tmp. Clients connect over a
unix socket in the cluster's own directory with trust auth, so nothing touches the
machine's regular PostgreSQL service or its port.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from psycopg.conninfo import make_conninfo

SUPERUSER = "postgres"
DEBIAN_PG_CONFIG = Path("/usr/lib/postgresql/15/bin/pg_config")
# What the extension expects of a server: pg_cron preloaded and able to run jobs in
# the "postgres" database, and room for the concurrency tests' connections.
DEFAULT_SETTINGS = {
    "shared_preload_libraries": "pg_cron",
    "cron.database_name": "postgres",
    "max_connections": "200",
}
# sun_path holds 108 bytes; keep the socket directory well below that.
_MAX_SOCKET_DIR_LEN = 80


class ClusterError(RuntimeError):
    """A cluster could not be created, started or stopped."""


def find_bindir() -> Path:
    """Server binaries of the PostgreSQL the Makefile installs into (PG_CONFIG rule)."""
    if os.environ.get("MAILBOX_PG_BINDIR"):
        return Path(os.environ["MAILBOX_PG_BINDIR"])
    pg_config = os.environ.get("PG_CONFIG")
    if not pg_config:
        pg_config = (
            str(DEBIAN_PG_CONFIG) if DEBIAN_PG_CONFIG.exists() else shutil.which("pg_config")
        )
    if not pg_config:
        raise ClusterError(
            "PostgreSQL server binaries not found: install postgresql-15 "
            "(make bootstrap) or set PG_CONFIG / MAILBOX_PG_BINDIR"
        )
    out = subprocess.run([pg_config, "--bindir"], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quote_setting(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


class Cluster:
    """initdb / start / stop / dsn for one private cluster.

    ``base_dir`` holds ``data/``, ``sock/`` and ``server.log``; ``None`` means a fresh
    directory under /tmp that ``destroy()`` removes. Use as a context manager to get a
    running cluster that is destroyed afterwards.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        settings: dict[str, str] | None = None,
        port: int | None = None,
        bindir: str | os.PathLike[str] | None = None,
        os_user: str | None = None,
    ) -> None:
        self.requested_dir = Path(base_dir).absolute() if base_dir is not None else None
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self.port = port or free_port()
        self.bindir = Path(bindir) if bindir else find_bindir()
        # Who runs the server binaries when we are root; as anyone else, we do.
        self.os_user = (os_user or SUPERUSER) if os.geteuid() == 0 else None
        if self.os_user:
            try:
                pwd.getpwnam(self.os_user)
            except KeyError:
                raise ClusterError(
                    f"running as root, the server must run as OS user {self.os_user!r},"
                    " which does not exist (Debian's postgresql packages create it)"
                ) from None
        self.base_dir: Path | None = None
        if self.requested_dir is not None and self.requested_dir.exists():
            # An existing cluster (e.g. a kept demo): adopt it so stop()/dsn() work.
            self.base_dir = self.requested_dir.resolve()
            pid_file = self.data_dir / "postmaster.pid"
            if port is None and pid_file.exists():
                self.port = int(pid_file.read_text().splitlines()[3])

    # -- paths -----------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        return self._base() / "data"

    @property
    def log_path(self) -> Path:
        return self._base() / "server.log"

    @property
    def socket_dir(self) -> Path:
        return (self._base() / "sock").resolve()

    def _base(self) -> Path:
        if self.base_dir is None:
            raise ClusterError("cluster not initialised: call init() first")
        return self.base_dir

    # -- running server binaries -------------------------------------------------
    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        kwargs: dict = {}
        if self.os_user:
            pw = pwd.getpwnam(self.os_user)
            kwargs = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
            env["HOME"] = pw.pw_dir
        # cwd "/": the postgres user may not be able to traverse the caller's cwd.
        proc = subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            cwd="/",
            env=env,
            capture_output=True,
            text=True,
            **kwargs,
        )
        if check and proc.returncode != 0:
            output = proc.stdout + proc.stderr
            raise ClusterError(f"{args[0]} failed ({proc.returncode}):\n{output}{self._log_tail()}")
        return proc

    def _chown(self, path: Path) -> None:
        if self.os_user:
            pw = pwd.getpwnam(self.os_user)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _user_can_write(self, path: Path) -> bool:
        if not self.os_user:
            return os.access(path, os.W_OK | os.X_OK)
        pw = pwd.getpwnam(self.os_user)
        probe = subprocess.run(
            ["test", "-w", str(path), "-a", "-x", str(path)],
            cwd="/",
            user=pw.pw_uid,
            group=pw.pw_gid,
            extra_groups=[],
        )
        return probe.returncode == 0

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, ClusterError):
            return ""
        return "\n--- server log tail ---\n" + "\n".join(text.splitlines()[-lines:])

    # -- lifecycle ---------------------------------------------------------------
    def _make_base(self) -> None:
        if self.requested_dir is None:
            self.base_dir = Path(tempfile.mkdtemp(prefix="pg_mailbox-"))
        else:
            if self.requested_dir.exists() or self.requested_dir.is_symlink():
                raise ClusterError(f"{self.requested_dir} exists: destroy() the old cluster first")
            self.requested_dir.mkdir(parents=True)
            self.base_dir = self.requested_dir
        self._chown(self.base_dir)
        if not self._user_can_write(self.base_dir):
            # e.g. a clone under /root (mode 0700) that "postgres" cannot traverse:
            # keep the data under /tmp and leave a symlink where it was asked for.
            assert self.requested_dir is not None
            prefix = f"pg_mailbox-{self.requested_dir.name.strip('.')}-"
            real = Path(tempfile.mkdtemp(prefix=prefix))
            self.requested_dir.rmdir()
            self.requested_dir.symlink_to(real, target_is_directory=True)
            self.base_dir = real
            self._chown(real)
        sock = self.base_dir / "sock"
        if len(str(sock)) <= _MAX_SOCKET_DIR_LEN:
            sock.mkdir()
            self._chown(sock)
        else:
            short = Path(tempfile.mkdtemp(prefix="pgmb-sock-"))
            self._chown(short)
            sock.symlink_to(short, target_is_directory=True)

    def init(self) -> Cluster:
        """Create the base directory and run initdb; settings go into postgresql.conf."""
        self._make_base()
        self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "--no-instructions",
        )
        settings = {
            **self.settings,
            "port": str(self.port),
            "listen_addresses": "",
            "unix_socket_directories": str(self.socket_dir),
        }
        if "pg_cron" in settings.get("shared_preload_libraries", ""):
            # pg_cron runs jobs over libpq (default host localhost); we listen on no TCP.
            settings.setdefault("cron.host", str(self.socket_dir))
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# pg_mailbox throwaway cluster\n")
            for key, value in settings.items():
                conf.write(f"{key} = {_quote_setting(value)}\n")
        return self

    def running(self) -> bool:
        if self.base_dir is None or not (self.data_dir / "postmaster.pid").exists():
            return False
        return self._run("pg_ctl", "status", "-D", str(self.data_dir), check=False).returncode == 0

    def start(self, timeout: int = 60) -> Cluster:
        self._run(
            "pg_ctl",
            "start",
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_path),
            "-w",
            "-t",
            str(timeout),
        )
        return self

    def stop(self, mode: str = "fast", timeout: int = 60) -> None:
        if self.running():
            self._run(
                "pg_ctl", "stop", "-D", str(self.data_dir), "-m", mode, "-w", "-t", str(timeout)
            )

    def destroy(self) -> None:
        """Stop the server if it runs and remove every file of the cluster."""
        if self.base_dir is not None:
            self.stop()
            sock = self.base_dir / "sock"
            if sock.is_symlink():
                shutil.rmtree(sock.resolve(), ignore_errors=True)
            shutil.rmtree(self.base_dir, ignore_errors=True)
        # Also a dangling link whose /tmp target is gone (reboot, tmp cleaner).
        if self.requested_dir is not None and self.requested_dir.is_symlink():
            self.requested_dir.unlink()
        self.base_dir = None

    def dsn(self, dbname: str = "postgres", user: str = SUPERUSER) -> str:
        return make_conninfo(
            "", host=str(self.socket_dir), port=self.port, user=user, dbname=dbname
        )

    def __enter__(self) -> Cluster:
        try:
            return self.init().start()
        except BaseException:
            self.destroy()
            raise

    def __exit__(self, *exc: object) -> None:
        self.destroy()
