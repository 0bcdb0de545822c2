"""The library names a missing Redis or broker within seconds, as the commands do (issue 35).

Old: ``Journal(settings, producer_id=...)`` and ``ApprovalInbox.from_settings(settings)`` with Redis down raised
redis-py's ``ConnectionError`` (a traceback through redis-py's internals, naming no setting); with the broker down a
Journal waited ~30 s and raised ``FatalProducerError … Broker transport failure``. Each case runs as a user's
program does: a subprocess whose uncaught error Python prints. Nothing listens on the free port each points at.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.deploy.procs import free_port

pytestmark = pytest.mark.integration

JOURNAL = "from runjournal import Journal, Settings\nJournal(Settings.load(), producer_id='lonely')\n"
INBOX = "from runjournal import ApprovalInbox, Settings\nApprovalInbox.from_settings(Settings.load())\n"


def program(env: dict[str, str], code: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False, stdin=subprocess.DEVNULL)
    return proc, time.monotonic() - started


def assert_named(proc: subprocess.CompletedProcess[str], setting: str) -> None:
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("runjournal.core.errors.StackUnavailableError: "), proc.stderr
    assert setting in last and "`runjournal stack up`" in last, last
    assert "site-packages/redis" not in proc.stderr and "redis.exceptions" not in proc.stderr, proc.stderr
    assert "direct cause" not in proc.stderr, proc.stderr  # one traceback: ours, not the client's as well


@pytest.mark.parametrize("code", [JOURNAL, INBOX], ids=["Journal", "ApprovalInbox.from_settings"])
def test_redis_down_is_named_within_seconds(service_env: dict[str, str], code: str) -> None:
    proc, elapsed = program({**service_env, "RUNJOURNAL_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}, code)
    assert_named(proc, "RUNJOURNAL_REDIS_URL")
    assert elapsed < 15, f"{elapsed:.1f} s to say Redis is missing"


def test_broker_down_is_named_within_seconds_and_leaves_no_live_instance(settings: Settings,
                                                                          service_env: dict[str, str]) -> None:
    proc, elapsed = program({**service_env, "RUNJOURNAL_BOOTSTRAP": f"127.0.0.1:{free_port()}"}, JOURNAL)
    assert_named(proc, "RUNJOURNAL_BOOTSTRAP")
    assert elapsed < 15, f"{elapsed:.1f} s to say the broker is missing (it was ~30 s)"
    lease = RedisKeys(settings.topic_prefix).lease("lonely")
    assert not redis_client.client(settings).exists(lease), "a Journal that failed to start left its lease behind"


def test_a_connect_timeout_must_be_positive(settings: Settings) -> None:
    from runjournal import ApprovalInbox, Journal

    with pytest.raises(ValueError, match="connect_timeout_s"):
        Journal(settings, producer_id="never", connect_timeout_s=0)
    with pytest.raises(ValueError, match="connect_timeout_s"):
        ApprovalInbox.from_settings(settings, connect_timeout_s=-1)
