"""`etude demo`: the whole system on the embedded default, for real, on this machine.

Stages (each timed and cached; a rerun with the same --out resumes; every figure is measured here):
1. tasks     — level-1 curriculum slices: held-out tasks from the test split's packages, SFT/RL
               tasks from the train split's, validation from its own (no package in two);
2. base      — `etude eval` of the base model on the held-out slice, in sandboxes;
3. sft       — `etude sft`: the warm start on the scripted expert's resolved trajectories;
4. sft eval  — the SFT checkpoint on the same held-out slice;
5. rl        — `etude train`: GRPO over whole episodes from the SFT checkpoint (a few steps);
6. rl eval   — the RL checkpoint on the same held-out slice, and paired comparisons (exact
               McNemar, Wilson intervals) against the base and the previous stage;
7. cycle     — one real-time cycle with the trained checkpoint as production behind `auto`:
               the real server on loopback, simulated users running the real agent client through
               the HTTP API, distill → train → eval gate → register → canary A/B → readout → decision;
8. report    — report.html with PNG plots and the same task's trajectory from the base and the
               trained model side by side; demo.json with the checkpoints and each stage's figures.

`--quick` uses the tiny random model and the smallest slices (the machinery, not the model, is
what it shows); the default uses SmolLM2-135M-Instruct on CPU.
"""

from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from etude.demo.report import write_report
from etude.errors import EtudeError
from etude.evals import CompareConfig, EvalConfig, compare, run_eval
from etude.evals.records import resolved_by_task, tool_use_by_task
from etude.evals.stats import paired_summary, wilson_ci
from etude.loop import LoopConfig, run_cycle
from etude.policy import check_backend
from etude.tasks import save_tasks
from etude.tasks.curriculum import builtin_curriculum
from etude.train import load_config, train
from etude.train.checkpoint import latest_checkpoint
from etude.train.metrics import read_metrics
from etude.train.sft import load_sft_config, run_sft


@dataclass(frozen=True)
class DemoConfig:
    model: str = "smollm2"
    """base model: "smollm2" (default), "tiny" (random; --quick) or a model directory."""
    out: str = "runs/demo"
    """everything this run writes: evals, checkpoints, the loop's database, the report."""
    eval_tasks: int = 30
    """held-out level-1 tasks (test-split packages) for the base, SFT and RL evaluations."""
    sft_tasks: int = 48
    """train-split tasks whose expert trajectories the warm start learns from. At demo size the
    warm start teaches the tool calls, not the fix (docs/demo.md: 48 tasks resolved 0 of 30 held
    out, 116 resolved 0 of 47); the whole train split (bench/agent_learning.py) resolves 5-11 of 118."""
    sft_epochs: float = 1.0
    agent_config: str = "configs/agent_sft.toml"
    """the agent's harness and the SFT hyperparameters (model and tasks are set by the demo)."""
    rl_config: str = "configs/agent_rl.toml"
    rl_steps: int = 2
    prompts_per_step: int = 2
    group_size: int = 4
    validation_tasks: int = 6
    loop_config: str = "configs/loop_demo.toml"
    """the real-time cycle's config; model and root are set by the demo."""
    backend: str = "auto"
    """engine of the evaluations and of the RL rollouts: "hf", "vllm" (`make setup-vllm`; about
    2.3x faster episodes here) or "auto" (vllm when this Python environment has it)."""
    workers: int | None = None
    """episodes in flight in an evaluation: None = 8 with hf (on a local Ray), 16 with vllm."""
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


QUICK = DemoConfig(model="tiny", eval_tasks=2, sft_tasks=2, sft_epochs=1.0, rl_steps=1, prompts_per_step=1,
                   group_size=2, validation_tasks=1, loop_config="configs/loop_tiny.toml", backend="hf", workers=2)


def resolve_backend(backend: str) -> str:
    """"auto" -> "vllm" when vLLM is importable here, else "hf"; "hf" and "vllm" as given (a
    missing vLLM is then one line from etude.policy.check_backend)."""
    if backend not in ("auto", "hf", "vllm"):
        raise EtudeError(f"--backend must be auto, hf or vllm, not {backend!r}")
    if backend == "auto":
        return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    if backend == "vllm":
        check_backend("vllm")
    return backend


