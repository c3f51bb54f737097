"""A docs table that says it quotes a result file holds only numbers that file holds (issue 45 item
2): every number in a row of the table under docs/specialise.md's "Measured (`bench/results/
specialise_time.json`" heading is a value of that row's repository in the file (one of its shipped
adapter's figures or its split's counts, as a proportion or in percent, at the precision written)
or a date the file records."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NUMBER = re.compile(r"(?<![\w.])[−+-]?\d+(?:\.\d+)?(?![\w-])")


def _values(x, out: list[float]) -> list[float]:
    if isinstance(x, bool):
        return out
    if isinstance(x, (int, float)):
        out.append(float(x))
    elif isinstance(x, dict):
        for v in x.values():
            _values(v, out)
    elif isinstance(x, list):
        for v in x:
            _values(v, out)
    return out


def _table(doc: str, heading: str) -> list[str]:
    section = doc.split(heading, 1)[1]
    lines = section.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    table = []
    for ln in lines[start:]:
        if not ln.startswith("|"):
            break
        table.append(ln)
    return table[2:]  # without the header and its rule


def _matches(text: str, values: list[float], percent: bool = False) -> bool:
    """`text` (a number as written, sign aside) is some value rounded to the places written; with
    `percent` (written with % or "points"), that value times 100."""
    x = abs(float(text.replace("−", "-")))
    places = len(text.split(".", 1)[1]) if "." in text else 0
    return any(round(100 * abs(v) if percent else abs(v), places) == round(x, places) for v in values)


def test_the_time_split_table_quotes_only_its_file():
    doc = (ROOT / "docs" / "specialise.md").read_text()
    data = json.loads((ROOT / "bench" / "results" / "specialise_time.json").read_text())
    dates = json.dumps(data["meta"])
    rows = _table(doc, "### Measured (`bench/results/specialise_time.json`")
    assert len(rows) == 3
    bad = []
    for row in rows:
        repo = row.split("|")[1].strip().split(" (")[0]  # each row quotes its repository's figures only
        values = _values({k: v for k, v in data["figures"].items() if k.startswith(f"{repo}.")}, [])
        values += _values(data["meta"]["repos"][repo][repo], [])
        text = re.sub(r"\d{4}-\d{2}-\d{2}", "", row)  # dates are checked below
        for m in NUMBER.finditer(text):
            t, after = m.group(0), text[m.end():m.end() + 8]
            if not _matches(t, values, percent=after.startswith(("%", " points"))):
                bad.append(t)
    assert not bad, f"numbers in the table that the file does not hold: {bad}"
    for d in re.findall(r"\d{4}-\d{2}-\d{2}", "".join(rows)):
        assert d in dates


def test_the_check_catches_a_number_the_file_does_not_hold():
    assert _matches("2.866", [2.8656]) and _matches("52.3", [0.5226], percent=True) and _matches("−0.058", [-0.0577])
    assert not _matches("2.867", [2.8656]) and not _matches("52.3", [0.5226]) and not _matches("9.9", [0.5226], True)
