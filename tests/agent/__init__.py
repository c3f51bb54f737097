import json
import subprocess
import sys
from pathlib import Path

# One GRPO step of a tiny model through `etude train`, as a user runs it.
TINY_STEP = ('model = "tiny"\nsteps = 1\nprompts_per_step = 1\ngroup_size = 2\nmax_new_tokens = 16\n'
             'eval_problems = 1\ncheckpoint_every = 1\nprecision = "fp32"\n')


def train_cli(tmp_path: Path, config: str) -> list[dict]:
    """Run `etude train` on `config` (TOML text) in a subprocess; assert it exits 0 and return the
    run's metrics.jsonl records."""
    cfg = tmp_path / "train.toml"
    cfg.write_text(config)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "etude.cli", "train", "--config", str(cfg), "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
