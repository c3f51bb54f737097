"""bench/aa_readout.py on the committed A/A traffic of bench/results/realtime.json: the result
verifies, the old rule rolls that A/A cycle back on its guardrail and the new one does not, and on
re-randomised splits the new rule's false rollbacks stay within alpha where the old rule's do not."""

import json

from etude.evals.results import check_result
from tests.bench import load_bench


def test_the_new_rule_does_not_roll_back_aa_traffic_the_old_rule_rolled_back(tmp_path):
    out = tmp_path / "aa_readout.json"
    load_bench("aa_readout").main(["--splits", "40", "--out", str(out)])
    assert check_result(out) == []
    doc = json.loads(out.read_text())
    f, alpha = doc["figures"], doc["meta"]["alpha"]
    assert f["actual.old.guardrail_rollback"]["k"] == 1 and f["actual.new.guardrail_rollback"]["k"] == 0
    assert f["old.aa_false_guardrail_rollback_rate"]["rate"] > alpha
    for name in ("aa_false_promotion_rate", "aa_false_guardrail_rollback_rate", "aa_false_alarm_rollback_rate"):
        assert f[f"new.{name}"]["rate"] <= alpha, name