def _jsonable(x: Any) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        x = dataclasses.asdict(x)
    return json.loads(json.dumps(x, default=str))


class Demo:
    def __init__(self, cfg: DemoConfig, console: Console | None = None):
        self.cfg = cfg
        # a bad or missing engine is one line before anything is written
        self.backend = resolve_backend(cfg.backend)
        self.workers = cfg.workers or (16 if self.backend == "vllm" else 8)
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
        c = self.cfg
        ev = builtin_curriculum("test", 1, c.seed, c.eval_tasks)
        tr = builtin_curriculum("train", 1, c.seed, c.sft_tasks)
        va = builtin_curriculum("validation", 1, c.seed, c.validation_tasks)
        save_tasks(ev, self.out / "eval_slice.jsonl")
        save_tasks(tr, self.out / "train_slice.jsonl")
        save_tasks(va, self.out / "validation_slice.jsonl")
        pk = {n: sorted({t.source.get("package", t.repo) for t in ts}) for n, ts in (("test", ev), ("train", tr))}
        return ({"test": [t.instance_id for t in ev], "train": [t.instance_id for t in tr]},
                f"{len(ev)} held-out tasks from {', '.join(pk['test'])}; {len(tr)} training tasks from "
                f"{len(pk['train'])} other packages")

    def _harness(self) -> Any:
        return load_sft_config(self.cfg.agent_config).harness_config()

    def evaluate(self, model: str, name: str) -> tuple[Any, str]:
        h = replace(self._harness(), temperature=0.0)
        cfg = EvalConfig(workers=self.workers, harness=h, bootstrap=500, backend=self.backend)
        s = run_eval(self.out / "eval_slice.jsonl", model, self.out / name, cfg)
        r = s["correctness"]["resolved_rate"]
        vc = (s.get("behaviour") or {}).get("valid_call_rate") or {}
        valid = f", valid calls {vc['mean']:.0%}" if vc.get("mean") is not None else ""
        return s, (f"resolved {r['mean']:.0%} of {s.get('tasks', '?')} tasks "
                   f"[95% CI {r['ci_low']:.0%}–{r['ci_high']:.0%}]{valid} ({Path(model).name})")

    def sft(self) -> tuple[Any, str]:
        c = self.cfg
        cfg = load_sft_config(c.agent_config, {"model": c.model, "tasks": str(self.out / "train_slice.jsonl"),
                                               "epochs": c.sft_epochs, "seed": c.seed})
        res = run_sft(cfg, self.out / "sft")
        return res, (f"{res['steps']} steps on {res['trajectories'].get('expert', 0)} expert trajectories "
                     f"({res['train_tokens']} tokens), final loss {res['last'].get('loss', float('nan')):.3f}")

    def rl(self, start: str) -> tuple[Any, str]:
        c = self.cfg
        cfg = load_config(c.rl_config, {
            "model": start, "steps": c.rl_steps, "prompts_per_step": c.prompts_per_step, "group_size": c.group_size,
            "eval_every": 0, "eval_problems": c.validation_tasks, "checkpoint_every": c.rl_steps, "seed": c.seed,
            "env.tasks_file": str(self.out / "train_slice.jsonl"),
            "env.eval_tasks_file": str(self.out / "validation_slice.jsonl"),
            "env.num_test": c.validation_tasks, "env.workers": self.workers,
            # vLLM samples in this process (the engine beside the learner), not on Ray rollout actors
            "rollout_backend": self.backend, **({"use_ray": False} if self.backend == "vllm" else {})})
        res = train(cfg, self.out / "rl", progress=True)
        ckpt = latest_checkpoint(self.out / "rl")
        res["checkpoint"] = str(ckpt) if ckpt else res.get("checkpoint")
        last = res.get("last") or {}
        return res, (f"{res['steps']} GRPO steps over whole episodes, last reward {last.get('reward', float('nan')):.3f}, "
                     f"{last.get('groups_skipped', 0)} flat group(s) skipped in the last step")

    def compare(self) -> tuple[Any, str]:
        runs = {n: self.out / f"eval-{n}" for n in ("base", "sft", "rl") if (self.out / f"eval-{n}" / "results.jsonl").is_file()}
        res = {n: resolved_by_task(p) for n, p in runs.items()}
        use = {n: tool_use_by_task(p) for n, p in runs.items()}
        ids = sorted(set.intersection(*(set(r) for r in res.values())))
        table: dict[str, Any] = {}
        for n, r in res.items():
            k, u = sum(r[i] for i in ids), sum(use[n][i] for i in ids)
            lo, hi = wilson_ci(k, len(ids))
            table[n] = {"resolved": k, "tasks": len(ids), "rate": k / max(1, len(ids)), "ci95": [lo, hi],
                        "tool_use": {"episodes": u, "rate": u / max(1, len(ids)), "ci95": list(wilson_ci(u, len(ids)))}}
        pairs = [("sft", "base"), ("rl", "sft"), ("rl", "base")]
        for b, a in pairs:
            if a in res and b in res:
                p = paired_summary([res[a][i] for i in ids], [res[b][i] for i in ids])
                q = paired_summary([use[a][i] for i in ids], [use[b][i] for i in ids])
                table[f"{b}_vs_{a}"] = {"gain": p["gain_points"], "mcnemar_p": p["mcnemar_p"],
                                        "tool_use_gain": q["gain_points"], "tool_use_mcnemar_p": q["mcnemar_p"]}
        # NOTE: the eval gate runs at the slice's size: below 30 tasks it cannot pass (inconclusive at best).
        final = "rl" if "rl" in runs else "sft"
        gate = compare(runs["base"], runs[final], CompareConfig(min_tasks=min(30, len(ids))))
        table["gate"] = {"verdict": gate.get("gate"), "versus": f"{final} vs base"}
        self.data["heldout"] = table
        parts = [f"{n} {table[n]['rate']:.0%} [{table[n]['ci95'][0]:.0%}–{table[n]['ci95'][1]:.0%}]" for n in res]
        gains = [f"{k.replace('_vs_', ' vs ')} {v['gain']:+.0%} (p={v['mcnemar_p']:.3g})" for k, v in table.items()
                 if "_vs_" in k]
        uses = [f"{n} {table[n]['tool_use']['episodes']}/{len(ids)}" for n in res]
        use_p = [f"{k.replace('_vs_', ' vs ')} p={v['tool_use_mcnemar_p']:.2g}" for k, v in table.items() if "_vs_" in k]
        return {"heldout": table, "gate": gate}, ("resolved: " + "; ".join(parts + gains) + f"; gate {gate.get('gate')}"
                                                  + " | episodes with a well-formed tool call: " + ", ".join(uses)
                                                  + (f" ({'; '.join(use_p)})" if use_p else ""))

    def cycle(self, production: str) -> tuple[Any, str]:
        lc = LoopConfig.from_toml(self.cfg.loop_config)
        lc = replace(lc, model=production, root=str(self.out / "loop"), db=None)
        rep = run_cycle(lc, cycle_dir=self.out / "loop" / "cycle-0001").to_dict()
        return rep, f"decision: {rep.get('decision')} ({rep.get('reason')})"

    def report(self, checkpoints: dict[str, str]) -> tuple[Any, str]:
        recs = read_metrics(self.out / "rl") if (self.out / "rl").exists() else []
        sft_recs = read_metrics(self.out / "sft") if (self.out / "sft").exists() else []
        self.data["metrics"] = [r for r in recs if r.get("kind") != "eval"]
        self.data["evals"] = [self._eval_point(r) for r in recs if r.get("kind") == "eval"]
        rep = self.data.get("cycle_report") or {}
        stages = rep.get("stages", {})
        held = self.data.get("heldout") or {}
        d = {
            "intro": ("Every figure here was measured in this run on this machine. Held-out tasks come from packages "
                      "that no training stage saw. The users in the real-time cycle are simulated (their behaviour "
                      "depends on whether the agent's change is right, through noise); the code path they drive is "
                      "the production one."),
            "stages": self.stages,
            "metrics": self.data.get("metrics", []),
            "sft_metrics": [r for r in sft_recs if r.get("kind") == "train"],
            "evals": self.data.get("evals", []),
            "heldout": held,
            "learning_note": (f"Base {self.cfg.model} → SFT on expert trajectories → GRPO over whole episodes. "
                              "Held-out resolved rates with Wilson 95% intervals; p values are exact McNemar on "
                              "the paired tasks."),
            "comparison": (self.data.get("comparison") or {}).get("gate"),
            "eval_note": "The eval gate, paired over the same held-out tasks (trained vs base).",
            "cycle": {n: s.get("wall_s") or 0.0 for n, s in stages.items()},
            "cycle_rows": [[n, s.get("status"), s.get("wall_s") or 0.0] for n, s in stages.items()],
            "readout": rep.get("ab"),
            "decision": f"{rep.get('decision')} — {rep.get('reason')}" if rep else "–",
            "side_by_side": self._side_by_side(),
        }
        path = write_report(self.out, d)
        (self.out / "demo.json").write_text(json.dumps({
            "checkpoints": checkpoints, "backend": self.backend, "heldout": held, "stages": self.stages, "cycle": rep,
            "comparison": (self.data.get("comparison") or {}).get("gate")}, indent=1, default=str))
        return str(path), str(path)

    def _side_by_side(self) -> dict[str, Any] | None:
        """One held-out task: the base model's and the trained model's trajectories (a task the
        trained model resolved, if any)."""
        final = next((n for n in ("rl", "sft") if (self.out / f"eval-{n}" / "results.jsonl").is_file()), None)
        if final is None or not (self.out / "eval-base" / "results.jsonl").is_file():
            return None
        trained, base = resolved_by_task(self.out / f"eval-{final}"), resolved_by_task(self.out / "eval-base")
        ids = sorted(set(trained) & set(base), key=lambda i: (-trained[i], i))
        if not ids:
            return None
        tid = ids[0]
        return {"task": tid, "resolved": {"base": base[tid], final: trained[tid]},
                "columns": [("base", _transcript(self.out / "eval-base", tid)),
                            (final, _transcript(self.out / f"eval-{final}", tid))]}

    @staticmethod
    def _eval_point(r: dict[str, Any]) -> dict[str, Any]:
        k, n = int(r.get("eval/successes", 0)), int(r.get("eval/n", 0))
        lo, hi = wilson_ci(k, n)
        return {"step": r["step"], "success": k / n if n else None, "ci_low": lo, "ci_high": hi, "n": n}


