"""Diff building, splitting, subsetting and applying; which paths are tests / protected."""

from etude.tasks import diffs, layout


def _tree(root, files):
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_tree_diff_applies_with_git_apply_including_new_deleted_and_no_eol(tmp_path):
    body = "".join(f"line {i}\n" for i in range(40))
    old = _tree(tmp_path / "old", {"pkg/a.py": body, "pkg/gone.py": "x = 1\n", "pkg/eol.py": "a\nb"})
    new_body = body.replace("line 3\n", "LINE 3\n").replace("line 30\n", "LINE 30\n")
    new = _tree(tmp_path / "new", {"pkg/a.py": new_body, "pkg/added.py": "y = 2\n", "pkg/eol.py": "a\nc"})
    files = ["pkg/a.py", "pkg/gone.py", "pkg/eol.py", "pkg/added.py"]
    patch = diffs.tree_diff(old, new, files)
    ok, msg = diffs.apply_patch(old, patch, check=False)
    assert ok, msg
    assert (old / "pkg/a.py").read_text() == new_body
    assert not (old / "pkg/gone.py").exists() and (old / "pkg/added.py").read_text() == "y = 2\n"
    assert (old / "pkg/eol.py").read_text() == "a\nc"


def test_split_and_subset_of_hunks_apply_alone(tmp_path):
    body = "".join(f"line {i}\n" for i in range(60))
    old = _tree(tmp_path / "old", {"a.py": body})
    new_body = body.replace("line 5\n", "five\nfive bis\n").replace("line 50\n", "fifty\n")
    new = _tree(tmp_path / "new", {"a.py": new_body})
    files = diffs.split_files(diffs.tree_diff(old, new, ["a.py"]))
    assert len(files) == 1 and len(files[0].hunks) == 2
    second_only = diffs.subset(files, [(0, 1)])
    ok, msg = diffs.apply_patch(old, second_only, check=False)
    assert ok, msg
    text = (old / "a.py").read_text()
    assert "fifty\n" in text and "five\n" not in text


def test_diff_hash_ignores_context_but_not_changes():
    a = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n ctx1\n-old\n+new\n ctx2\n"
    b = a.replace("ctx1", "other").replace("-1,3 +1,3", "-9,3 +9,3")
    c = a.replace("+new", "+newer")
    assert diffs.diff_hash(a) == diffs.diff_hash(b) != diffs.diff_hash(c)


def test_bad_patch_is_reported_not_raised(tmp_path):
    ok, msg = diffs.apply_patch(tmp_path, "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", check=False)
    assert not ok and msg


def test_test_and_protected_paths():
    assert layout.is_test_path("tests/test_x.py") and layout.is_test_path("tests/data/file.json")
    assert layout.is_test_path("pkg/test_mod.py") and layout.is_test_path("pkg/tests/helpers.py")
    assert not layout.is_test_path("pkg/testing_utils.py") and not layout.is_test_path("pkg/core.py")
    for p in ("conftest.py", "pkg/conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml",
              "pytest.py", "sitecustomize.py", "pkg/usercustomize.py", "x.pth", "_pytest/main.py"):  # fmt: skip
        assert layout.is_protected_path(p), p
    assert not layout.is_protected_path("pkg/core.py") and not layout.is_protected_path("docs/pyproject.toml")


def test_source_files_and_import_root(tmp_path):
    flat = _tree(tmp_path / "flat", {"pkg/__init__.py": "", "pkg/a.py": "", "tests/test_a.py": "", "setup.py": "",
                                     "docs/conf.py": ""})  # fmt: skip
    assert layout.import_root(flat) == "." and layout.source_files(flat) == ["pkg/__init__.py", "pkg/a.py"]
    src = _tree(tmp_path / "src", {"src/pkg/__init__.py": "", "tests/test_a.py": "", "tools/x.py": ""})
    assert layout.import_root(src) == "src" and layout.source_files(src) == ["src/pkg/__init__.py"]
