"""``runjournal query`` (issue 30): DuckDB over the archive and the live projection, on the real broker and Redis and
a local folder — the documented example queries (docs/guide/archive.md § Query) count calls across both sides,
``--json`` / ``--csv`` print the same rows, bad SQL is a named error."""

from __future__ import annotations

import csv
import io
import json
import os
import random
import re
import subprocess
import sys
import uuid
from datetime import date, timedelta
from pathlib import Path

import pytest

from runjournal.consumers.archive import QueryError, archive_run, query
from runjournal.consumers.archive.sql import EXAMPLES
from runjournal.core.settings import Settings
from runjournal.schemas import Event, EventType
from tests.support.provider import project
from tests.support.workload import _BASE, publish, run_events

pytestmark = [pytest.mark.integration]

T = EventType
GUIDE = Path(__file__).resolve().parents[3] / "docs" / "guide" / "archive.md"


def documented_queries() -> list[str]:
    """The ```sql blocks of the guide's Query section, in order (the texts of ``EXAMPLES``, which the console runs)."""
    section = GUIDE.read_text().split("## Query", 1)[1]
    found = [" ".join(block.split()) for block in re.findall(r"```sql\n(.*?)```", section, re.S)]
    assert found == list(EXAMPLES.values()), "the guide shows the queries the console runs"
    return found


def resumed_run(run_id: str, *, tenant: str, reconcile: str | None, finish: bool) -> list[Event]:
    """A run whose ``charge_card`` call was intended at epoch 1, then taken over (RUN_RESUMED, epoch 2): the call's
    outcome is unknown; ``reconcile`` settles it (TOOL_CALL_RECONCILED with that outcome). Plus one committed
    ``send_email`` at epoch 2."""
    rng = random.Random(run_id)
    seq = 0

    def ev(etype: EventType, payload: dict, epoch: int, node: str | None = "main") -> Event:
        nonlocal seq
        seq += 1
        return Event(event_id=str(uuid.UUID(int=rng.getrandbits(128))), run_id=run_id, tenant_id=tenant, seq=seq,
                     epoch=epoch, producer_id=f"agent-{epoch}", type=etype,
                     occurred_at=_BASE + timedelta(milliseconds=seq), payload=payload, node_id=node)

    charge = {"call_id": "c0", "tool": "charge_card", "idempotency_key": f"{run_id}-k0", "args_digest": "a0"}
    email = {"call_id": "c1", "tool": "send_email", "idempotency_key": f"{run_id}-k1", "args_digest": "a1"}
    intent = {"side_effect": True, "attempt": 1, "timeout_ms": 1000, "args_json": "{}"}
    out = [ev(T.RUN_STARTED, {"agent": "billing", "input_json": "{}"}, 1, None),
           ev(T.NODE_STARTED, {"node_path": "main", "attempt": 1}, 1),
           ev(T.TOOL_CALL_INTENDED, {**charge, **intent}, 1),
           ev(T.RUN_RESUMED, {"previous_epoch": 1, "recovered_by": "recovery", "plan_json": "{}"}, 2, None)]
    if reconcile is not None:
        out.append(ev(T.TOOL_CALL_RECONCILED, {**charge, "outcome": reconcile}, 2))
    out += [ev(T.TOOL_CALL_INTENDED, {**email, **intent}, 2),
            ev(T.TOOL_CALL_COMMITTED, {**email, "result_digest": "r1"}, 2)]
    if finish:
        out += [ev(T.NODE_SUCCEEDED, {"node_path": "main"}, 2), ev(T.RUN_SUCCEEDED, {"output_json": '"ok"'}, 2, None)]
    return out


@pytest.fixture
def journal(topics: Settings, tmp_path: Path) -> Settings:
    """Four runs: two archived (acme's two bookings; beta's reconciled charge), two live (beta's charge still
    unknown; acme's one booking)."""
    settings = topics.model_copy(update={"archive_url": (tmp_path / "archive").as_uri()})
    publish(settings, [*run_events("q-book-2", calls=2),
                       *resumed_run("q-charge-ok", tenant="beta", reconcile="COMMITTED", finish=True),
                       *resumed_run("q-charge-open", tenant="beta", reconcile=None, finish=False),
                       *run_events("q-book-1", calls=1)])
    project(settings)
    for run_id in ("q-book-2", "q-charge-ok"):
        archive_run(settings, run_id)
    return settings


