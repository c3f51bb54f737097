"""Adherence metrics on real patches to the real isodate 0.7.2 repository (pinned sdist).

The gold patch rewrites one line of isotzinfo.build_tzinfo; each agent patch makes the same fix
plus one thing a reviewer would object to, and exactly that component must drop below 1.
"""

from pathlib import Path

import pytest

from etude.evals.adherence import adherence, patch_facts
from etude.evals.config import EvalConfig
from etude.tasks.diffs import file_diff

TZ = "src/isodate/isotzinfo.py"
OLD = 'tzsign = ((tzsign == "-") and -1) or 1'
NEW = 'tzsign = -1 if tzsign == "-" else 1'
WEIGHTS = EvalConfig().adherence_weights


def edit(template: Path, rel: str, old: str, new: str, context: int = 3) -> str:
    text = (template / rel).read_text()
    assert old in text, f"{old!r} not in {rel}"
    after = text.replace(old, new, 1)
    return file_diff(rel, text.splitlines(keepends=True), after.splitlines(keepends=True), context)


def score(template: Path, agent_patch: str, gold_patch: str) -> dict:
    return adherence(patch_facts(template, agent_patch), patch_facts(template, gold_patch), WEIGHTS)


@pytest.fixture(scope="module")
def gold(isodate_template):
    return edit(isodate_template, TZ, OLD, NEW)


def test_gold_scores_the_maximum_whatever_the_diff_layout(isodate_template, gold):
    same_change = edit(isodate_template, TZ, OLD, NEW, context=1)  # other hunk text, same edit
    assert same_change != gold
    res = score(isodate_template, same_change, gold)
    assert res["score"] == 1.0
    assert all(v == 1.0 for v in res["components"].values()), res["components"]


def test_empty_patch_has_no_adherence(isodate_template, gold):
    res = adherence(patch_facts(isodate_template, ""), patch_facts(isodate_template, gold), WEIGHTS)
    assert res["score"] is None


def test_extra_file_and_bigger_diff_lower_files_and_size(isodate_template, gold):
    extra = edit(isodate_template, "src/isodate/isoerror.py", "can not be parsed", "cannot be parsed")
    res = score(isodate_template, gold + extra, gold)
    assert res["components"]["files"] == pytest.approx(2 / 3)  # F1 of {tz, isoerror} vs {tz}
    assert res["components"]["size"] == pytest.approx(0.5)  # 4 changed lines vs 2
    assert res["score"] < 1.0


def test_duplicated_function_is_found(isodate_template, gold):
    # build_tzinfo copied under a new name with renamed parameters: the same code twice.
    copy = (
        "\n\ndef make_tz(name, sign='+', hours=0, minutes=0):\n"
        '    if name is None or name == "":\n        return None\n'
        '    if name == "Z":\n        return UTC\n'
        '    sign = ((sign == "-") and -1) or 1\n'
        "    return FixedOffset(sign * hours, sign * minutes, name)\n"
    )
    text = (isodate_template / TZ).read_text().replace(OLD, NEW, 1)
    patch = file_diff(TZ, (isodate_template / TZ).read_text().splitlines(True), (text + copy).splitlines(True))
    res = score(isodate_template, patch, gold)
    dups = res["agent"]["duplicates"]
    assert any("make_tz duplicates src/isodate/isotzinfo.py:build_tzinfo (same body)" in d for d in dups), dups
    assert res["components"]["duplicates"] == 0.5
    assert res["components"]["imports"] == 1.0


def test_same_name_and_signature_in_another_module_is_a_duplicate(isodate_template, gold):
    clone = '\n\ndef build_tzinfo(tzname, tzsign="+", tzhour=0, tzmin=0):\n    return None\n'
    rel = "src/isodate/isotime.py"
    text = (isodate_template / rel).read_text()
    patch = gold + file_diff(rel, text.splitlines(True), (text + clone).splitlines(True))
    res = score(isodate_template, patch, gold)
    assert any("same name and parameters" in d for d in res["agent"]["duplicates"])


def test_import_of_a_module_the_repository_never_uses(isodate_template, gold):
    patch = edit(isodate_template, TZ, OLD, NEW + "\n    import requests  # noqa: F401\n    import re  # noqa: F401")
    res = score(isodate_template, patch, gold)
    assert res["agent"]["new_imports"] == ["requests"]  # re is imported elsewhere in isodate
    assert res["components"]["imports"] == 0.5
    assert res["components"]["lint"] == 1.0  # the noqa keeps ruff quiet: imports alone are judged


def test_lint_delta_counts_ruff_warnings_the_patch_adds(isodate_template, gold):
    patch = edit(isodate_template, TZ, OLD, NEW + "\n    import re\n    unused = 1")
    res = score(isodate_template, patch, gold)
    assert res["agent"]["lint_codes"] == {"F401": 1, "F841": 1}
    assert res["agent"]["lint_added"] == 2 and res["gold"]["lint_added"] == 0
    assert res["components"]["lint"] == pytest.approx(1 / 3)


def test_formatting_that_breaks_the_files_style(isodate_template, gold):
    patch = edit(isodate_template, TZ, OLD, "tzsign = -1 if tzsign == '-' else 1\n    \tunused_marker = 0  ")
    res = score(isodate_template, patch, gold)
    evidence = " | ".join(res["agent"]["style_evidence"])
    assert "quote" in evidence and "tabs and spaces" in evidence, evidence
    assert res["components"]["format"] == 0.0  # both added lines break the file's style


def test_patch_that_does_not_apply_is_an_error(isodate_template, gold):
    from etude.errors import EtudeError

    with pytest.raises(EtudeError, match="does not apply"):
        patch_facts(isodate_template, gold.replace("and -1) or 1", "and -2) or 1"))
