"""`etude demo`: the whole system on the embedded default, for real, on this machine.

Stages (each timed; every figure printed or plotted is measured in this run):
1. tasks     — slices of the built-in suite (real PyPI packages, validated tasks; cached);
2. baseline  — `etude eval` of the base model on a held-out slice, in sandboxes;
3. train     — a short sandbox-RL run (GRPO with importance correction) from the base model;
4. eval      — the trained checkpoint on the same slice, and the paired comparison;
5. cycle     — one real-time cycle with the trained checkpoint as production behind `auto`:
               the real server on loopback, traffic from scripted users running the real agent
               client through the HTTP API (they keep or revert edits by the hidden tests and
               write a dissatisfied follow-up when tests still fail — scripted, not people),
               distill → train → eval gate → register → canary A/B → readout → decision;
6. report    — report.html with PNG plots.

`--quick` uses the tiny random model (the machinery, not the model, is what it shows); the
default uses SmolLM2-135M-Instruct on CPU.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console


@dataclass(frozen=True)
class DemoConfig:
    model: str = "smollm2"
    """base model: "smollm2" (default), "tiny" (random; --quick) or a model directory."""
    out: str = "runs/demo"
    """everything this run writes: evals, checkpoints, the loop's database, the report."""
    eval_tasks: int = 2
    """held-out repository tasks for the baseline and trained evaluations."""
    eval_steps: int = 3
    """harness turns per evaluation episode (each turn re-reads a ~1.5k-token prompt on CPU)."""
    eval_max_tokens: int = 96
    train_env: str = "pyfunc"
    """sandbox-RL family: "pyfunc" (write a function; hidden tests run in bwrap) or "tasks"
    (multi-turn repository tasks through the harness)."""
    train_steps: int = 4
    prompts_per_step: int = 4
    group_size: int = 4
    train_max_tokens: int = 80
    lr: float = 1e-5
    loop_config: str = "configs/loop_demo.toml"
    """the real-time cycle's config; model and root are set by the demo."""
    workers: int = 2
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


QUICK = DemoConfig(model="tiny", eval_tasks=2, eval_steps=2, eval_max_tokens=32, train_steps=3, prompts_per_step=2,
                   group_size=2, train_max_tokens=24, lr=1e-3, loop_config="configs/loop_tiny.toml")


def _jsonable(x: Any) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        x = dataclasses.asdict(x)
    return json.loads(json.dumps(x, default=str))


