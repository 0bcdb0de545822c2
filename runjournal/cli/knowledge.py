"""``runjournal knowledge ingest|search|stats``: the shared knowledge corpus (advisory evidence, never execution state).

Every command works while another process (the memory extractor, ``runjournal memory serve``) owns the
embedded Qdrant directory: it goes through that process's read API (``runjournal.consumers.cognition``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from runjournal.cli._advisory import console, guarded, human_lines

__all__ = ["knowledge_app"]

knowledge_app = typer.Typer(name="knowledge", no_args_is_help=True,
                            help="The shared knowledge corpus: ingest Markdown, search evidence with provenance.")


@knowledge_app.command("ingest")
def ingest_command(
    paths: Annotated[list[Path], typer.Argument(help="Markdown documents to ingest (split by section).")],
    corpus: Annotated[str, typer.Option("--corpus", help="Corpus name.")] = "default",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Ingest documents: unchanged sections change nothing; a changed section supersedes the old one."""
    from runjournal.consumers.cognition import open_retriever
    from runjournal.core.settings import Settings

    reader = open_retriever(Settings.load())
    reports = []
    try:
        for path in paths:
            report = guarded(lambda p=path: reader.ingest(p, corpus=corpus), as_json=as_json)
            reports.append(report)
            if not as_json:
                console.print(f"{report['path']} ({report['document_version']}): {report['sections']} sections — "
                              f"{report['added']} added, {report['changed']} changed, {report['removed']} removed, "
                              f"{report['unchanged']} unchanged; {report['passages_written']} passages written")
    finally:
        reader.close()
    if as_json:
        print(json.dumps({"documents": reports}))


@knowledge_app.command("search")
def search_command(
    query: Annotated[str, typer.Argument(help="What to look for (free text).")],
    corpus: Annotated[str | None, typer.Option("--corpus", help="Only this corpus.")] = None,
    document: Annotated[Path | None, typer.Option("--document", help="Only this document.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Maximum sections.")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Search the corpus: sections ranked by their best passage, each with path, section and sha256."""
    from runjournal.cli._errors import fail
    from runjournal.consumers.cognition import open_retriever
    from runjournal.core.settings import Settings
    from runjournal.stores import KnowledgeScope

    scope = guarded(lambda: KnowledgeScope(corpus=corpus, document=str(document.resolve()) if document else None),
                    as_json=as_json)
    reader = open_retriever(Settings.load())
    try:
        found = guarded(lambda: reader.retrieve(query, scope, limit=limit), as_json=as_json)
        corpora = guarded(reader.stats, as_json=as_json).get("corpora") if not found and corpus else None
    finally:
        reader.close()
    if corpora is not None and corpus not in corpora:  # nothing found because the corpus does not exist: say so
        raise fail(f"no corpus {corpus!r} (corpora: {', '.join(corpora) or 'none yet'}; ingest into one with "
                   "`runjournal knowledge ingest PATH --corpus NAME`)", as_json=as_json, kind="UnknownCorpus")
    if as_json:
        print(json.dumps({"query": query, "evidence": [e.as_dict() for e in found]}))
        return
    for e in found:
        print(f"{e.score:.3f}  {e.section}  {e.text[:160]}\n       {e.path} sha256:{e.content_sha256[:16]} "
              f"{e.document_version} ingested {e.ingested_at}")
    if not found:
        console.print("no knowledge found (ingest documents with `runjournal knowledge ingest PATH`)")


@knowledge_app.command("stats")
def stats_command(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Collection, embedder, passage counts by status and the documents ingested."""
    from runjournal.consumers.cognition import open_retriever
    from runjournal.core.settings import Settings

    reader = open_retriever(Settings.load())
    try:
        out = guarded(reader.stats, as_json=as_json)
    finally:
        reader.close()
    print(json.dumps(out) if as_json else human_lines(out, units={"documents": "active sections",
                                                                  "corpora": "active passages"}))
