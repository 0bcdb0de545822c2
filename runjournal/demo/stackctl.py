"""The fault campaign's hands on the stack: SIGKILL / SIGSTOP a broker, Redis or the registry, and restart them.

The demo runs on the stack ``runjournal stack up`` started — the one whose state file
(``<RUNJOURNAL_STACK_DIR>/stack.json``) names the broker the settings point at. It signals the processes
recorded there (pid *and* kernel start time, like ``stack down``) and brings a killed one back the way an
operator would: ``Stack.up()``, which restarts only what is not running, on its data. A cluster the demo
did not start (``RUNJOURNAL_BOOTSTRAP`` elsewhere) cannot be faulted: :class:`StackControlError` says so.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import redis

from runjournal.core import kafka, redis_client
from runjournal.core.errors import RunjournalError
from runjournal.core.settings import Settings
from runjournal.deploy.kafka_cluster import wait_isr
from runjournal.deploy.procs import Proc
from runjournal.deploy.stack import Stack

__all__ = ["StackControl", "StackControlError"]


class StackControlError(RunjournalError):
    """A fault needs a process the demo cannot reach (no local stack, too few brokers, no registry)."""


class StackControl:
    """Processes of the running local stack (see the module docstring).

    Args:
        settings: the demo's settings (``stack_dir``, ``bootstrap``, ``redis_url``).

    Raises:
        StackControlError: no state file, or it describes another cluster than the settings name.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stack = Stack(settings.stack_dir, settings.cache_dir, topic_prefix=settings.topic_prefix)
        state = self.stack.read_state()
        kafka_entry = state.get("kafka") or {}
        if not kafka_entry.get("bootstrap") or set(kafka_entry["bootstrap"].split(",")) != \
                set(settings.bootstrap.split(",")):
            raise StackControlError(
                f"faults on brokers, Redis or the registry need the local stack the settings point at; "
                f"{self.stack.state_path} names {kafka_entry.get('bootstrap') or 'no broker'}, the settings "
                f"{settings.bootstrap}: run the demo on `runjournal stack up --brokers 3` (RUNJOURNAL_STACK_DIR)")

    def state(self) -> dict[str, Any]:
        """The state file now (a restart rewrites it)."""
        return self.stack.read_state()

    @property
    def brokers(self) -> int:
        """Kafka nodes of the stack."""
        return int(self.state()["kafka"].get("brokers", 1))

    @property
    def has_registry(self) -> bool:
        """True when the stack runs a schema registry and the demo uses it."""
        return bool(self.state().get("registry")) and bool(self.settings.schema_registry_url)

    # -- brokers -----------------------------------------------------------------------------------
    def events_leaders(self) -> dict[int, int]:
        """Events partition -> node id of its leader (from a metadata request)."""
        topic = self.settings.events_topic
        meta = kafka.admin_client(self.settings).list_topics(topic, timeout=10)
        return {p.id: p.leader for p in meta.topics[topic].partitions.values()}

    def kill_leader(self, choose: Any) -> tuple[int, list[int]]:
        """SIGKILL the broker leading the most events partitions (``choose`` breaks ties).

        Returns:
            ``(node_id, partitions it led)``.

        Raises:
            StackControlError: fewer than 3 brokers (one broker's loss would be a full outage), or no leader.
        """
        if self.brokers < 3:
            raise StackControlError("broker faults need a replicated cluster: `runjournal stack up --brokers 3`")
        leaders = self.events_leaders()
        by_node: dict[int, list[int]] = {}
        for p, node in leaders.items():
            if node >= 0:
                by_node.setdefault(node, []).append(p)
        if not by_node:
            raise StackControlError(f"no events partition has a leader now: {leaders}")
        most = max(len(v) for v in by_node.values())
        node_id = choose(sorted(n for n, v in by_node.items() if len(v) == most))
        entry = next(n for n in self.state()["kafka"]["nodes"] if n["node_id"] == node_id)
        proc = Proc.from_json(entry.get("process"))
        if proc is None or not proc.alive():
            raise StackControlError(f"broker {node_id} is not running")
        os.kill(proc.pid, signal.SIGKILL)
        _wait_dead(proc)
        return node_id, sorted(by_node[node_id])

    def signal_broker(self, node_id: int, sig: int) -> None:
        """Send ``sig`` (SIGSTOP / SIGCONT) to broker ``node_id``.

        Raises:
            StackControlError: fewer than 3 brokers, or the broker is not running.
        """
        if self.brokers < 3:
            raise StackControlError("broker faults need a replicated cluster: `runjournal stack up --brokers 3`")
        entry = next(n for n in self.state()["kafka"]["nodes"] if n["node_id"] == node_id)
        proc = Proc.from_json(entry.get("process"))
        if proc is None or not proc.alive():
            raise StackControlError(f"broker {node_id} is not running")
        os.kill(proc.pid, sig)

    def broker_ids(self) -> list[int]:
        """Node ids of the stack's brokers."""
        return sorted(int(n["node_id"]) for n in self.state()["kafka"]["nodes"])

    def restart(self) -> dict[str, Any]:
        """``Stack.up()``: restart whatever is not running (a killed broker on its data, Redis on its AOF, the
        registry on its H2 file). Returns its report."""
        return self.stack.up(registry=bool(self.state().get("registry")), timeout_s=180)

    def wait_isr(self, timeout_s: float = 120.0) -> float:
        """Seconds until every events partition has its full replica set in sync again."""
        return wait_isr(self.settings, self.settings.events_topic, timeout_s=timeout_s)

    # -- Redis -------------------------------------------------------------------------------------
    def kill_redis(self) -> None:
        """SIGKILL redis-server (appendfsync everysec: what it wrote to the kernel survives a process kill)."""
        proc = Proc.from_json(self.state().get("redis", {}).get("process"))
        if proc is None or not proc.alive():
            raise StackControlError("the stack's Redis is not running")
        os.kill(proc.pid, signal.SIGKILL)
        _wait_dead(proc)

    def wait_redis(self, timeout_s: float = 60.0) -> float:
        """Seconds until Redis answers PING (after the AOF is loaded)."""
        started = time.monotonic()
        client = redis_client.client(self.settings, socket_timeout=2)
        while True:
            try:
                if client.ping():
                    return time.monotonic() - started
            except redis.RedisError:
                pass
            if time.monotonic() - started > timeout_s:
                raise StackControlError(f"Redis did not answer within {timeout_s} s after its restart")
            time.sleep(0.1)

    # -- registry ----------------------------------------------------------------------------------
    def kill_registry(self) -> None:
        """SIGKILL the schema registry.

        Raises:
            StackControlError: the demo uses no registry.
        """
        if not self.has_registry:
            raise StackControlError("no schema registry in use (`runjournal stack up --registry`)")
        proc = Proc.from_json(self.state()["registry"].get("process"))
        if proc is None or not proc.alive():
            raise StackControlError("the stack's registry is not running")
        os.kill(proc.pid, signal.SIGKILL)
        _wait_dead(proc)


def _wait_dead(proc: Proc, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while proc.alive() and time.monotonic() < deadline:
        try:
            os.waitpid(proc.pid, os.WNOHANG)  # our child only when the demo started the stack itself
        except ChildProcessError:
            pass
        time.sleep(0.05)
