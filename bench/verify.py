"""Recompute every headline figure under bench/results/ from the records it summarises; exit 1 on
any mismatch beyond rounding, naming the file, the field, the stored and the recomputed value.

    .venv/bin/python bench/verify.py [--results bench/results]

The convention (`etude.evals.results`, which bench scripts write through with `write_result`):
- `<stem>.json` holds `provenance` (`etude.provenance.provenance`: commit, dirty flag, command,
  seeds, machine, times, stages), `records` ({"file": "<stem>.records.jsonl", "count", "sha256"}),
  `figures` (each a spec — kind `rate`, `mean`, `quantile`, `ratio`, `difference`, `paired`,
  `noninferiority` or `ab`, and the records it is computed from — plus its values) and, optionally,
  unverified `meta`.
- `<stem>.records.jsonl` beside it: one flat JSON object per task (answer, step). Records are
  never embedded in the JSON.
- Figures sharing a `family` (several checkpoints compared on one held-out set) carry
  `comparisons` and Holm-corrected `p_holm`.
Rates are k/n with Wilson 95% intervals (`stats.wilson_ci`), paired 0/1 comparisons carry the gain
and the exact McNemar p (`stats.mcnemar_exact`), non-inferiority the one-sided paired t; speed
results give ours and the peer's median (or percentile) from the same run and their ratio or
difference; an A/B readout (`ab`) the relative lift of a per-user ratio metric with its
delta-method interval and the mSPRT's always-valid p and interval
(`etude.experiments.analysis.analyze_metric`).

Beyond the figures (since stop 45): a result file holds no top-level key but provenance, records,
figures and meta; meta holds only the keys its script declares in `META_SCHEMA` (each of its
declared type; the script is the provenance command's, read without importing it), and no
claim-like key (`headline`, `*claim*`, `conclusion`) at any depth; the provenance's commit must be a
commit of the repository holding the file (not checked in a shallow clone).

Every `*.json` under the folder (subfolders included) must follow it: a file without provenance or
records fails, it does not pass silently. `legacy/` is skipped, explicitly and counted: it holds
the files that predate the seal (issue 29; legacy/README.md says what was edited by hand there).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from etude.evals.results import LEGACY_DIR, verify_dir

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results",
                    help="the results folder (default bench/results)")
    a = ap.parse_args(argv)
    if not a.results.is_dir():
        print(f"verify: {a.results} is not a directory", file=sys.stderr)
        return 2
    checked, skipped, failed = verify_dir(a.results)
    for p in (p for found in failed.values() for p in found):
        print(f"FAIL {p}", file=sys.stderr)
    print(f"verify: {len(checked) - len(failed)} of {len(checked)} result files verified; skipped {len(skipped)} legacy "
          f"files under {a.results / LEGACY_DIR} (they predate the seal and are not verified)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
