"""bench/aa_burnin.py on a collect window of its own: A/A re-deals under the loop's rule, every
look counted against a burn-in, figures that bench/verify.py recomputes; a folder without a
collected cycle is one line and exit 2."""

from __future__ import annotations

import json
import time
from pathlib import Path

from etude.store import open_store
from tests.bench import load_bench
from tests.loop.test_plan import _collect_window

aa_burnin = load_bench("aa_burnin")
verify = load_bench("verify")


def test_re_deals_of_a_window_with_and_without_a_burn_in_verify(tmp_path: Path, capsys) -> None:
    root = tmp_path / "run" / "loop"
    (root / "cycle-0001").mkdir(parents=True)
    store = open_store(f"sqlite:///{root / 'etude.db'}")
    t0 = time.time()
    _collect_window(store, "loop", [(0, 2)] * 12 + [(6, 7), (7, 6), (9, 12), (11, 13)])
    (root / "cycle-0001" / "state.json").write_text(json.dumps(
        {"stages": {"collect": {"outputs": {"since": t0 - 1, "until": time.time() + 1}}}}))
    out = tmp_path / "results" / "aa_burnin.json"
    assert aa_burnin.main(["--window", str(root), "--splits", "40", "--burn-in", "5", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    figs = data["figures"]
    assert figs["aa_false_promotion_rate.run.burn_in_0"]["n"] == 40 == figs["aa_false_promotion_rate.run.burn_in_5"]["n"]
    assert data["meta"]["windows"][0]["users"] == 16
    assert verify.main(["--results", str(out.parent)]) == 0
    assert aa_burnin.main(["--window", str(tmp_path), "--out", str(out)]) == 2
    assert "has no cycle-0001/state.json" in capsys.readouterr().out
