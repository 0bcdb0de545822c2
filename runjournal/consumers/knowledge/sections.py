"""Markdown → sections → passages (pure; no I/O).

Headings are found with markdown-it-py (CommonMark), so a ``#`` inside a code fence is not a heading.
A section is a heading and the text under it up to the next heading of any level; its ``heading_path``
lists the headings above it (``("Airline Agent Policy", "Book flight")``). Text before the first heading
belongs to a section named after the document. Sections without text are dropped.

A section is embedded as passages, not whole: the embedder reads at most 256 WordPiece tokens, and a
long section (``Book flight`` is ~450 words) would lose its tail — the travel-insurance rule — to
truncation. Passages are the section's blocks (paragraphs, list items), each cut to at most
:data:`MAX_PASSAGE_WORDS` words, and each is embedded with its heading in front (``"Book flight: …"``),
so the heading's words count for every passage. Retrieval ranks sections by their best passage.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from markdown_it import MarkdownIt

__all__ = ["MAX_PASSAGE_WORDS", "Section", "passages", "split_markdown"]

#: Longest passage, in words (~1.3 WordPiece tokens per English word keeps it under the 256-token window).
MAX_PASSAGE_WORDS = 160
_BLOCKS = re.compile(r"\n\s*\n")


@dataclass(frozen=True, slots=True)
class Section:
    """One section of a Markdown document."""

    heading: str
    """Its heading's text (``Book flight``)."""
    heading_path: tuple[str, ...]
    """Headings from the top of the document down to this one."""
    level: int
    """Heading level, 1-6 (0: text before the first heading)."""
    text: str
    """The section's Markdown without its heading line, stripped."""
    ordinal: int
    """0 for the first section with this ``heading_path``, 1 for a second one … (keeps keys unique)."""

    @property
    def sha256(self) -> str:
        """sha256 (hex) of :attr:`text` encoded UTF-8: the section's content identity."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @property
    def key(self) -> str:
        """``heading / path#ordinal``: identifies the section within its document across versions.

        Injective on (heading_path, ordinal): a ``\\`` or ``/`` inside a heading is escaped (``\\\\``, ``\\/``), so the
        only unescaped ``/`` are the separators' and the parts split back — ``("In / out",)`` and ``("In", "out")``
        were one key before (docs/design/protocol.md § Identifiers and keys) — and the ordinal, after the last
        ``#``, is decimal. A heading with neither character keeps the key it always had.
        """
        return " / ".join(_escape_heading(h) for h in self.heading_path) + f"#{self.ordinal}"


def _escape_heading(heading: str) -> str:
    return heading.replace("\\", "\\\\").replace("/", "\\/") if ("/" in heading or "\\" in heading) else heading


def split_markdown(text: str, *, title: str = "") -> list[Section]:
    """The sections of Markdown ``text``, in document order (see the module docstring).

    Args:
        text: the document.
        title: name of the section holding text before the first heading (default: empty heading).

    Returns:
        Sections with non-empty text.
    """
    lines = text.splitlines(keepends=True)
    tokens = MarkdownIt("commonmark").parse(text)
    heads: list[tuple[int, int, str]] = []  # (first line, level, text)
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open" and tok.map is not None:
            heads.append((tok.map[0], int(tok.tag[1]), tokens[i + 1].content.strip()))
    out: list[Section] = []
    seen: dict[tuple[str, ...], int] = {}
    stack: list[tuple[int, str]] = []
    first = heads[0][0] if heads else len(lines)
    _add(out, seen, title, (title,) if title else (), 0, "".join(lines[:first]))
    for j, (line, level, heading) in enumerate(heads):
        end = heads[j + 1][0] if j + 1 < len(heads) else len(lines)
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, heading))
        _add(out, seen, heading, tuple(h for _, h in stack), level, "".join(lines[line + 1:end]))
    return out


def _add(out: list[Section], seen: dict[tuple[str, ...], int], heading: str, path: tuple[str, ...], level: int,
         body: str) -> None:
    text = body.strip()
    if not text:
        return
    ordinal = seen.get(path, 0)
    seen[path] = ordinal + 1
    out.append(Section(heading=heading, heading_path=path, level=level, text=text, ordinal=ordinal))


def passages(section: Section, *, max_words: int = MAX_PASSAGE_WORDS) -> list[str]:
    """The texts to embed for ``section``: each block, cut to ``max_words`` words, prefixed ``"<heading>: "``.

    Returns:
        At least one passage per section (in order).
    """
    out: list[str] = []
    for block in _BLOCKS.split(section.text):
        words = block.split()
        for start in range(0, len(words), max_words):
            out.append(f"{section.heading}: " + " ".join(words[start:start + max_words]))
    return out
