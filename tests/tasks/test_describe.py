"""Problem statements: changelog entries when they match, otherwise written from failing tests."""

from etude.tasks.describe import changelog_entries, from_tests, match_entry

CHANGELOG = """Changelog
=========

v4.9.0 (2025-01-10)
-------------------

- Fix: ``update`` with ``doc_ids`` no longer raises KeyError for missing
  document IDs (see #591)
- Feature: support Python 3.13
* LRU cache keeps falsy values

v4.8.2 (2024-10-12)
-------------------

- Fix: something older
"""


def test_changelog_section_entries_with_wrapped_bullets():
    entries = changelog_entries(CHANGELOG, "4.9.0")
    assert entries == [
        "Fix: ``update`` with ``doc_ids`` no longer raises KeyError for missing document IDs (see #591)",
        "Feature: support Python 3.13",
        "LRU cache keeps falsy values",
    ]
    assert changelog_entries(CHANGELOG, "9.9.9") == []


def test_entry_matching_uses_test_names_and_changed_code():
    entries = changelog_entries(CHANGELOG, "4.9.0")
    patch = "@@ -1 +1 @@ def update(self, doc_ids):\n-    x = table[doc_id]\n+    x = table.get(doc_id)\n"
    got = match_entry(entries, ["tests/test_tinydb.py::test_update_ids_missing[json]"], patch)
    assert got is not None and got.startswith("Fix: ``update``")
    assert match_entry(entries, ["tests/test_x.py::test_unrelated_thing"], "") is None


def test_statement_from_tests_names_failures_but_not_the_fix():
    s = from_tests("tinydb", ["tests/test_utils.py::test_lru_cache_falsy_values_bug"],
                   {"tests/test_utils.py::test_lru_cache_falsy_values_bug": "AssertionError: assert ['a'] == ['b']"})  # fmt: skip
    assert "test_lru_cache_falsy_values_bug" in s and "lru cache falsy values bug" in s
    assert "AssertionError: assert ['a'] == ['b']" in s and "diff" not in s


def test_version_history_bullets_with_one_change_per_line():
    """The "- 1.22.4 first change / indented next change" style of parse's README."""
    readme = (
        "Version history (in brief):\n\n"
        "- 1.22.4 Account for the capture groups %z adds\n"
        "  Reject out-of-range timezone minutes (thanks @yuefdev)\n"
        "- 1.22.3 Older change\n"
    )
    assert changelog_entries(readme, "1.22.4") == [
        "Account for the capture groups %z adds",
        "Reject out-of-range timezone minutes (thanks @yuefdev)",
    ]
    got = match_entry(
        changelog_entries(readme, "1.22.4"), ["tests/test_parse.py::test_invalid_timezone_minutes[+160]"], ""
    )
    assert got == "Reject out-of-range timezone minutes (thanks @yuefdev)"
