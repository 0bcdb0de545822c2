"""The knowledge Retriever: Markdown sections with provenance, idempotent ingest, supersession, ranking.

Embedded Qdrant in tmp paths (no broker needed). The ranking tests use the real offline MiniLM model and
the corpus the trajectories' agents followed, read from ``../shared/data/knowledge/`` (never copied into the
repository); its SOURCE.md lists questions with the section that answers them — each must rank first.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from qdrant_client import QdrantClient

from runjournal.consumers.knowledge import QdrantKnowledgeBase, passages, split_markdown
from runjournal.consumers.knowledge.errors import DocumentError
from runjournal.consumers.vectors.embed import MiniLMEmbedder
from runjournal.stores import KnowledgeScope, Retriever, Scope, ScopeError
from runjournal.testing import HashingEmbedder

KNOWLEDGE = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "knowledge"
POLICY = KNOWLEDGE / "tau-bench-airline-policy.md"
BIN = Path(__file__).resolve().parents[3] / ".venv" / "bin" / "runjournal"


def source_questions() -> list[tuple[str, str]]:
    """``(section, question)`` pairs from SOURCE.md's list (``- "Section" → fact; fact.``), one per fact."""
    pairs = []
    for section, facts in re.findall(r'^- "([^"]+)" → (.+)$', (KNOWLEDGE / "SOURCE.md").read_text(), re.M):
        pairs += [(section, fact.strip(" .")) for fact in facts.split(";")]
    return pairs


def snapshot(kb: QdrantKnowledgeBase) -> dict[str, tuple[dict, list[float]]]:
    points, _ = kb.client.scroll(kb.collection, limit=100_000, with_payload=True, with_vectors=True)
    return {str(p.id): (p.payload, p.vector) for p in points}


@pytest.fixture
def kb(tmp_path: Path) -> QdrantKnowledgeBase:
    base = QdrantKnowledgeBase(QdrantClient(path=str(tmp_path / "qdrant")), HashingEmbedder(), prefix="t",
                               mode="local")
    yield base
    base.close()


def test_a_file_that_is_not_utf8_is_named_with_the_fix(kb: QdrantKnowledgeBase, tmp_path: Path) -> None:
    """Issue 35 case 5: a Latin-1 file failed with the codec's own message."""
    latin = tmp_path / "policy.md"
    latin.write_bytes("# Politique\n\nCaf\u00e9 compris.\n".encode("latin-1"))
    with pytest.raises(DocumentError) as info:
        kb.ingest(latin)
    message = str(info.value)
    assert "is not UTF-8 text" in message and "byte 0xe9" in message and "iconv -f latin1 -t utf-8" in message


# -- sections ---------------------------------------------------------------------------------------
def test_markdown_is_split_by_section_with_heading_paths() -> None:
    doc = ("intro line\n\n# Policy\n\nTop text.\n\n## Book\n\n- a rule\n\n```\n# not a heading\n```\n\n"
           "## Empty\n\n### Deep\n\ndeep text\n\n## Book\n\nsecond book\n")
    sections = split_markdown(doc, title="doc")
    assert [(s.heading_path, s.ordinal) for s in sections] == [
        (("doc",), 0), (("Policy",), 0), (("Policy", "Book"), 0), (("Policy", "Empty", "Deep"), 0),
        (("Policy", "Book"), 1)]
    assert "# not a heading" in sections[2].text  # a '#' inside a code fence is text
    assert sections[2].sha256 == hashlib.sha256(sections[2].text.encode()).hexdigest()
    assert len({s.key for s in sections}) == len(sections)


def test_a_long_section_becomes_passages_that_each_carry_the_heading() -> None:
    (book,) = [s for s in split_markdown(POLICY.read_text()) if s.heading == "Book flight"]
    ps = passages(book, max_words=40)
    assert all(p.startswith("Book flight: ") and len(p.split()) <= 42 for p in ps)
    assert any("travel insurance" in p for p in ps)  # the tail of the section is not lost to truncation


# -- ingest -------------------------------------------------------------------------------------------
def test_reingesting_an_unchanged_document_changes_nothing(kb: QdrantKnowledgeBase) -> None:
    first = kb.ingest(POLICY)
    assert (first.sections, first.added, first.unchanged) == (6, 6, 0) and first.passages_written > 6
    before = snapshot(kb)
    again = kb.ingest(POLICY)
    assert (again.added, again.changed, again.removed, again.unchanged, again.passages_written) == (0, 0, 0, 6, 0)
    assert snapshot(kb) == before  # ids, payloads (ingested_at included) and vectors


