"""The evaluation benchmark: correctness, adherence to the repository, efficiency, reports, and
the comparison gate of two runs (see docs/evals.md).

    from etude.evals import EvalConfig, run_eval, compare
    summary = run_eval("suite.jsonl", "oracle", "runs/oracle", EvalConfig(workers=2), use="final")
    verdict = compare("runs/base", "runs/candidate")      # verdict["gate_passed"]
"""

from etude.evals.compare import CompareConfig, compare
from etude.evals.config import EvalConfig
from etude.evals.report import write_report
from etude.evals.runner import run_eval

__all__ = ["CompareConfig", "EvalConfig", "compare", "run_eval", "write_report"]
