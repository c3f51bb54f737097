"""The run's bookkeeping without sandboxes: durable records, a crash's partial line, infrastructure
errors recorded and retried, and a resumed run that must match the one in the folder."""

import json

import pytest

from etude.errors import EtudeError
from etude.evals import EvalConfig, run_eval
from etude.evals.records import ResultsWriter, read_records
from etude.types import Task


def broken_task(tmp_path, iid="local__missing"):
    return Task(instance_id=iid, repo="local/x", base_commit="local", patch="", test_patch="",
                problem_statement="fix it", setup={"repo_dir": str(tmp_path / "no-such-repo")})  # fmt: skip


def test_partial_last_line_is_cut_and_last_record_wins(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"instance_id": "a", "sample": 0, "v": 1}) + "\n" + '{"instance_id": "b", "sam')
    assert set(read_records(path)) == {("a", 0)}  # the cut line is not an episode
    w = ResultsWriter(path)
    w.append({"instance_id": "a", "sample": 0, "v": 2})
    w.append({"instance_id": "b", "sample": 0, "v": 3})
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(x) for x in lines)
    recs = read_records(path)
    assert recs[("a", 0)]["v"] == 2 and recs[("b", 0)]["v"] == 3


def test_infrastructure_errors_are_recorded_then_retried(tmp_path):
    out = tmp_path / "run"
    cfg = EvalConfig(workers=1, executor="threads", progress=False, report=False)
    with pytest.raises(EtudeError, match="every episode failed"):
        run_eval([broken_task(tmp_path)], "noop", out, cfg, use="final")
    (rec,) = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert rec["status"] == "error" and "not a directory" in rec["error"] and rec["resolved"] is False
    summary = json.loads((out / "summary.json").read_text())
    assert summary["errors"] == 1 and summary["correctness"]["resolved_rate"]["mean"] == 0.0
    with pytest.raises(EtudeError):
        run_eval([broken_task(tmp_path)], "noop", out, cfg, use="final")
    assert len((out / "results.jsonl").read_text().splitlines()) == 2  # retried, not skipped


def test_resume_refuses_another_model_or_suite(tmp_path):
    out = tmp_path / "run"
    cfg = EvalConfig(workers=1, executor="threads", progress=False, report=False)
    with pytest.raises(EtudeError):
        run_eval([broken_task(tmp_path)], "noop", out, cfg, use="final")
    with pytest.raises(EtudeError, match="model='noop'"):
        run_eval([broken_task(tmp_path)], "oracle", out, cfg, use="final")
    with pytest.raises(EtudeError, match="suite_sha256"):
        run_eval([broken_task(tmp_path, "other")], "noop", out, cfg, use="final")


def test_bad_model_spec_fails_before_anything_is_written(tmp_path):
    with pytest.raises(EtudeError, match="served model name"):
        cfg = EvalConfig(executor="threads", progress=False)
        run_eval([broken_task(tmp_path)], "http://127.0.0.1:9/v1", tmp_path / "run", cfg, use="final")
    assert not (tmp_path / "run" / "run.json").exists()


def test_resume_refuses_the_same_path_holding_other_weights(tmp_path):
    """A pipeline rewrites OUT/merged when it chooses another adapter: an evaluation in a folder
    must not resume under the same model path with different weights."""
    from etude.evals.runner import _manifest, manifest_model_sha256, model_sha256

    model = tmp_path / "merged"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"first weights")
    out = tmp_path / "run"
    out.mkdir()
    cfg = EvalConfig(workers=1, executor="threads", progress=False, report=False)
    tasks = [broken_task(tmp_path)]
    _manifest(out, tasks, str(model), model_sha256(str(model)), cfg)
    assert manifest_model_sha256(out) == model_sha256(str(model)) is not None
    _manifest(out, tasks, str(model), model_sha256(str(model)), cfg)  # the same weights resume
    (model / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(EtudeError, match="model_sha256"):
        _manifest(out, tasks, str(model), model_sha256(str(model)), cfg)
    assert model_sha256("noop") is None  # not a directory: no digest, the name alone decides


def test_fresh_for_new_weights_starts_over_a_folder_without_run_json_and_resumes_the_same_weights(tmp_path):
    """A pipeline stage (Specialise.evaluate) asks run_eval to discard what another model left in
    its folder; the weights are hashed once, in run_eval, for that check and run.json."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "stale.txt").write_text("left by an interrupted evaluation of other weights")
    cfg = EvalConfig(workers=1, executor="threads", progress=False, report=False)
    with pytest.raises(EtudeError, match="every episode failed"):
        run_eval([broken_task(tmp_path)], "noop", out, cfg, fresh_for_new_weights=True, use="final")
    assert not (out / "stale.txt").exists() and (out / "run.json").is_file()
    (out / "kept.txt").write_text("the same weights: resumed, not deleted")
    with pytest.raises(EtudeError, match="every episode failed"):
        run_eval([broken_task(tmp_path)], "noop", out, cfg, fresh_for_new_weights=True, use="final")
    assert (out / "kept.txt").is_file() and len((out / "results.jsonl").read_text().splitlines()) == 2


def test_a_resume_under_another_harness_is_refused_or_started_over(tmp_path):
    """A folder evaluated with one harness never lends its records to another: plain resume is
    refused (one line), a pipeline stage's (fresh_for_new_weights) starts over; a field the
    recorded run predates counts only when set away from its default."""
    from etude.evals.runner import harness_changes
    from etude.harness import HarnessConfig

    out = tmp_path / "run"
    cfg = EvalConfig(workers=1, executor="threads", progress=False, report=False, harness=HarnessConfig(max_steps=4))
    with pytest.raises(EtudeError, match="every episode failed"):
        run_eval([broken_task(tmp_path)], "noop", out, cfg, use="final")
    verified = EvalConfig(workers=1, executor="threads", progress=False, report=False,
                          harness=HarnessConfig(max_steps=4, verify_edits=8))
    with pytest.raises(EtudeError, match=r"another harness \(verify_edits\)"):
        run_eval([broken_task(tmp_path)], "noop", out, verified, use="final")
    with pytest.raises(EtudeError, match="every episode failed"):
        run_eval([broken_task(tmp_path)], "noop", out, verified, fresh_for_new_weights=True, use="final")
    assert len((out / "results.jsonl").read_text().splitlines()) == 1  # started over
    man = json.loads((out / "run.json").read_text())
    del man["config"]["harness"]["verify_temperature"]  # a run from before the field
    (out / "run.json").write_text(json.dumps(man))
    del man["config"]["harness"]["verify_scope"]  # checked the named ids alone, before the field
    del man["config"]["harness"]["verify_unapplied"]  # never re-sampled a refused edit, before the field
    (out / "run.json").write_text(json.dumps(man))
    legacy = {"verify_scope": "tests", "verify_unapplied": False}
    assert harness_changes(out, HarnessConfig(max_steps=4, verify_edits=8, **legacy)) == []
    assert harness_changes(out, HarnessConfig(max_steps=4, verify_edits=8, verify_unapplied=True)) == [
        "verify_scope", "verify_unapplied"]
    assert harness_changes(out, HarnessConfig(max_steps=4, verify_edits=8, verify_temperature=0.5,
                                              **legacy)) == ["verify_temperature"]
    man["config"]["harness"]["verify_edits"] = 0  # verification off on both sides: its fields do not matter
    (out / "run.json").write_text(json.dumps(man))
    assert harness_changes(out, HarnessConfig(max_steps=4, verify_temperature=0.5)) == []
