"""The local stack's object store against a real S3Proxy (Maven Central), no mocks: a private stack on free ports
starts it, the archive's filesystem writes, lists, reads and deletes through its S3 API, the objects are files
under its data folder, ``stack up`` again leaves it alone, ``stack down`` stops it, a taken port is named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runjournal.core.settings import Settings, default_cache_dir
from runjournal.deploy.errors import StackError
from runjournal.deploy.object_store import ARCHIVE_BUCKET, up_object_store
from runjournal.deploy.procs import Proc, free_port
from runjournal.deploy.stack import Stack, StackPorts
from runjournal.stores.object_store import filesystem

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(os.environ.get("RUNJOURNAL_BOOTSTRAP")), reason="services are given; launcher not used"),
]


def _env(stack_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    return {**env, "RUNJOURNAL_STACK_DIR": str(stack_dir), "RUNJOURNAL_CACHE_DIR": str(default_cache_dir())}


def _cli(stack_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runjournal", *args], env=_env(stack_dir), capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A private stack with an object store, stopped at the end whatever happened."""
    ports = StackPorts(kafka=free_port(), controller=free_port(), redis=free_port(), registry=free_port(),
                       object_store=free_port())
    stack = Stack(tmp_path_factory.mktemp("s3") / "stack", default_cache_dir(), ports=ports)
    try:
        yield stack
    finally:
        stack.down(grace_s=10)


def test_stack_up_starts_s3proxy_and_the_archive_round_trips_through_it(stack: Stack) -> None:
    report = stack.up(object_store=True)
    started = report["object_store"]
    assert started["action"] == "started" and started["url"] == f"http://127.0.0.1:{stack.ports.object_store}"
    state = stack.read_state()["object_store"]
    assert state["identity"] and state["credential"]
    assert state["credential"] not in json.dumps(report), "the secret key is never in a report"
    assert oct(stack.state_path.stat().st_mode & 0o777) == "0o600"

    health = stack.status()["object_store"]
    assert health["healthy"] and health["pid"] == started["pid"]
    assert state["credential"] not in json.dumps(health)

    settings = Settings.load(stack_dir=stack.stack_dir)  # filled from stack.json like the broker's address
    assert settings.archive_url == f"s3://{ARCHIVE_BUCKET}/{settings.topic_prefix}"
    assert settings.object_store_endpoint == started["url"] and settings.object_store_key == state["identity"]
    assert settings.masked()["object_store_secret"] == "***" and state["credential"] not in repr(settings)

    fs, root = filesystem(settings)
    assert root == f"{ARCHIVE_BUCKET}/{settings.topic_prefix}"
    name = f"{root}/runs/{uuid.uuid4().hex}.parquet"
    with fs.open(name, "wb") as out:
        out.write(b"PAR1 not really")
    assert fs.ls(f"{root}/runs", detail=False) == [name]
    with fs.open(name, "rb") as back:
        assert back.read() == b"PAR1 not really"
    on_disk = Path(state["data"]) / name  # the filesystem backend: bucket = folder, object = file
    assert on_disk.read_bytes() == b"PAR1 not really"
    fs.rm(name)
    assert not on_disk.exists()
    fs.invalidate_cache()
    assert not fs.exists(name)


def test_stack_up_again_leaves_it_running_and_the_cli_shows_it(stack: Stack) -> None:
    pid = stack.read_state()["object_store"]["process"]["pid"]
    assert stack.up(object_store=True)["object_store"] == {
        "action": "already running", "url": f"http://127.0.0.1:{stack.ports.object_store}", "pid": pid,
        "bucket": ARCHIVE_BUCKET}
    ports = stack.ports
    up = _cli(stack.stack_dir, "stack", "up", "--json", "--kafka-port", str(ports.kafka), "--controller-port",
              str(ports.controller), "--redis-port", str(ports.redis), "--object-store", "--object-store-port",
              str(ports.object_store))
    assert up.returncode == 0, up.stderr
    assert json.loads(up.stdout)["object_store"]["action"] == "already running"
    status = _cli(stack.stack_dir, "stack", "status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    assert json.loads(status.stdout)["object_store"]["healthy"] is True
    text = _cli(stack.stack_dir, "stack", "status").stdout
    assert "object_store" in text and stack.read_state()["object_store"]["credential"] not in text + status.stdout
    settings = json.loads(_cli(stack.stack_dir, "settings").stdout)
    assert settings["archive_url"] == f"s3://{ARCHIVE_BUCKET}/runjournal" and settings["object_store_secret"] == "***"


def test_a_taken_port_is_named(stack: Stack, tmp_path: Path) -> None:
    with pytest.raises(StackError, match="--object-store-port"):
        up_object_store({}, tmp_path / "other", default_cache_dir(), stack.ports.object_store, timeout_s=30)


def test_stack_down_stops_it(stack: Stack) -> None:
    proc = Proc.from_json(stack.read_state()["object_store"]["process"])
    assert proc is not None and proc.alive()
    assert stack.down(grace_s=10)["object_store"] == "stopped"
    assert not proc.alive()
    assert "object_store" not in stack.status()
    assert Settings.load(stack_dir=stack.stack_dir).archive_url is None  # back to the local folder
    assert stack.down()["object_store"] == "not running"
