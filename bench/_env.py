"""Where the bench runs: the running local stack (``Settings.load()``) or a private one it starts.

Every pair gets its own uuid topic prefix (topics ``{prefix}.events`` …, Redis keys under the same
prefix, consumer groups and transactional ids derived from it), so pairs never see each other's data
and nothing of a user's own ``runjournal`` topics is touched. :meth:`BenchEnv.cleanup` deletes the
pair's topics and Redis keys.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runjournal.core import kafka
from runjournal.core.settings import Settings

__all__ = ["BenchEnv", "child_env", "open_env", "peak_rss_bytes", "run_child"]

log = logging.getLogger("bench")


@dataclass
class BenchEnv:
    """The broker and Redis the bench uses, and what it created on them."""

    base: Settings
    """Settings of the stack (bootstrap, redis_url)."""
    work_dir: Path
    """Scratch directory (Qdrant paths, SQLite files, Quix state); removed by :meth:`close`."""
    private_stack: Any = None
    """A ``runjournal.deploy.stack.Stack`` the bench started (stopped by :meth:`close`), or None."""
    prefixes: list[str] = field(default_factory=list)
    """Topic prefixes created so far."""
    extra_topics: list[str] = field(default_factory=list)
    """Other topics to delete at the end (e.g. Quix changelogs)."""

    def pair_settings(self, name: str, *, partitions: int = 6) -> Settings:
        """Settings with a fresh prefix ``bench-{name}-{8 hex}``, its topics created."""
        from runjournal.deploy.topics import create_topics

        prefix = f"bench-{name}-{uuid.uuid4().hex[:8]}"
        settings = self.base.model_copy(update={"topic_prefix": prefix, "partitions": partitions,
                                                "qdrant_path": self.work_dir / f"qdrant-{prefix}"})
        create_topics(settings)
        self.prefixes.append(prefix)
        return settings

    def topic(self, name: str, *, partitions: int = 6, config: dict[str, str] | None = None) -> str:
        """Create a plain topic ``bench-{name}-{8 hex}`` (deleted at the end)."""
        from confluent_kafka.admin import NewTopic

        topic = f"bench-{name}-{uuid.uuid4().hex[:8]}"
        admin = kafka.admin_client(self.base)
        fut = admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})])[topic]
        fut.result(30)
        self.extra_topics.append(topic)
        return topic

    def cleanup(self) -> None:
        """Delete every topic and Redis key the bench created (best effort; logged, never raised)."""
        try:
            self._delete_topics()
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the results
            log.warning("could not delete bench topics: %s", exc)
        try:
            self._delete_keys()
        except Exception as exc:  # noqa: BLE001
            log.warning("could not delete bench Redis keys: %s", exc)

    def _delete_topics(self) -> None:

        admin = kafka.admin_client(self.base)
        existing = set(admin.list_topics(timeout=10).topics)
        ours = [t for t in existing if any(t.startswith(p + ".") or p in t for p in self.prefixes)]
        ours += [t for t in existing if any(t.startswith(e) or e in t for e in self.extra_topics)]
        ours = sorted(set(ours))
        if ours:
            for fut in admin.delete_topics(ours, operation_timeout=30).values():
                fut.result(60)

    def _delete_keys(self) -> None:
        import redis

        client = redis.Redis.from_url(self.base.redis_url)
        for prefix in self.prefixes:
            for pattern in (f"rj:{{{prefix}.*", f"rj:{prefix}:*", f"{prefix}:*"):
                batch = list(client.scan_iter(match=pattern, count=2000))
                for i in range(0, len(batch), 1000):
                    client.delete(*batch[i:i + 1000])

    def close(self) -> None:
        """Clean up, stop a private stack, remove the scratch directory."""
        self.cleanup()
        if self.private_stack is not None:
            self.private_stack.down(grace_s=20)
        shutil.rmtree(self.work_dir, ignore_errors=True)


def _reachable(settings: Settings) -> bool:
    import redis

    try:
        if not redis.Redis.from_url(settings.redis_url, socket_timeout=2).ping():
            return False
        meta = kafka.admin_client(settings, **{"socket.timeout.ms": 3000}).list_topics(timeout=5)
        return bool(meta.brokers)
    except Exception:  # noqa: BLE001 - unreachable either way
        return False


def open_env() -> tuple[BenchEnv, str]:
    """The running stack when its broker and Redis answer, else a private stack on free ports.

    Returns:
        ``(env, where)``: ``where`` says which stack and where (for the report header).

    Raises:
        StackError / MissingToolError: no stack runs and a private one could not start.
    """
    work = Path(tempfile.mkdtemp(prefix="rj-bench-"))
    settings = Settings.load()
    if _reachable(settings):
        return BenchEnv(base=settings, work_dir=work), f"running stack {settings.bootstrap} + {settings.redis_url}"
    from runjournal.deploy.procs import free_port
    from runjournal.deploy.stack import Stack, StackPorts

    stack = Stack(work / "stack", settings.cache_dir, ports=StackPorts(free_port(), free_port(), free_port()))
    started = time.monotonic()
    try:
        stack.up()
    except BaseException:
        stack.down(grace_s=10)
        shutil.rmtree(work, ignore_errors=True)
        raise
    state = stack.read_state()
    base = settings.model_copy(update={"bootstrap": state["kafka"]["bootstrap"], "redis_url": state["redis"]["url"],
                                       "stack_dir": work / "stack", "replication_factor": 1})
    where = f"private stack {base.bootstrap} + {base.redis_url} (started in {time.monotonic() - started:.1f} s)"
    return BenchEnv(base=base, work_dir=work, private_stack=stack), where


def peak_rss_bytes(pid: int | None = None) -> int:
    """``VmHWM`` (peak resident set) of ``pid`` (default: this process), bytes; 0 when unreadable."""
    try:
        for line in Path(f"/proc/{pid or os.getpid()}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def child_env(settings: Settings, **extra: str) -> dict[str, str]:
    """Environment for a child process that must use ``settings`` (other ``RUNJOURNAL_*`` removed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    env.update(settings.as_env(), **extra)  # Kafka security and pass-through included
    if "RUNJOURNAL_QDRANT_URL" in extra:
        env.pop("RUNJOURNAL_QDRANT_PATH", None)
    return env


def run_child(settings: Settings, args: list[str], *, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run ``python -m bench._children *args``; returns its JSON line (with ``peak_rss_bytes``).

    Raises:
        RuntimeError: the child failed or printed no JSON (its stderr tail is in the message).
    """
    import json
    import subprocess
    import sys

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", "bench._children", *args], stdout=out, stderr=err,  # noqa: S603
                                env=child_env(settings), cwd=str(Path(__file__).resolve().parent.parent))
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        out.seek(0)
        err.seek(0)
        lines = [ln for ln in out.read().decode().splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"bench child {args} failed (rc={proc.returncode}): {err.read().decode()[-2000:]}")
    return json.loads(lines[-1])
