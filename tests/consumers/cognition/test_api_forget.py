"""The read API's one delete route, ``POST /v1/memory/forget`` (issue 33: ``erase --tenant/--subject`` deletes an
owner's memory points through the running extractor): ids are checked at the boundary — a bad tenant or user id is
a 400 naming the rule and deletes nothing — and a missing token is a 401."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from runjournal.consumers.cognition import CognitionOwner
from runjournal.consumers.cognition.api import build_app
from runjournal.core.settings import Settings
from runjournal.testing import HashingEmbedder


@pytest.mark.parametrize(("body", "status", "error"), [
    ({"tenant_id": "acme", "user_id": 5}, 400, "InvalidIdError"),
    ({"tenant_id": "acme", "user_id": ""}, 400, "InvalidIdError"),
    ({"tenant_id": "", "user_id": "amy"}, 400, None),
    ({"user_id": "amy"}, 400, "KeyError"),
    ({"tenant_id": "acme", "user_id": "amy"}, 200, None),
    ({"tenant_id": "acme"}, 200, None),
])
def test_forget_checks_its_ids_before_deleting(tmp_path: Path, body: dict[str, object], status: int,
                                               error: str | None) -> None:
    settings = Settings(qdrant_path=tmp_path / "qdrant")
    owner = CognitionOwner.open(settings, HashingEmbedder(), serve=False)
    try:
        client = TestClient(build_app(owner.memory, owner.knowledge, token="t0k", path=str(tmp_path)))
        assert client.post("/v1/memory/forget", json=body).status_code == 401  # no token
        answer = client.post("/v1/memory/forget", json=body, headers={"Authorization": "Bearer t0k"})
        assert answer.status_code == status, answer.text
        if error is not None:
            assert answer.json()["error"] == error
        if status == 200:
            assert answer.json() == {"deleted": 0}
    finally:
        owner.close()