def test_a_changed_section_supersedes_the_old_one_and_a_removed_one_retires(kb: QdrantKnowledgeBase,
                                                                           tmp_path: Path) -> None:
    doc = tmp_path / "policy.md"
    shutil.copy(POLICY, doc)
    kb.ingest(doc)
    [old] = [e for e in kb.retrieve("travel insurance price", limit=6) if e.section == "Book flight"]
    text = doc.read_text().replace("which is 30 dollars per passenger", "which is 35 dollars per passenger")
    text = text[:text.index("## Refund")]  # the Refund section is gone
    doc.write_text(text)
    report = kb.ingest(doc)
    assert (report.changed, report.removed, report.added, report.unchanged) == (1, 1, 0, 4)
    found = kb.retrieve("travel insurance price", limit=6)
    [new] = [e for e in found if e.section == "Book flight"]
    assert "35 dollars" in new.section_text and "30 dollars" not in new.section_text
    assert new.content_sha256 != old.content_sha256 and new.document_version != old.document_version
    assert "Refund" not in {e.section for e in found}
    points = snapshot(kb).values()
    superseded = [p for p, _ in points if p["status"] == "superseded"]
    assert {p["section"] for p in superseded} == {"Book flight", "Refund"}
    assert {p["superseded_by"] for p in superseded if p["section"] == "Book flight"} == {new.content_sha256}
    assert {p.get("superseded_by") for p in superseded if p["section"] == "Refund"} == {None}
    assert all(p["valid_until"] for p in superseded)


def test_evidence_carries_its_provenance_and_no_tenant(kb: QdrantKnowledgeBase) -> None:
    kb.ingest(POLICY)
    assert isinstance(kb, Retriever)
    sections = {s.heading: s for s in split_markdown(POLICY.read_text())}
    for e in kb.retrieve("cancel a reservation", KnowledgeScope(corpus="default"), limit=6):
        assert e.path == str(POLICY.resolve()) and e.authority == "advisory"
        assert e.content_sha256 == sections[e.section].sha256  # the exact content quoted
        assert e.document_version == "sha256:" + hashlib.sha256(POLICY.read_bytes()).hexdigest()[:16]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", e.ingested_at)
    assert not any("scope" in p or "tenant_id" in p for p, _ in snapshot(kb).values())
    assert kb.retrieve("cancel", KnowledgeScope(corpus="another")) == []
    with pytest.raises(ScopeError):
        kb.retrieve("cancel", Scope("acme"))  # type: ignore[arg-type]  # knowledge is never tenant-scoped


# -- ranking with the real model --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def minilm_kb(tmp_path_factory: pytest.TempPathFactory) -> QdrantKnowledgeBase:
    base = QdrantKnowledgeBase(QdrantClient(path=str(tmp_path_factory.mktemp("qdrant"))), MiniLMEmbedder(),
                               prefix="t", mode="local")
    base.ingest(POLICY)
    yield base
    base.close()


@pytest.mark.parametrize(("section", "question"), source_questions())
def test_each_source_question_ranks_its_section_first(minilm_kb: QdrantKnowledgeBase, section: str,
                                                      question: str) -> None:
    found = minilm_kb.retrieve(question)
    assert found[0].section == section, [(e.section, round(e.score, 3)) for e in found]


def test_source_md_lists_the_questions() -> None:
    assert len(source_questions()) >= 5 and {s for s, _ in source_questions()} >= {"Book flight", "Refund"}


@pytest.mark.slow
def test_cli_ingest_then_search_puts_book_flight_first(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNJOURNAL_")}
    env.update(RUNJOURNAL_STACK_DIR=str(tmp_path / "stack"), RUNJOURNAL_QDRANT_PATH=str(tmp_path / "qdrant"))
    done = subprocess.run([str(BIN), "knowledge", "ingest", str(POLICY), "--json"], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    assert json.loads(done.stdout)["documents"][0]["added"] == 6
    out = subprocess.run([str(BIN), "knowledge", "search", "how much does travel insurance cost", "--json"], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    top = json.loads(out.stdout)["evidence"][0]  # --json: one JSON document on stdout
    assert top["section"] == "Book flight" and top["path"] == str(POLICY.resolve())
    assert re.fullmatch(r"[0-9a-f]{64}", top["content_sha256"]) and "30 dollars per passenger" in top["section_text"]
    again = subprocess.run([str(BIN), "knowledge", "ingest", str(POLICY), "--json"], env=env, capture_output=True,
                           text=True, timeout=120, check=True)
    assert json.loads(again.stdout)["documents"][0]["unchanged"] == 6
    unknown = subprocess.run([str(BIN), "knowledge", "search", "insurance", "--corpus", "nope", "--json"], env=env,
                             capture_output=True, text=True, timeout=120)  # issue 35: not "no knowledge found"
    error = json.loads(unknown.stderr.strip().splitlines()[-1])
    assert unknown.returncode == 1 and unknown.stdout == "" and error["error"] == "UnknownCorpus", unknown.stderr
    assert "no corpus 'nope' (corpora: default;" in error["message"]
    missing = subprocess.run([str(BIN), "knowledge", "ingest", str(tmp_path / "nope.md"), "--json"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and json.loads(missing.stderr)["error"] == "DocumentError"
