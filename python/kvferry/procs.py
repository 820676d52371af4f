"""Start kvferry daemons for tests and notebooks: Master, Node, Target,
Resp.

Each is a context manager that spawns the bundled ``kvferry`` command on
a free loopback port (port 0: the daemon picks it and prints it), waits
until the daemon prints its ready line (or fails with its log after
``timeout`` seconds), and stops it with SIGTERM (then SIGKILL) on exit.
The environment is passed through; ``env`` adds or overrides variables
(``KVF_SECRET_FILE``, ``KVF_*`` configuration keys, ...).

    with Master() as m, Node(m.address, pool="64M"):
        with Store.connect(m.address) as st:
            ...
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Mapping, Optional

from ._lib import binary_path


class ProcessError(RuntimeError):
    """A daemon that exited or did not get ready in time (with its log)."""


class _Daemon:
    _ready_prefix = ""

    def __init__(self, args: List[str], env: Optional[Mapping[str, str]] = None,
                 timeout: float = 20.0, binary: Optional[str] = None):
        self.args = [binary or binary_path()] + args
        self.env = dict(os.environ)
        if env:
            self.env.update({k: str(v) for k, v in env.items()})
        self.timeout = timeout
        self.proc: Optional[subprocess.Popen] = None
        self.fields: Dict[str, str] = {}
        self._log = tempfile.TemporaryFile(prefix="kvferry-")
        self._out = tempfile.TemporaryFile(prefix="kvferry-")

    def start(self) -> "_Daemon":
        """Spawns the daemon and waits for its ready line."""
        self.proc = subprocess.Popen(self.args, stdout=self._out, stderr=self._log,
                                     stdin=subprocess.DEVNULL, env=self.env,
                                     close_fds=True)
        deadline = time.monotonic() + self.timeout
        while True:
            line = self._ready_line()
            if line is not None:
                self.fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
                return self
            if self.proc.poll() is not None:
                raise ProcessError("%s exited with %d:\n%s" % (" ".join(self.args),
                                                               self.proc.returncode, self.log()))
            if time.monotonic() > deadline:
                self.stop()
                raise ProcessError("%s not ready within %.1f s:\n%s" % (
                    " ".join(self.args), self.timeout, self.log()))
            time.sleep(0.01)

    def _ready_line(self) -> Optional[str]:
        self._out.seek(0)
        for raw in self._out.read().decode(errors="replace").splitlines():
            if raw.startswith(self._ready_prefix):
                return raw
        return None

    def log(self) -> str:
        """What the daemon wrote on stderr so far."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL (a crash, for fault tests)."""
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after timeout; returns the exit status."""
        p = self.proc
        if p is None:
            return 0
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return p.returncode

    def close(self) -> None:
        self.stop()
        for f in (self._log, self._out):
            try:
                f.close()
            except OSError:
                pass

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Master(_Daemon):
    """``kvferry master`` on 127.0.0.1:<free port>; ``address`` is its "host:port"."""

    _ready_prefix = "master="

    def __init__(self, *extra: str, listen: str = "127.0.0.1:0", http: str = "off",
                 env: Optional[Mapping[str, str]] = None, timeout: float = 20.0,
                 binary: Optional[str] = None):
        super().__init__(["master", "--listen", listen, "--http", http] + list(extra),
                         env, timeout, binary)

    @property
    def address(self) -> str:
        return self.fields["master"]

    @property
    def http(self) -> str:
        return self.fields.get("http", "off")


class Node(_Daemon):
    """``kvferry node`` contributing ``pool`` bytes to the master at ``master``."""

    _ready_prefix = "node="

    def __init__(self, master: str, *extra: str, pool: str = "64M",
                 listen: str = "127.0.0.1:0", env: Optional[Mapping[str, str]] = None,
                 timeout: float = 20.0, binary: Optional[str] = None):
        super().__init__(["node", "--master", master, "--pool", str(pool), "--listen", listen]
                         + list(extra), env, timeout, binary)

    @property
    def segment(self) -> str:
        return self.fields["node"]


class Target(_Daemon):
    """``kvferry target``: a pool of seeded random bytes served to initiators;
    ``segment`` is its name, ``pool_addr``/``pool_len`` its region."""

    _ready_prefix = "segment="

    def __init__(self, *extra: str, pool: str = "64M", seed: int = 2,
                 listen: str = "127.0.0.1:0", transports: Optional[str] = None,
                 env: Optional[Mapping[str, str]] = None, timeout: float = 20.0,
                 binary: Optional[str] = None):
        args = ["target", "--pool", str(pool), "--seed", str(seed), "--listen", listen]
        if transports:
            args += ["--transports", transports]
        super().__init__(args + list(extra), env, timeout, binary)

    @property
    def segment(self) -> str:
        return self.fields["segment"]

    @property
    def pool_addr(self) -> int:
        return int(self.fields["pool"].split("+")[0], 16)

    @property
    def pool_len(self) -> int:
        return int(self.fields["pool"].split("+")[1])


class Resp(_Daemon):
    """``kvferry resp``: the RESP2 door on the store of the master at
    ``master``; ``address`` is its "host:port"."""

    _ready_prefix = "resp="

    def __init__(self, master: str, *extra: str, listen: str = "127.0.0.1:0",
                 env: Optional[Mapping[str, str]] = None, timeout: float = 20.0,
                 binary: Optional[str] = None):
        super().__init__(["resp", "--listen", listen, "--master", master] + list(extra),
                         env, timeout, binary)

    @property
    def address(self) -> str:
        return self.fields["resp"]
