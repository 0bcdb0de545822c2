"""Process bookkeeping for the local stack: start detached, identify by (pid, start time), stop gently.

A pid alone is not an identity (pids are reused), so every process the stack starts is
recorded with its kernel start time (``/proc/<pid>/stat`` field 22, clock ticks since
boot). ``stop`` signals a pid only while that pair still matches.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Proc", "port_in_use", "read_tail", "spawn"]


def _start_ticks(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; fields after the closing ')' are fixed.
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[19])  # field 22 overall: starttime


@dataclass(frozen=True)
class Proc:
    """A process the stack started: ``pid`` plus its kernel start time, so a reused pid is never killed."""

    pid: int
    """Process id."""
    start_ticks: int
    """Start time in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""

    def alive(self) -> bool:
        """True while the very process we started still exists (and is not a zombie)."""
        if _start_ticks(self.pid) != self.start_ticks:
            return False
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state != "Z"

    def stop(self, grace_s: float = 30.0) -> str:
        """SIGTERM, wait up to ``grace_s`` seconds, then SIGKILL. Returns what happened.

        Returns:
            ``"not running"``, ``"stopped"`` (exited after SIGTERM) or ``"killed"`` (needed SIGKILL).
        """
        if not self.alive():
            return "not running"
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            _reap(self.pid)
            if not self.alive():
                return "stopped"
            time.sleep(0.1)
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            for _ in range(50):
                _reap(self.pid)
                if not self.alive():
                    break
                time.sleep(0.1)
        return "killed"

    def to_json(self) -> dict[str, int]:
        """``{"pid": int, "start_ticks": int}`` for the state file."""
        return {"pid": self.pid, "start_ticks": self.start_ticks}

    @classmethod
    def from_json(cls, data: dict[str, int] | None) -> Proc | None:
        """Inverse of :meth:`to_json`; None when the state file has no process recorded."""
        if not data:
            return None
        return cls(pid=int(data["pid"]), start_ticks=int(data["start_ticks"]))


def _reap(pid: int) -> None:
    """Collect the exit status if ``pid`` is our child, so it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def spawn(argv: Sequence[str], *, log_path: Path, cwd: Path, env: dict[str, str] | None = None) -> Proc:
    """Start ``argv`` in its own session (survives the CLI's exit), stdout+stderr appended to ``log_path``.

    Raises:
        OSError: the executable could not be started.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        child = subprocess.Popen(  # noqa: S603 - argv is built by us
            list(argv),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    ticks = _start_ticks(child.pid)
    return Proc(pid=child.pid, start_ticks=ticks if ticks is not None else -1)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 for a server we are about to start (tests, private stacks).

    Picked at random *below* the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``):
    the kernel's own choice (bind to port 0) lies inside that range, where any outgoing connection may
    take it between this check and the server's bind ("Address already in use", seen with several test
    stacks on one machine). Still a check-then-use race with other programs picking servers' ports.

    Raises:
        OSError: no free port found after 500 tries.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(500):
        port = random.randint(10000, max(10001, low - 1))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError("no free TCP port below the ephemeral range on 127.0.0.1")


def read_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, or a note that it is missing."""
    try:
        data = path.read_bytes()[-64_000:]
    except OSError:
        return f"(no log at {path})"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])