def _transcript(run: Path, task_id: str, limit: int = 900) -> str:
    for ln in (run / "results.jsonl").read_text().splitlines():
        r = json.loads(ln)
        if r["instance_id"] == task_id and r.get("trajectory"):
            lines = (run / r["trajectory"]).read_text().splitlines()
            if not lines:
                return "(empty trajectory)"
            t = json.loads(lines[-1])
            return "\n".join(f"[{m['role']}] {m.get('content', '')[:limit]}" for m in t.get("messages", [])[1:12])
    return "(not found)"


def run_demo(cfg: DemoConfig, console: Console | None = None) -> Path:
    demo = Demo(cfg, console)
    t0 = time.monotonic()
    demo.con.print(f"[bold]etude demo[/bold] — base model {cfg.model}, {demo.backend} episodes, output in {demo.out}")
    demo.stage("1. tasks", demo.tasks)
    demo.stage("2. base evaluation", lambda: demo.evaluate(cfg.model, "eval-base"))
    sft = demo.stage("3. SFT warm start", demo.sft)
    demo.stage("4. SFT evaluation", lambda: demo.evaluate(sft["final"], "eval-sft"))
    rl = demo.stage("5. multi-turn RL", lambda: demo.rl(sft["final"]))
    ckpt = rl.get("checkpoint") or sft["final"]
    demo.stage("6. RL evaluation", lambda: demo.evaluate(ckpt, "eval-rl"))
    demo.data["comparison"] = demo.stage("   held-out comparison", demo.compare)
    demo.data["heldout"] = (demo.data["comparison"] or {}).get("heldout")
    demo.data["cycle_report"] = demo.stage("7. real-time cycle", lambda: demo.cycle(ckpt))
    checkpoints = {"base": cfg.model, "sft": sft["final"], "rl": ckpt}
    path = demo.stage("8. report", lambda: demo.report(checkpoints), resumable=False)
    demo.con.rule()
    demo.con.print(f"done in {time.monotonic() - t0:.0f} s — report: [bold]{path}[/bold]")
    return path