def test_the_documented_queries_count_calls_over_the_archive_and_the_live_projection(journal: Settings) -> None:
    unknown, reconciles, effects = documented_queries()
    day = date(2026, 1, 1)
    assert query(journal, unknown) == (["tool", "unknown"], [("charge_card", 1)])  # the live run's, left open
    assert query(journal, reconciles) == (["provider", "reconciled_outcome", "reconciles"],
                                          [("charge_card", "COMMITTED", 1)])  # the archived run's
    assert query(journal, effects) == (["tenant_id", "day", "effects"], [("acme", day, 3), ("beta", day, 3)])
    assert query(journal, effects, live=False)[1] == [("acme", day, 2), ("beta", day, 2)]
    assert query(journal, effects, archive=False)[1] == [("acme", day, 1), ("beta", day, 1)]

    _, runs = query(journal, "SELECT run_id, status, location, calls, outcome_unknown, reconciled, "
                             "archived_url IS NOT NULL FROM runs ORDER BY run_id")
    assert runs == [("q-book-1", "SUCCEEDED", "live", 1, 0, 0, False),
                    ("q-book-2", "SUCCEEDED", "archive", 2, 0, 0, True),
                    ("q-charge-ok", "SUCCEEDED", "archive", 2, 0, 1, True),
                    ("q-charge-open", "RUNNING", "live", 2, 1, 0, False)]
    _, events = query(journal, "SELECT run_id, count(*), min(seq), max(seq), count(DISTINCT location) FROM events "
                               "GROUP BY run_id ORDER BY run_id")
    assert events == [("q-book-2", 9, 1, 9, 1),
                      ("q-charge-ok", 9, 1, 9, 1)], "events: archived runs only"
    assert query(journal, "DROP TABLE calls")[1] == []
    assert query(journal, "SELECT count(*) FROM calls")[1] == [(7,)], "a statement changes its own copy only"
    with pytest.raises(QueryError, match="no_such_table"):
        query(journal, "SELECT * FROM no_such_table")


def test_the_cli_prints_json_csv_and_a_table_and_names_bad_sql(journal: Settings, service_env: dict[str, str]) -> None:
    env = {**service_env, "RUNJOURNAL_ARCHIVE_URL": journal.effective_archive_url}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "runjournal", *args], env=env, capture_output=True, text=True,
                              timeout=180, check=False, cwd=os.getcwd())

    unknown, _reconciles, effects = documented_queries()
    out = cli("query", effects, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{"tenant_id": "acme", "day": "2026-01-01", "effects": 3},
                                      {"tenant_id": "beta", "day": "2026-01-01", "effects": 3}]
    out = cli("query", effects, "--csv", "--no-live")
    assert out.returncode == 0, out.stderr
    assert list(csv.reader(io.StringIO(out.stdout))) == [["tenant_id", "day", "effects"], ["acme", "2026-01-01", "2"],
                                                         ["beta", "2026-01-01", "2"]]
    out = cli("query", unknown, "--no-archive")
    assert out.returncode == 0, out.stderr
    assert "charge_card" in out.stdout and "1 row(s)" in out.stdout
    bad = cli("query", "SELEC nonsense", "--json")
    assert bad.returncode == 1
    doc = json.loads(bad.stderr.strip().splitlines()[-1])
    assert doc["error"] == "QueryError" and "syntax error" in doc["message"].lower()
    assert cli("query", "SELECT 1", "--json", "--csv").returncode == 2


def test_the_console_counts_page_shows_the_counts_query_prints(journal: Settings) -> None:
    from starlette.testclient import TestClient

    from runjournal.console.app import ConsoleConfig, build_app

    client = TestClient(build_app(ConsoleConfig(journal)))
    counts = client.get("/api/counts")
    assert counts.status_code == 200, counts.text
    shown = counts.json()
    assert list(shown) == list(EXAMPLES)
    for title, sql in EXAMPLES.items():
        columns, rows = query(journal, sql)
        assert shown[title] == {"columns": columns,
                                "rows": [[v.isoformat() if isinstance(v, date) else v for v in r] for r in rows]}
    assert shown["effects per tenant per day"]["rows"] == [["acme", "2026-01-01", 3], ["beta", "2026-01-01", 3]]
    page = client.get("/counts")
    assert page.status_code == 200 and "charge_card" in page.text and "effects per tenant per day" in page.text
