"""Problem statements: from a changelog entry when one matches, otherwise written from the failing
tests' names and failure messages.

The fallback never quotes the gold patch or the test source: it names the failing tests (as a user
reporting a bug would), humanises their names and gives the first line of each failure as pytest
printed it at base. A changelog entry is taken as written by the package's authors; it describes
the change (which is what an issue usually does) and may name the function involved.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]+")
_STOP = {"test", "tests", "py", "the", "and", "for", "with", "fix", "fixed", "when", "should", "that", "from", "this"}


def _tokens(text: str) -> set[str]:
    words = set()
    for w in _WORD.findall(text):
        for part in re.split(r"_|(?<=[a-z])(?=[A-Z])", w):
            p = part.lower()
            if len(p) > 2 and p not in _STOP:
                words.add(p)
    return words


def changelog_entries(changelog: str, version: str) -> list[str]:
    """The entries of `version` in a changelog: bullets under its heading, or — for "version
    history" lists such as "- 1.22.4 First change" with one change per indented line below — the
    text on its bullet and each continuation line. Empty when the version is not there."""
    lines = changelog.splitlines()
    return _bullet_style(lines, version) or _heading_style(lines, version)


def _bullet_style(lines: list[str], version: str) -> list[str]:
    head = re.compile(rf"^\s*[-*]\s+v?{re.escape(version)}(?![\d.])[\s:,-]*(.*)$")
    start = next((i for i, ln in enumerate(lines) if head.match(ln)), None)
    if start is None:
        return []
    first = head.match(lines[start])
    entries = [first.group(1).strip()] if first and first.group(1).strip() else []
    for ln in lines[start + 1 :]:
        if not ln.strip() or not ln.startswith((" ", "\t")) or re.match(r"^\s*[-*]\s+v?\d", ln):
            break
        entries.append(ln.strip())
    return entries


def _heading_style(lines: list[str], version: str) -> list[str]:
    ver = re.escape(version)
    start = next(
        (i for i, ln in enumerate(lines) if re.search(rf"(^|[^\d.]){ver}([^\d]|$)", ln) and len(ln) < 80), None
    )
    if start is None:
        return []
    section = []
    for ln in lines[start + 1 :]:
        if re.match(r"^\s*(#+\s*)?\[?v?\d+\.\d+(\.\d+)?\]?([\s(:-]|$)", ln):
            break  # the next version's heading
        section.append(ln)
    entries: list[str] = []
    for ln in section:
        if re.match(r"^\s*([-*+]|\d+\.)\s+", ln):
            entries.append(re.sub(r"^\s*([-*+]|\d+\.)\s+", "", ln).strip())
        elif entries and ln.startswith((" ", "\t")) and ln.strip():
            entries[-1] += " " + ln.strip()  # a wrapped bullet
    return [e for e in entries if e]


def match_entry(entries: Sequence[str], test_ids: Sequence[str], patch: str) -> str | None:
    """The entry sharing most words with the failing tests' names and the changed code."""
    changed = "\n".join(
        ln for ln in patch.splitlines() if ln.startswith(("+", "-", "@@")) and not ln.startswith(("+++", "---"))
    )
    keys = _tokens(" ".join(t.split("::", 1)[-1] for t in test_ids)) | _tokens(changed)
    best, best_score = None, 0
    for e in entries:
        score = len(_tokens(e) & keys)
        if score > best_score:
            best, best_score = e, score
    return best if best_score >= 2 else None


def humanise(test_id: str) -> str:
    name = test_id.split("::")[-1]
    name = re.sub(r"\[.*\]$", "", name)
    name = re.sub(r"^test_?", "", name)
    return name.replace("_", " ").strip() or name


def from_tests(package: str, f2p: Sequence[str], messages: dict[str, str], limit: int = 8) -> str:
    """A bug report written from what fails: the tests' names and their first failure line."""
    lines = [f"Some behaviour of `{package}` is wrong: the following tests fail and should pass.", ""]
    for t in list(f2p)[:limit]:
        msg = messages.get(t) or messages.get(t.split("::", 1)[0], "")
        detail = f" — {msg}" if msg else ""
        lines.append(f"- `{t}` ({humanise(t)}){detail}")
    if len(f2p) > limit:
        lines.append(f"- … and {len(f2p) - limit} more tests")
    lines += ["", "Fix the library code so that these tests pass without breaking the others. Do not change the tests."]
    return "\n".join(lines)


def release_statement(
    package: str, version: str, entry: str | None, f2p: Sequence[str], messages: dict[str, str]
) -> str:
    if entry:
        return (
            f"`{package}` needs the following change, released upstream in {version}:\n\n{entry}\n\n"
            "Make the library code behave this way; do not change the tests."
        )
    return from_tests(package, f2p, messages)
