"""Fixtures for semantic search: an isolated cache, a recording embedder, a tiny repository."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

import pytest

from etude.search import HashingEmbedder, register_embedder
from etude.search import index as index_mod

_ids = itertools.count()


class RecordingEmbedder(HashingEmbedder):
    """The hashing embedder, remembering every batch of texts it was asked to embed."""

    def __init__(self) -> None:
        super().__init__(dim=128)
        self.id = f"recording/{next(_ids)}"  # a fresh id: nothing in any cache matches it
        self.calls: list[list[str]] = []

    def embed(self, texts, *, query=False):
        if not query:
            self.calls.append(list(texts))
        return super().embed(texts, query=query)

    @property
    def embedded(self) -> list[str]:
        return [t for batch in self.calls for t in batch]


@pytest.fixture(autouse=True)
def search_cache(tmp_path, monkeypatch):
    """Each test gets its own ETUDE_CACHE and a clean table of open indexes."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ETUDE_CACHE", str(cache))
    index_mod._open.clear()
    yield cache
    index_mod._open.clear()


@pytest.fixture
def recorder() -> RecordingEmbedder:
    emb = RecordingEmbedder()
    register_embedder("recording", lambda: emb)
    return emb


FILES = {
    "pkg/geometry.py": '''
        """Shapes and their areas."""
        import math


        def circle_area(radius):
            """Area of a circle."""
            return math.pi * radius ** 2


        class Rectangle:
            """An axis-aligned rectangle."""

            def __init__(self, width, height):
                self.width, self.height = width, height

            def area(self):
                return self.width * self.height
        ''',
    "pkg/text.py": '''
        def slugify(title):
            """Lower-case words joined by dashes, for URLs."""
            return "-".join(title.lower().split())


        def count_vowels(word):
            return sum(ch in "aeiou" for ch in word)
        ''',
    "README.md": "# pkg\n\nSmall helpers for shapes and text.\n",
}


def write_repo(root: Path, files: dict[str, str] = FILES) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


@pytest.fixture
def repo(tmp_path) -> Path:
    return write_repo(tmp_path / "repo")


@pytest.fixture
def make_repo():
    """write_repo(root, files=FILES) -> root."""
    return write_repo
