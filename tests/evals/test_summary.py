"""summary.json aggregates from records, with several samples per task, errors and a missing task."""

import pytest

from etude.evals.config import EvalConfig
from etude.evals.summary import summarise
from etude.types import Task


def task(iid, repo="r"):
    return Task(instance_id=iid, repo=repo, base_commit="b", patch="", test_patch="", problem_statement="p")


def rec(iid, k, resolved, adherence=None, tokens=100, status="ok", flags=()):
    return {"instance_id": iid, "sample": k, "status": status, "resolved": resolved, "partial": False,
            "adherence": {"score": adherence, "components": {"files": adherence}}, "reward": {"total": float(resolved)},
            "flags": [{"name": f} for f in flags], "efficiency": {"tokens": tokens, "turns": 2, "stop_reason": "answer"}}  # fmt: skip


def test_rates_pass_at_k_errors_and_missing():
    tasks = [task("a"), task("b"), task("c")]
    records = [rec("a", 0, True, 1.0, 100), rec("a", 1, False, 0.5, 300, flags=("conftest_edit",)),
               rec("b", 0, False, None), rec("b", 1, False, status="error")]  # fmt: skip
    s = summarise(records, tasks, EvalConfig(samples=2), {"model": "m", "suite_sha256": "x"})
    c = s["correctness"]
    assert c["resolved_rate"]["mean"] == pytest.approx((0.5 + 0 + 0) / 3)  # c has no record: counts as 0
    assert c["pass_at_k"]["1"]["mean"] == pytest.approx(0.5 / 3)
    assert c["pass_at_k"]["2"]["mean"] == pytest.approx(1 / 3)  # a solved in one of its two samples
    assert s["missing"] == ["c"] and s["errors"] == 1 and s["episodes"] == 4
    assert s["adherence"]["score"]["mean"] == pytest.approx(0.75) and s["adherence"]["score"]["n"] == 1
    assert s["efficiency"]["tokens"]["median"] == 100 and s["efficiency"]["tokens"]["total"] == 500
    assert s["flags"] == {"conftest_edit": 1}


def test_a_suite_of_several_repositories_is_also_summarised_per_repository():
    tasks = [task("a", "o/x"), task("b", "o/x"), task("c", "o/y")]
    records = [rec("a", 0, True, 1.0, 100), rec("b", 0, False, 0.5, 300), rec("c", 0, False, None, 50)]
    s = summarise(records, tasks, EvalConfig(), {"model": "m", "suite_sha256": "x"})
    x, y = s["by_repo"]["o/x"], s["by_repo"]["o/y"]
    assert x["tasks"] == 2 and x["resolved_rate"]["mean"] == pytest.approx(0.5) and x["tokens"]["mean"] == 200
    assert y["tasks"] == 1 and y["resolved_rate"]["mean"] == 0 and y["adherence"]["n"] == 0
    one = summarise(records[:2], tasks[:2], EvalConfig(), {"model": "m", "suite_sha256": "x"})
    assert "by_repo" not in one  # one repository: the totals are its figures
