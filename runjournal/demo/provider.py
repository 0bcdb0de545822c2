"""The demo's side-effect provider: a separate process that executes side-effecting tools and keeps a ledger.

The ledger (SQLite, one row per execution) — not runjournal — is the witness of how many
times each effect ran. HTTP on 127.0.0.1 (stdlib server; JSON bodies):

* ``POST /execute`` ``{tool, args, idempotency_key, run_id, epoch, result}`` — executes: with
  idempotency ``on`` a key already in the ledger returns the stored result and adds no row;
  with ``off`` every request is a new execution. Returns ``{"result": …, "deduplicated": bool}``.
  Answers 409 ``fenced`` when ``epoch`` is below the highest epoch registered for the run.
* ``POST /lookup`` ``{idempotency_key, run_id, fence_epoch}`` — reconcile by key: first raises
  the run's registered epoch to ``fence_epoch`` (so a zombie's late request is refused from
  now on: a fencing token, docs/design/protocol.md § Zombies step 3), then answers
  ``{"executed": bool, "result": …}``. Both run under one lock, so no request slips between.
* ``GET /stats`` — ``{"executions", "distinct_keys", "duplicates": {key: count}, "per_tool": {…}}``.

Results are the trajectory's recorded results, errors included (``Error: …`` strings).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["LedgerServer", "ledger_by_run", "ledger_stats", "serve"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  idempotency_key TEXT NOT NULL, tool TEXT NOT NULL, run_id TEXT NOT NULL, epoch INTEGER NOT NULL,
  executed_at_ms INTEGER NOT NULL, result TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS executions_key ON executions (idempotency_key);
CREATE TABLE IF NOT EXISTS fences (run_id TEXT PRIMARY KEY, epoch INTEGER NOT NULL);
"""


class LedgerServer:
    """The ledger and its rules; :func:`serve` puts it behind HTTP.

    Args:
        db_path: SQLite file (created; WAL mode).
        idempotent: honour idempotency keys (``--provider-idempotency on``).
        latency_ms: time each execution takes, half before and half after the ledger write (ms),
            so a kill can land inside a call on either side of the effect.
    """

    def __init__(self, db_path: Path, *, idempotent: bool, latency_ms: float = 0.0) -> None:
        self.db = sqlite3.connect(str(db_path), check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(_SCHEMA)
        self.idempotent = idempotent
        self.latency_s = latency_ms / 1000.0
        self.lock = threading.Lock()

    def execute(self, req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Execute one request; returns ``(http_status, body)``."""
        if self.latency_s:
            time.sleep(self.latency_s / 2)
        key, run_id, epoch = req["idempotency_key"], req["run_id"], int(req.get("epoch", 0))
        with self.lock:
            fence = self.db.execute("SELECT epoch FROM fences WHERE run_id=?", (run_id,)).fetchone()
            if fence and epoch < fence[0]:
                return 409, {"error": "fenced", "epoch": epoch, "current_epoch": fence[0]}
            if self.idempotent:
                row = self.db.execute("SELECT result FROM executions WHERE idempotency_key=? LIMIT 1",
                                      (key,)).fetchone()
                if row:
                    return 200, {"result": row[0], "deduplicated": True}
            self.db.execute(
                "INSERT INTO executions (idempotency_key, tool, run_id, epoch, executed_at_ms, result) "
                "VALUES (?,?,?,?,?,?)", (key, req["tool"], run_id, epoch, int(time.time() * 1000), req["result"]))
        if self.latency_s:
            time.sleep(self.latency_s / 2)
        return 200, {"result": req["result"], "deduplicated": False}

    def lookup(self, req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Raise the run's fence to ``fence_epoch``, then report whether the key was executed."""
        run_id, fence_epoch = req["run_id"], int(req.get("fence_epoch", 0))
        with self.lock:
            self.db.execute("INSERT INTO fences (run_id, epoch) VALUES (?, ?) ON CONFLICT(run_id) "
                            "DO UPDATE SET epoch = MAX(epoch, excluded.epoch)", (run_id, fence_epoch))
            row = self.db.execute("SELECT result FROM executions WHERE idempotency_key=? LIMIT 1",
                                  (req["idempotency_key"],)).fetchone()
        return 200, {"executed": row is not None, "result": row[0] if row else None}

    def stats(self) -> dict[str, Any]:
        """Ledger totals (see module docstring)."""
        with self.lock:
            return ledger_stats(self.db)


def ledger_stats(db: sqlite3.Connection) -> dict[str, Any]:
    """Totals from a ledger connection: executions, distinct keys, keys executed more than once, per tool."""
    total = db.execute("SELECT COUNT(*) FROM executions").fetchone()[0]
    distinct = db.execute("SELECT COUNT(DISTINCT idempotency_key) FROM executions").fetchone()[0]
    dups = dict(db.execute("SELECT idempotency_key, COUNT(*) FROM executions GROUP BY idempotency_key "
                           "HAVING COUNT(*) > 1").fetchall())
    per_tool = dict(db.execute("SELECT tool, COUNT(*) FROM executions GROUP BY tool").fetchall())
    return {"executions": total, "distinct_keys": distinct, "duplicates": dups, "per_tool": per_tool}


def ledger_by_run(db: sqlite3.Connection) -> dict[str, dict[str, int]]:
    """Executions by the run that requested them (the ``run_id`` each request carried: a fork's own id for the
    effects it performed) and idempotency key: ``{run_id: {key: times executed}}``."""
    out: dict[str, dict[str, int]] = {}
    for run_id, key, count in db.execute("SELECT run_id, idempotency_key, COUNT(*) FROM executions "
                                         "GROUP BY run_id, idempotency_key"):
        out.setdefault(run_id, {})[key] = count
    return out


def _handler(ledger: LedgerServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            return

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/execute":
                self._reply(*ledger.execute(req))
            elif self.path == "/lookup":
                self._reply(*ledger.lookup(req))
            else:
                self._reply(404, {"error": "no such path"})

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/stats":
                self._reply(200, ledger.stats())
            else:
                self._reply(404 if self.path != "/health" else 200, {"ok": self.path == "/health"})

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client SIGKILLed mid-request (the demo's chaos) leaves a broken pipe: expected, not an error."""
        import sys

        if isinstance(sys.exc_info()[1], BrokenPipeError | ConnectionResetError):
            return
        super().handle_error(request, client_address)


def serve(db_path: Path, port: int, *, idempotent: bool, latency_ms: float = 0.0) -> None:
    """Run the provider on ``127.0.0.1:port`` until killed."""
    server = _Server(("127.0.0.1", port), _handler(LedgerServer(db_path, idempotent=idempotent,
                                                                             latency_ms=latency_ms)))
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    """``python -m runjournal.demo.provider --db PATH --port P --idempotency on|off [--latency-ms N]``."""
    import argparse

    ap = argparse.ArgumentParser(description="runjournal demo side-effect provider")
    ap.add_argument("--db", required=True, type=Path)
    ap.add_argument("--port", required=True, type=int)
    ap.add_argument("--idempotency", choices=["on", "off"], default="off")
    ap.add_argument("--latency-ms", type=float, default=0.0)
    args = ap.parse_args(argv)
    serve(args.db, args.port, idempotent=args.idempotency == "on", latency_ms=args.latency_ms)


if __name__ == "__main__":
    main()