def _wilson(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    z, p = 1.96, k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


class Demo:
    def __init__(self, cfg: DemoConfig, console: Console | None = None):
        self.cfg = cfg
        self.out = Path(cfg.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.con = console or Console()
        self.stages: list[tuple[str, str, float]] = []
        self.data: dict[str, Any] = {}
        # A rerun with the same --out resumes: finished stages are read back, not redone.
        self.state_path = self.out / "demo_state.json"
        self.done: dict[str, Any] = json.loads(self.state_path.read_text()) if self.state_path.is_file() else {}
        if self.done.get("config") not in (None, _jsonable(cfg)):
            self.con.print(f"[yellow]{self.out} holds a demo run with another configuration: starting over[/yellow]")
            self.done = {}
        self.done["config"] = _jsonable(cfg)

    def stage(self, name: str, fn: Any, *, resumable: bool = True) -> Any:
        self.con.rule(f"[bold]{name}")
        if resumable and name in self.done.get("stages", {}):
            st = self.done["stages"][name]
            self.stages.append((name, st["summary"], st["seconds"]))
            self.con.print(f"[green]✓[/green] {name}: {st['summary']}  (from the earlier run, {st['seconds']:.1f} s)")
            return st["result"]
        t0 = time.monotonic()
        result, summary = fn()
        dt = time.monotonic() - t0
        self.stages.append((name, summary, dt))
        self.con.print(f"[green]✓[/green] {name}: {summary}  ({dt:.1f} s)")
        if resumable:
            self.done.setdefault("stages", {})[name] = {"summary": summary, "seconds": dt, "result": _jsonable(result)}
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.done, default=str))
            tmp.replace(self.state_path)
        return result

    # -- stages
    def tasks(self) -> tuple[Any, str]:
        from etude.tasks import builtin_suite, save_tasks

        ev = builtin_suite("eval", max_tasks=self.cfg.eval_tasks)
        save_tasks(ev, self.out / "eval_slice.jsonl")
        pkgs = sorted({t.source.get("package", t.repo) for t in ev})
        return [t.instance_id for t in ev], f"{len(ev)} held-out tasks from {', '.join(pkgs)}"

    def evaluate(self, model: str, name: str) -> tuple[Any, str]:
        from etude.evals import EvalConfig, run_eval
        from etude.harness import HarnessConfig

        h = HarnessConfig(max_steps=self.cfg.eval_steps, max_tokens_per_turn=self.cfg.eval_max_tokens, temperature=0.0)
        cfg = EvalConfig(workers=self.cfg.workers, max_steps=self.cfg.eval_steps, harness=h)
        s = run_eval(self.out / "eval_slice.jsonl", model, self.out / name, cfg)
        r = s["correctness"]["resolved_rate"]
        return s, (f"resolved {r['mean']:.0%} of {s.get('tasks', '?')} tasks "
                   f"[95% CI {r['ci_low']:.0%}–{r['ci_high']:.0%}] ({model})")

    def train(self) -> tuple[Any, str]:
        from etude.train import EnvConfig, TrainConfig, train

        c = self.cfg
        tcfg = TrainConfig(model=c.model, steps=c.train_steps, prompts_per_step=c.prompts_per_step,
                           group_size=c.group_size, max_new_tokens=c.train_max_tokens, lr=c.lr, seed=c.seed,
                           checkpoint_every=max(1, c.train_steps), eval_every=max(1, c.train_steps // 2),
                           eval_problems=4, env=EnvConfig(name=c.train_env))
        res = train(tcfg, self.out / "train", progress=True)
        last = res.get("last") or {}
        return res, (f"{res['steps']} steps on '{c.train_env}', last reward {last.get('reward', float('nan')):.3f}, "
                     f"checkpoint {Path(res['checkpoint']).name if res.get('checkpoint') else '-'}")

    @staticmethod
    def _eval_point(r: dict[str, Any]) -> dict[str, Any]:
        k, n = int(r.get("eval/successes", 0)), int(r.get("eval/n", 0))
        lo, hi = _wilson(k, n)
        return {"step": r["step"], "success": k / n if n else None, "ci_low": lo, "ci_high": hi, "n": n}

    def compare(self) -> tuple[Any, str]:
        from etude.evals import CompareConfig, compare

        # NOTE: a slice this small cannot exclude harm, so the gate is run at its size and says
        # "inconclusive" (never "passed") unless the evidence is there.
        v = compare(self.out / "eval-base", self.out / "eval-trained", CompareConfig(min_tasks=min(30, self.cfg.eval_tasks)))
        gate = v.get("gate") or ("passed" if v.get("gate_passed") else "failed")
        if gate == "failed":
            return v, f"gate failed ({', '.join(v.get('regressions', [])) or 'see report'})"
        return v, f"gate {gate}"

    def cycle(self, production: str) -> tuple[Any, str]:
        from etude.loop import LoopConfig, run_cycle

        lc = LoopConfig.from_toml(self.cfg.loop_config)
        lc = replace(lc, model=production, root=str(self.out / "loop"), db=None)
        rep = run_cycle(lc, cycle_dir=self.out / "loop" / "cycle-0001").to_dict()
        return rep, f"decision: {rep.get('decision')} ({rep.get('reason')})"

    def report(self) -> tuple[Any, str]:
        from etude.demo.report import write_report
        from etude.train.metrics import read_metrics

        recs = read_metrics(self.out / "train")
        self.data["metrics"] = [r for r in recs if r.get("kind") != "eval"]
        self.data["evals"] = [self._eval_point(r) for r in recs if r.get("kind") == "eval"]
        rep = self.data.get("cycle_report") or {}
        stages = rep.get("stages", {})
        d = {
            "intro": ("Every figure here was measured in this run on this machine. The users in the real-time cycle "
                      "are scripted clients (they keep or revert edits according to the hidden tests and write a "
                      "dissatisfied follow-up when the tests still fail); the code path they drive is the production one."),
            "stages": self.stages,
            "metrics": self.data.get("metrics", []),
            "evals": self.data.get("evals", []),
            "learning_note": (f"Sandbox RL on the '{self.cfg.train_env}' family with base model '{self.cfg.model}'. "
                              "Held-out success uses greedy decoding; intervals are Wilson 95%."),
            "comparison": self.data.get("comparison"),
            "eval_note": "Paired over the same held-out tasks; intervals are bootstrap 95%.",
            "cycle": {n: s.get("wall_s") or 0.0 for n, s in stages.items()},
            "cycle_rows": [[n, s.get("status"), s.get("wall_s") or 0.0] for n, s in stages.items()],
            "readout": rep.get("ab"),
            "decision": f"{rep.get('decision')} — {rep.get('reason')}" if rep else "–",
            "trajectories": self._examples(),
        }
        path = write_report(self.out, d)
        (self.out / "demo.json").write_text(json.dumps({"stages": self.stages, "cycle": rep,
                                                        "comparison": self.data.get("comparison")}, indent=1, default=str))
        return str(path), str(path)

    def _examples(self, k: int = 2) -> list[tuple[str, str]]:
        out = []
        for run in ("eval-trained", "eval-base"):
            for p in sorted((self.out / run).glob("trajectories/*.jsonl"))[:k]:
                try:
                    t = json.loads(p.read_text().splitlines()[0])
                except (IndexError, json.JSONDecodeError):
                    continue
                lines = [f"[{m['role']}] {m.get('content', '')[:600]}" for m in t.get("messages", [])[1:8]]
                out.append((f"{run}: {t.get('task_id')} (stop: {t.get('stop_reason')})", "\n".join(lines)))
            if out:
                break
        return out


def run_demo(cfg: DemoConfig, console: Console | None = None) -> Path:
    demo = Demo(cfg, console)
    t0 = time.monotonic()
    demo.con.print(f"[bold]etude demo[/bold] — base model {cfg.model}, output in {demo.out}")
    demo.stage("1. tasks", demo.tasks)
    demo.stage("2. baseline evaluation", lambda: demo.evaluate(cfg.model, "eval-base"))
    res = demo.stage("3. sandbox RL", demo.train)
    ckpt = res.get("checkpoint") or cfg.model
    demo.stage("4. trained evaluation", lambda: demo.evaluate(ckpt, "eval-trained"))
    demo.data["comparison"] = demo.stage("   comparison", demo.compare)
    demo.data["cycle_report"] = demo.stage("5. real-time cycle", lambda: demo.cycle(ckpt))
    path = demo.stage("6. report", demo.report, resumable=False)
    demo.con.rule()
    demo.con.print(f"done in {time.monotonic() - t0:.0f} s — report: [bold]{path}[/bold]")
    return path
