"""Chunking by syntax: functions, classes and methods as units; windows otherwise."""

from __future__ import annotations

import textwrap

from etude.search.chunking import WINDOW_LINES, chunk_file

SRC = textwrap.dedent(
    '''
    """Module docstring."""
    import os

    CONSTANT = 1


    @decorator
    def top(a, b):
        """Adds."""
        def inner():
            return 1
        return a + b


    class Outer(Base):
        """Doc of Outer."""
        x = 1

        def method(self):
            return self.x

        class Inner:
            async def deep(self):
                pass
    '''
).lstrip("\n")


def by_symbol(chunks):
    return {c.symbol: c for c in chunks if c.symbol}


def test_python_units_have_symbols_spans_and_kinds():
    chunks = chunk_file("pkg/mod.py", SRC.encode())
    syms = by_symbol(chunks)
    assert set(syms) == {"top", "Outer", "Outer.method", "Outer.Inner", "Outer.Inner.deep"}
    top = syms["top"]
    assert (top.kind, top.start_line, top.end_line) == ("function", 7, 12)  # the decorator line is included
    assert top.text.startswith("@decorator\ndef top(a, b):") and "def inner" in top.text  # nested def stays inside
    assert syms["Outer.method"].kind == "method"
    assert (syms["Outer.method"].start_line, syms["Outer.method"].end_line) == (19, 20)
    assert syms["Outer.Inner.deep"].kind == "method"
    outer = syms["Outer"]
    assert outer.kind == "class" and (outer.start_line, outer.end_line) == (15, 24)
    assert "Doc of Outer" in outer.text and "members: method, Inner" in outer.text
    assert "return self.x" not in outer.text  # method bodies are the methods' chunks
    assert all(c.path == "pkg/mod.py" for c in chunks)


def test_module_level_code_becomes_module_chunks():
    chunks = chunk_file("m.py", SRC.encode())
    mods = [c for c in chunks if c.kind == "module"]
    assert len(mods) == 1
    assert (mods[0].start_line, mods[0].end_line) == (1, 4)  # blank lines trimmed
    assert "import os" in mods[0].text and "CONSTANT" in mods[0].text


def test_syntax_error_falls_back_to_windows():
    src = "def ok():\n    return 1\n\ndef broken(:\n    pass\n"
    chunks = chunk_file("bad.py", src.encode())
    assert [c.kind for c in chunks] == ["window"]
    assert (chunks[0].start_line, chunks[0].end_line, chunks[0].symbol) == (1, 5, "")


def test_other_files_are_overlapping_windows_without_blank_ones():
    lines = [f"line {i}" for i in range(1, 101)] + ["", "", ""]
    chunks = chunk_file("notes.md", "\n".join(lines).encode())
    assert all(c.kind == "window" for c in chunks)
    assert chunks[0].start_line == 1 and chunks[0].end_line == WINDOW_LINES
    assert chunks[1].start_line < chunks[0].end_line  # overlap
    assert chunks[-1].end_line == 100  # trailing blank lines dropped
    covered = set()
    for c in chunks:
        covered.update(range(c.start_line, c.end_line + 1))
    assert covered == set(range(1, 101))


def test_never_raises_on_odd_bytes():
    assert chunk_file("empty.py", b"") == []
    assert chunk_file("blank.txt", b"\n\n  \n") == []
    chunks = chunk_file("latin.py", b"def f():\n    return '\xe9\xff'\n")
    assert chunks and chunks[0].symbol == "f"
