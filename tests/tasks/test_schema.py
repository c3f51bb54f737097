"""Task schema and loaders: ours, SWE-bench JSONL (lists as JSON text) and parquet; bad rows."""

import json

import pytest

from etude.errors import EtudeError, NotFound
from etude.tasks import load_tasks, load_tasks_report, save_tasks, task_from_dict
from etude.types import Task

SWE_ROW = {
    "instance_id": "astropy__astropy-12907",
    "repo": "astropy/astropy",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "patch": "diff --git a/x.py b/x.py\n",
    "test_patch": "diff --git a/t.py b/t.py\n",
    "problem_statement": "Modeling's separability_matrix does not compute correctly",
    "hints_text": "",
    "created_at": "2022-03-03T15:14:54Z",
    "version": "4.3",
    "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
    "FAIL_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]',
    "PASS_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_coord_matrix", "a::b"]',
}


def test_swe_bench_row_with_json_encoded_lists_loads():
    t = task_from_dict(SWE_ROW)
    assert t.FAIL_TO_PASS == ("astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]",)
    assert t.PASS_TO_PASS == ("astropy/modeling/tests/test_separable.py::test_coord_matrix", "a::b")
    assert t.strategy == "swe-bench"


def test_real_lists_and_unknown_keys_go_to_meta():
    row = {**SWE_ROW, "FAIL_TO_PASS": ["a::b"], "PASS_TO_PASS": [], "image_name": "sweb.eval.x"}
    t = task_from_dict(row)
    assert t.FAIL_TO_PASS == ("a::b",) and t.PASS_TO_PASS == ()
    assert t.meta["image_name"] == "sweb.eval.x"


def test_roundtrip_keeps_every_field(tmp_path):
    t = Task(instance_id="p__1", repo="pypi/p", base_commit="sdist:p==1+abc", patch="P", test_patch="T",
             problem_statement="S", FAIL_TO_PASS=("t::a",), PASS_TO_PASS=("t::b",), source={"package": "p"},
             strategy="synth:op_flip", timeout_s=30.0, setup={"base_patch": "B", "test_paths": ["tests"]})  # fmt: skip
    f = tmp_path / "t.jsonl"
    assert save_tasks([t], f) == 1
    assert load_tasks(f) == [t]


def test_corrupt_line_is_reported_and_the_rest_load(tmp_path, capsys):
    f = tmp_path / "mixed.jsonl"
    good2 = {**SWE_ROW, "instance_id": "second"}
    missing = {k: v for k, v in SWE_ROW.items() if k != "patch"}
    bad_list = {**SWE_ROW, "instance_id": "third", "FAIL_TO_PASS": "[not json"}
    lines = [
        json.dumps(SWE_ROW),
        '{"instance_id": "broken',
        json.dumps(missing),
        json.dumps(bad_list),
        "",
        json.dumps(good2),
    ]
    f.write_text("\n".join(lines) + "\n")
    tasks, errors = load_tasks_report(f)
    assert [t.instance_id for t in tasks] == ["astropy__astropy-12907", "second"]
    assert len(errors) == 3
    assert errors[0].startswith(f"{f}:2: not JSON")
    assert "missing field(s): patch" in errors[1] and ":3:" in errors[1]
    assert "FAIL_TO_PASS" in errors[2] and ":4:" in errors[2]
    assert len(load_tasks(f)) == 2
    assert capsys.readouterr().err.count("skipped") == 3
    with pytest.raises(EtudeError, match=":2: not JSON"):
        load_tasks(f, strict=True)


def test_duplicate_ids_are_reported(tmp_path):
    f = tmp_path / "dup.jsonl"
    f.write_text(json.dumps(SWE_ROW) + "\n" + json.dumps(SWE_ROW) + "\n")
    tasks, errors = load_tasks_report(f)
    assert len(tasks) == 1 and "duplicate instance_id" in errors[0]


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(NotFound, match="task file not found"):
        load_tasks(tmp_path / "nope.jsonl")


def test_parquet_in_swe_bench_shape_loads(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    f = tmp_path / "test-00000-of-00001.parquet"
    pd.DataFrame([SWE_ROW, {**SWE_ROW, "instance_id": "b"}]).to_parquet(f)
    tasks = load_tasks(f)
    assert [t.instance_id for t in tasks] == ["astropy__astropy-12907", "b"]
    assert tasks[1].PASS_TO_PASS[1] == "a::b"


def test_corrupt_parquet_is_one_clear_error(tmp_path):
    f = tmp_path / "bad.parquet"
    f.write_bytes(b"PAR1 not really")
    with pytest.raises(EtudeError, match="cannot read parquet"):
        load_tasks(f)


def test_validate_reports_a_swe_bench_row_it_cannot_build(tmp_path):
    from etude.tasks.validate import validate_task

    v = validate_task(task_from_dict(SWE_ROW), runs=2)
    assert not v.kept and "no setup.sdist and no setup.repo_dir" in v.reason
