"""A LangGraph run in the console (issue 35): its graph's nodes, input and output on the run page and in
``/api/runs/{id}`` — read from the real projection and topic (``ConsoleData``), served by the console's app."""

from __future__ import annotations

import html
import uuid

import pytest

pytest.importorskip("langgraph")

from starlette.testclient import TestClient  # noqa: E402

from runjournal.console import ConsoleConfig, ConsoleData, build_app  # noqa: E402
from runjournal.console.app import path_segment  # noqa: E402
from runjournal.core.settings import Settings  # noqa: E402
from tests.support.graph_run import NODES, run_graph  # noqa: E402
from tests.support.provider import project  # noqa: E402

pytestmark = pytest.mark.integration


def test_a_langgraph_runs_page_and_api_list_its_graph_nodes(topics: Settings) -> None:
    run_id = f"lg-console-{uuid.uuid4().hex[:8]}"
    answer = run_graph(topics, run_id)
    project(topics)
    data = ConsoleData(topics)
    try:
        page = data.run(run_id, with_memory=False)
        assert page is not None
        assert {n["node_path"]: (n["status"], n["attempt"]) for n in page.nodes} == NODES
        client = TestClient(build_app(ConsoleConfig(topics), data=data))
        text = html.unescape(client.get(f"/runs/{path_segment(run_id)}").text)
        nodes = text[text.index('<section id="nodes">'):]
        nodes = nodes[:nodes.index("</section>")]
        for path, (status, attempt) in NODES.items():
            assert f'<td class="mono">{path}</td><td>{status}</td><td>{attempt}</td>' in nodes
        assert answer in text and '"thread_id": "' + run_id in text  # output and input on the page
        api = client.get(f"/api/runs/{path_segment(run_id)}").json()
    finally:
        data.close()
    assert {n["node_path"]: (n["status"], n["attempt"]) for n in api["nodes"]} == NODES
    assert api["input"] == {"thread_id": run_id} and api["output"] == {"answer": answer}
    assert api["status"] == "SUCCEEDED" and api["behind"] == 0 and api["behind_note"] is None
