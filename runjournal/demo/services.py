"""The demo's supporting services and their bookkeeping: provider, memory extractor, knowledge, registry subject,
the approver thread, the recovery service's reports and the agents' turn-context counters."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from runjournal.core import redis_client
from runjournal.core.settings import Settings
from runjournal.demo.agent import DemoKeys
from runjournal.demo.fleet import Fleet
from runjournal.producers.approvals import ApprovalInbox

__all__ = ["Approver", "child_env", "contexts_summary", "finish_archiver", "finish_memory", "ingest_knowledge",
           "read_recoveries", "register_subject", "start_memory", "wait_http"]

log = logging.getLogger("runjournal.demo")


def child_env(settings: Settings) -> dict[str, str]:
    """The children's environment: this process's, ``RUNJOURNAL_*`` replaced by ``settings`` (Kafka security
    and pass-through included: children connect like the parent)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    env.update(settings.as_env())
    return env


def register_subject(settings: Settings) -> list[dict[str, Any]]:
    """With a schema registry: register the published event schemas under the demo prefix's subject
    (``{prefix}.events-value``), as ``runjournal schemas publish --registry`` does — producers never register.
    Returns what was registered (empty without a registry)."""
    if not settings.schema_registry_url:
        return []
    from runjournal.schemas.registration import register_versions

    return [vars(r) for r in register_versions(settings.schema_registry_url, f"{settings.events_topic}-value")]


def wait_http(url: str, timeout_s: float = 30.0) -> None:
    """Block until ``GET url`` answers 200.

    Raises:
        RuntimeError: it did not within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"provider did not answer at {url}")


def start_memory(fleet: Fleet, settings: Settings) -> bool:
    """Start the memory extractor; it owns the Qdrant directory and serves the agents' memory and knowledge
    reads, so agents start only once it serves (or after 60 s, reading facts only if it never does).
    Returns False when memory is not installed (no ``[memory]`` extra) or the extractor died at start."""
    if importlib.util.find_spec("qdrant_client") is None:
        return False
    from runjournal.consumers.cognition import read_discovery

    proc = fleet.start_memory()
    deadline = time.monotonic() + 60
    while settings.qdrant_url is None and read_discovery(settings.effective_qdrant_path) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            log.warning("the memory extractor does not serve reads; agents build contexts from facts only")
            return proc.poll() is None
        time.sleep(0.1)
    return True


def finish_memory(fleet: Fleet, env: dict[str, str]) -> dict[str, Any]:
    """Stop the extractor, run a last ``--until-caught-up`` pass, and count the items in Qdrant."""
    proc = fleet.memory
    if proc is None:
        return {"memory_items_written": 0, "memory_items_without_provenance": 0, "memory": "not built"}
    if proc.poll() is None:
        proc.terminate()
        proc.wait(60)
    final = subprocess.run([sys.executable, "-m", "runjournal", "memory-extractor", "--until-caught-up", "--json"],
                           env=env, capture_output=True, text=True, timeout=600, check=False)
    from runjournal.demo.memory_check import memory_counts

    return memory_counts(env, final)


def finish_archiver(fleet: Fleet, env: dict[str, str]) -> dict[str, Any]:
    """The ``archiver`` fault's end: stop the archiver service (SIGTERM), then run ``runjournal archiver
    --until-caught-up --json`` once (it finishes any archive a kill interrupted and archives what is due), so the
    archive's rules are checked on a caught-up archiver (docs/design/decisions/0056-retention-and-archive.md).

    Returns:
        ``{"rc": exit code, "stats": the pass's JSON stats (None when it printed none), "stderr": its tail}``.
    """
    proc = fleet.archiver
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    final = subprocess.run([sys.executable, "-m", "runjournal", "archiver", "--until-caught-up", "--json"], env=env,
                           capture_output=True, text=True, timeout=900, check=False)
    try:
        stats = json.loads(final.stdout)
    except ValueError:
        stats = None
    return {"rc": final.returncode, "stats": stats, "stderr": final.stderr[-500:]}


def ingest_knowledge(settings: Settings, paths: list[Path]) -> list[dict[str, Any]]:
    """Ingest the knowledge documents before the fleet starts (the agents' contexts retrieve from them)."""
    if not paths:
        return []
    from runjournal.consumers.cognition import open_retriever

    reader = open_retriever(settings)
    try:
        return [reader.ingest(p) for p in paths]
    finally:
        reader.close()


class Approver:
    """Grants every pending approval (a thread of the demo process); Redis outages are waited out."""

    def __init__(self, settings: Settings) -> None:
        self.inbox = ApprovalInbox(redis_client.client(settings, socket_timeout=5), settings.topic_prefix)
        self.stop = threading.Event()
        self.granted = 0
        self.thread = threading.Thread(target=self._loop, name="demo-approver", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(0.2):
            try:
                for run_id, call_id in self.inbox.pending():
                    self.inbox.decide(run_id, call_id, granted=True, approver="demo-approver")
                    self.granted += 1
            except redis.RedisError as exc:
                log.warning("approver: Redis unavailable (%s)", exc)

    def close(self) -> None:
        """Stop the thread."""
        self.stop.set()
        self.thread.join(30)


def read_recoveries(path: Path, fleet: Fleet, started_wall: float) -> tuple[list[dict[str, Any]], list[str]]:
    """The recovery service's reports and errors (``runjournal.demo.recoverer``); each decided run is noted
    on the fleet's timeline at the time of its pass."""
    reports, errors = [], []
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a torn last line of a killed process
        t_s = round(entry["t"] - started_wall, 3)
        if "error" in entry:
            errors.append(entry["error"])
            continue
        reports.append({"t_s": t_s, **entry["report"]})
        for r in entry["report"]["runs"]:
            fleet.note_at(t_s, "recovery", r["run_id"], f"{r['action']} {r.get('previous_epoch')}→{r.get('epoch')} "
                          f"to {r.get('assigned_to')} {r['calls']}")
    return reports, errors


def contexts_summary(r: redis.Redis, keys: DemoKeys, per_run: dict[str, Any]) -> dict[str, Any]:
    """Counters of the agents' turn contexts, and one run's last context for the report: a recovered run
    with advice if there is one."""
    counts = {k.decode(): int(v) for k, v in r.hgetall(keys.contexts).items()}
    stored = {k.decode(): v for k, v in r.hgetall(keys.context).items()}
    recovered = {run_id for run_id, info in per_run.items() if info.get("epoch", 1) > 1}

    def rank(run_id: str) -> tuple[bool, int]:
        ctx = json.loads(stored[run_id])
        return run_id in recovered, len(ctx["memory"]) + len(ctx["knowledge"])

    example = json.loads(stored[max(sorted(stored), key=rank)]) if stored else None
    return {"contexts_built": counts.get("built", 0), "contexts_with_memory": counts.get("with_memory", 0),
            "contexts_with_knowledge": counts.get("with_knowledge", 0),
            "contexts_advice_unavailable": counts.get("advice_unavailable", 0),
            "contexts_facts_pending": counts.get("facts_pending", 0), "context_example": example}
