"""Protected paths at grading, without the sandbox: what is stripped and what is restored."""

import os

from etude.envs.grade import restore_protected, strip_protected

SYMLINK = """diff --git a/tests b/tests
new file mode 120000
--- /dev/null
+++ b/tests
@@ -0,0 +1 @@
+/etc
\\ No newline at end of file
"""


def test_symlink_creating_sections_are_stripped():
    src = "diff --git a/pkg/a.py b/pkg/a.py\n--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1 @@\n-a\n+b\n"
    kept, dropped = strip_protected(SYMLINK + src)
    assert kept == src and dropped == ["tests"]


def test_restore_replaces_edits_deletes_additions_and_never_writes_through_links(tmp_path):
    tpl, ws, outside = tmp_path / "tpl", tmp_path / "ws", tmp_path / "outside"
    for d in (tpl / "tests", ws / "tests", tpl / "pkg", ws / "pkg", outside):
        d.mkdir(parents=True)
    (tpl / "tests" / "test_a.py").write_text("def test_a():\n    assert f() == 1\n")
    (ws / "tests" / "test_a.py").write_text("def test_a():\n    pass\n")  # the agent's edit
    (ws / "conftest.py").write_text("# the agent's hook\n")  # added by the agent
    (tpl / "pkg" / "tests").mkdir()
    (tpl / "pkg" / "tests" / "test_b.py").write_text("x = 1\n")
    os.symlink(outside, ws / "pkg" / "tests")  # a link where the template has a test directory
    (ws / "pkg" / "core.py").write_text("edited source stays\n")
    changed = restore_protected(ws, tpl)
    assert (ws / "tests" / "test_a.py").read_text() == (tpl / "tests" / "test_a.py").read_text()
    assert not (ws / "conftest.py").exists()
    assert sorted(changed) == ["conftest.py", "tests/test_a.py"]
    assert list(outside.iterdir()) == []  # nothing written through the link
    assert (ws / "pkg" / "core.py").read_text() == "edited source stays\n"
