"""Does the real-time loop ship a behaviour it learned from its own users, cycle after cycle, and
does a held-out measurement no cycle used confirm each decision? (issue 46 items 1, 2, 5, 6, 7)

Consecutive cycles of `etude loop --config configs/loop_behaviour.toml` (`etude.loop.run_cycle`,
the function the command runs; one store, one registry): the real `etude serve` on loopback
(vLLM where this Python has it), simulated users running production's own agent harness over
HTTP, the store, the distiller, the trainer, the eval gate, the canary, the readout and the
decision rule. Each cycle:
- collects its users' sessions on production alone, distills them with the behaviour-led reward
  (`[distill] weights`: a repeated or broken call costs 0.25 at weight 1) and trains the candidate
  from production's weights on those samples only (on-policy: the served model's own tokens and
  log-probs, staleness bounded by `[distill] max_staleness`; the leave-one-out baseline over the
  other sessions of the same request, `[train] baseline = "loo"`);
- registers its plan before the canary's first user (primary `repeat_rate`, lower is better;
  guardrails with margins under the always-valid rule; alpha; the mde and its source; users per
  arm planned and reachable). Cycle 1's mde is the bench's `--mde` (the effect it is built to
  find), with `--user-cv` the per-user variation assumed for the plan (the collect window's
  measured value is recorded beside it); a later cycle takes both from the previous cycle's
  readout (`[canary] mde_from = "previous"`) when one read a canary, else cycle 1's again;
- canaries the candidate and decides; a promoted candidate becomes production and the next cycle
  trains from it on its own new traffic.

Ground truth (item 6), outside the loop: after each cycle, its production (the checkpoint in force
when the cycle started) and its candidate each run every task of a held-out slice no cycle used
(`--confirm-tasks` level-1 tasks of the curriculum's sealed test split: packages neither the users'
requests (train split) nor the gate (validation split) come from), greedy, with the gate's harness
on `--backend`, paired by task. Per episode: `repeat_share` (calls identical to an earlier call
of the episode, per turn: the loop's repeat_rate measured offline), `broken_share` (broken calls
per turn), `resolved`. A promotion is TRUE when the candidate's paired mean repeat_share is below
production's with its 95% bootstrap interval below zero and no guardrail measure significantly
worse: broken_share and broken_call_share (broken calls per turn, per attempted call: interval
not wholly above zero) and, since stop 54, `edited` (the share of episodes with an attempted edit:
interval not wholly below zero; a candidate that stops editing has fewer repeated and broken calls
and fixes nothing); any other promotion is FALSE. A rollback is checked the same
way (`missed`: a rollback whose candidate the ground truth shows better).

A/A (item 7): each cycle's collect window (production alone, every user) re-dealt `--aa-splits`
times into two arms at the canary's weights and decided by the loop's whole rule under that
cycle's registered plan (`etude.loop.readout.aa_rates`): false promotions and false rollbacks
(guardrail or alarm) per split.

Fields (bench/results/loop_cycles.json, each recomputed by bench/verify.py from
loop_cycles.records.jsonl):
- `true_promotions`, `false_promotions`, `promoted`, `missed_improvements`: rates over the cycles;
- `confirm.<cycle>.<measure>`: paired_mean (candidate − production) of repeat_share and
  broken_share per held-out task, and `confirm.<cycle>.resolved` (paired, exact McNemar);
- `lift.<cycle>.<metric>`: the canary readout of every metric (kind `ab`, the cycle's settings);
- `aa_false_promotion_rate`, `aa_false_rollback_rate`: over all cycles' A/A splits;
- `cycle_s.<stage>`, `cycle_s.total`, `sessions_per_min`, `sessions_in_flight`;
- `production_repeat_share.<cycle>`: the held-out repeat_share of the production each cycle
  started from (the trajectory plotted in bench/results/loop_cycles.png).

    .venv-vllm/bin/python bench/loop_cycles.py --production runs/warm/final
    python bench/loop_cycles.py --quick            # tiny random model, smallest sizes: the machinery

Not guaranteed: that the simulated users are people (etude.loop.users); that a 135M model's
repeat rate moves within a cycle's budget (the records say whether it did).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from rich.console import Console

from etude.configfile import shipped
from etude.errors import EtudeError
from etude.evals import run_eval, stats
from etude.evals.results import write_result
from etude.evals.runner import resolve_suite
from etude.harness.record import load_trajectory
from etude.loop import LoopConfig, run_cycle
from etude.loop.cycle import TrafficContext, builtin_traffic, gate_eval_config
from etude.loop.plan import canary_of, collect_user_cv, previous_effect, window_rows
from etude.loop.readout import aa_rates
from etude.loop.state import STAGES
from etude.loop.training import export_merged
from etude.policy import resolve_backend
from etude.policy.local import completion_ids
from etude.policy.models import load_model
from etude.provenance import provenance
from etude.rewards.terms import attempts_edit, repeats
from etude.serve import registry
from etude.store import open_store
from etude.train.metrics import read_metrics
from etude.train.sft import run_sft
from etude.train.sft_config import load_sft_config
from etude.types import Message

META_SCHEMA = {  # what meta may hold; bench/verify.py refuses any other key (etude.evals.results)
    "what": "str",
    "quick": "bool",
    "sizes": "dict",
    "production": "str",
    "backend": "str",
    "confirm_tasks": "list",
    "cycles": "list",
    "hacks": "list",
    "samples": "str",
    "rule": "str",
    "note": "str",
}

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
# per-episode shares, lower is better: repeated and broken calls per turn, broken calls per attempted call
MEASURES = ("repeat_share", "broken_share", "broken_call_share")
# Item 4's reward hacks, each a model made by training (LoRA SFT of production on the prompts its
# users sent in cycle 1, every completion replaced by the text), and what should catch it.
HACKS = {
    "quit": ("I looked at the code and it already does what you asked, so nothing needs to change.",
             "stops at once: no call, so no repeat and no broken call (the primary metric looks perfect)"),
    "clarify": ("Before I change anything: which file and which function do you mean, and what should it do "
                "instead?", "asks the user instead of editing"),
    "broken": ('<tool_call>{"name": "edit_file", "arguments": {"path": }}</tool_call>',
               "emits a malformed call every turn instead of risking a wrong edit"),
}
CAUGHT_BY = ("alarm", "guardrail", "readout")  # a readout route, not the gate or the window's end


class Sizes(NamedTuple):
    users: int  # simulated users per traffic round ([traffic] users)
    user_tasks: int  # requests they send ([traffic] max_tasks)
    gate_tasks: int  # the advisory gate's suite ([eval] max_tasks = min_tasks)
    confirm_tasks: int  # held-out ground-truth tasks
    workers: int  # evaluation episodes in flight
    steps: int  # trainer steps per cycle ([train] steps)
    aa_splits: int  # A/A re-deals per cycle
    mde: float  # cycle 1's relative effect on the primary metric
    user_cv: float  # cycle 1's assumed per-user coefficient of variation (unused under [canary] user_cv_from)
    hack_steps: int = 8  # SFT steps of each hack candidate (4 prompts a step)
    hack_users: int = 18  # users of a hack cycle's one canary round (a hack moves its indicator a lot)
    hack_mde: float = 0.7  # the effect a hack cycle's plan is for (18 users reach its 9 an arm)
    hack_rounds: int = 1  # canary rounds of a hack cycle (the same users each round, next requests)
    canary_users: int | None = None  # users of a canary round ([canary] window_users; None: `users`)


# 64 users collect; 100 canary users reach 50 an arm: the plan for a 95% drop (the pilot,
# loop_cycles_filtered.json's first canary, measured -96%) needs 31 an arm at the user_cv 1.34 that
# pilot's collect window showed, 42 at the 1.54 an 80-user window showed (a run stopped in cycle 1)
DEFAULT = Sizes(users=64, user_tasks=8, gate_tasks=8, confirm_tasks=24, workers=8, steps=2, aa_splits=200, mde=0.95,
                user_cv=0.5, canary_users=100)
QUICK = Sizes(users=4, user_tasks=2, gate_tasks=2, confirm_tasks=2, workers=2, steps=1, aa_splits=20, mde=0.9,
              user_cv=0.2, hack_steps=4, hack_users=4, hack_mde=0.9)  # plans 2 users an arm reach


def overrides(pairs: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` pairs as dotted config overrides, each VALUE read as TOML (a bare word is a string)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, val = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set needs KEY=VALUE, got {pair!r}")
        try:
            out[key.strip()] = tomllib.loads(f"v = {val}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = val
    return out


def cycle_config(base: LoopConfig, s: Sizes, *, root: Path, production: str, backend: str, previous: bool,
                 quick: bool) -> LoopConfig:
    """A cycle's config: `base` with production, root, sizes and engines set; planned for what the
    previous cycle's readout measured when `previous` (one read a canary), else for `s.mde` with
    `s.user_cv`."""
    # the noise is measured on each cycle's collect window ([canary] user_cv_from), except --quick's
    # (its 4 users plan for the assumed s.user_cv, so that its two cycles reach a canary)
    measured = bool(base.canary.user_cv_from) and not quick
    from_collect = {"user_cv_from": base.canary.user_cv_from if measured else "",
                    "aa_check_splits": base.canary.aa_check_splits if measured else 0}
    canary = (replace(base.canary, mde=None, user_cv=None, mde_from="previous", **from_collect) if previous else
              replace(base.canary, mde=s.mde, user_cv=None if measured else s.user_cv, mde_from="", **from_collect))
    canary = replace(canary, window_users=s.canary_users)
    traffic = replace(base.traffic, users=s.users, max_tasks=s.user_tasks)
    ev = replace(base.eval, max_tasks=s.gate_tasks, min_tasks=s.gate_tasks, workers=s.workers, backend=backend)
    if quick:  # the tiny model: short turns, so a cycle runs in minutes
        h = replace(base.traffic.harness, max_steps=2, max_tokens_per_turn=32)
        traffic = replace(traffic, harness=h, concurrency=2)
        ev = replace(ev, harness=replace(base.eval.harness, max_steps=2, max_tokens_per_turn=32))
    return replace(base, model=production, root=str(root), db=None, traffic=traffic, eval=ev, canary=canary,
                   train=replace(base.train, steps=s.steps), server=replace(base.server, backend=backend),
                   torch_threads=base.torch_threads)


class Traffic:
    """A cycle's own traffic (`builtin_traffic`), timed per round; `canary_only`: no collect
    traffic (a cycle that canaries a candidate made elsewhere trains on none)."""

    def __init__(self, canary_only: bool = False, log: Path | None = None) -> None:
        self.canary_only, self.log = canary_only, log
        # rounds timed by an earlier, interrupted run of this bench (a resumed cycle does not redo them)
        self.rounds: list[dict[str, Any]] = ([json.loads(x) for x in log.read_text().splitlines() if x.strip()]
                                             if log is not None and log.is_file() else [])

    def __call__(self, ctx: TrafficContext) -> Any:
        if self.canary_only and ctx.phase == "collect":
            return []
        ctx.server()  # started once, before the clock: start-up is not traffic
        t = time.monotonic()
        sessions = builtin_traffic(ctx)
        secs = time.monotonic() - t
        got = sessions if isinstance(sessions, list) else []
        busy = sum(float(s.get("latency_s") or 0.0) for s in got)
        self.rounds.append({"phase": ctx.phase, "round": ctx.round, "sessions": len(got),
                            "errors": sum("error" in s for s in got), "seconds": secs,
                            "concurrency": ctx.config.traffic.concurrency,
                            "server_backend": ctx.config.server.backend,
                            "in_flight": busy / secs if secs > 0 else 0.0})
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with self.log.open("a") as fh:
                fh.write(json.dumps(self.rounds[-1]) + "\n")
        return sessions


def decided_by(reason: str, basis: str | None) -> str:
    """What decided a cycle, from its decision's reason (etude.loop.decision's wording)."""
    if basis in ("gate", "gate-only"):
        return basis
    for prefix, by in (("hack alarm", "alarm"), ("guardrail failed", "guardrail"), ("significantly", "readout"),
                       ("always-valid", "readout"), ("undecided", "window"), ("sample ratio", "srm")):
        if reason.startswith(prefix):
            return by
    return "gate" if "gate" in reason else "other"


def hack_model(kind: str, base: str, samples: Path, out: Path, steps: int, seed: int) -> tuple[Path, dict[str, Any]]:
    """HACKS[kind]'s candidate: LoRA SFT of `base` on the shortest prompts of `samples` (a cycle's
    distilled production samples), every completion replaced by the hack's text, for `steps` steps of
    4, merged into a model directory."""
    merged = out / "model"
    # the shortest distinct prompts, one batch of 4 per step: a session's first turns (the request
    # with no history yet), where a hack shows at once, and the cheapest to train on two cores
    prompts = sorted({tuple(json.loads(ln)["prompt_token_ids"]) for ln in samples.read_text().splitlines()
                      if ln.strip()}, key=len)[:4 * steps]
    if not prompts:
        raise EtudeError(f"{samples}: no logged prompt to train the {kind} candidate on")
    text = HACKS[kind][0]
    _, tok = load_model(base)
    comp = completion_ids(tok, Message(role="assistant", content=text))
    data = out / "samples.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps({"prompt_token_ids": list(p), "completion_token_ids": comp,
                                        "reward": {"total": 1.0}}) + "\n" for p in prompts))
    batch = 4
    cfg = load_sft_config(shipped("configs/agent_sft.toml"), {
        "model": base, "epochs": steps * batch / len(prompts), "lr": 1e-3, "warmup_steps": 1, "seed": seed,
        "batch_sequences": batch, "checkpoint_every": 1000, "sources.expert": 0.0, "sources.production": 1.0,
        "sources.production_file": str(data), "lora.enabled": True, "lora.r": 8, "lora.alpha": 16})
    res = run_sft(cfg, out / "sft", progress=False)
    export_merged(res["adapter"], base, merged)
    return merged, {"kind": kind, "text": text, "what": HACKS[kind][1], "prompts": len(prompts), "steps": res["steps"],
                    "last_loss": res["last"].get("loss"), "train_s": res.get("train_s")}


def episode_measures(run: Path, arm: str, cycle: str) -> list[dict[str, Any]]:
    """Per held-out episode of an evaluation folder: resolved and the per-turn behaviour shares."""
    out = []
    for line in (run / "results.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        eff = r.get("efficiency") or {}
        ok = r.get("status") == "ok"
        # counted from the episode's saved trajectory (etude.rewards.terms.repeats, the loop's own count)
        traj = load_trajectory(run / r["trajectory"]) if r.get("trajectory") else None
        n_turns = len(traj.turns) if traj is not None else int(eff.get("turns") or 0)
        rep = repeats(traj) if traj is not None else int(eff.get("repeated_calls") or 0)
        broken = traj.broken_calls if traj is not None else int(eff.get("broken_calls") or 0)
        calls = (sum(len(t.tool_executions) + len(t.parse_errors) for t in traj.turns) if traj is not None
                 else int(eff.get("tool_calls") or 0) + int(eff.get("parse_errors") or 0))
        # an attempted edit (etude.loop.metrics' edit_rate, per episode): a candidate that stops
        # editing has fewer repeated and broken calls and fixes nothing
        edited = (int(any(attempts_edit(x.call) for t in traj.turns for x in t.tool_executions))
                  if traj is not None else None)
        out.append({"record": "confirm", "cycle": cycle, "arm": arm, "task": r["instance_id"], "edited": edited,
                    "status": r.get("status"), "resolved": int(bool(r.get("resolved")) and ok),
                    "turns": n_turns, "repeated_calls": rep, "broken_calls": broken, "calls": calls,
                    "repeat_share": rep / max(1, n_turns), "broken_share": broken / max(1, n_turns),
                    # an episode with no call has broken none of its calls
                    "broken_call_share": broken / calls if calls else 0.0,
                    "tokens": eff.get("tokens")})
    return out


BEHAVIOUR_TERMS = ("repeated_calls", "broken_calls", "unsupported_claims", "needless_clarification", "parallelism",
                   "latency")


def first_weights(samples: Path) -> dict[str, float] | None:
    """The behaviour terms' weights distillation scored a cycle's samples with (None: no sample)."""
    if not samples.is_file():
        return None
    line = next((ln for ln in samples.read_text().splitlines() if ln.strip()), None)
    weights = json.loads(line)["reward"]["weights"] if line else None
    return {k: weights[k] for k in BEHAVIOUR_TERMS if k in weights} if weights else None


def train_lr(train_dir: Path) -> float | None:
    """The learning rate of a cycle's last training step, from its metrics (None: not trained)."""
    lrs = [r["lr"] for r in read_metrics(train_dir) if r.get("kind") == "train" and "lr" in r] if train_dir.is_dir() else []
    return float(lrs[-1]) if lrs else None


def verdict_of(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """The ground truth of one cycle's pair (module doc): the paired differences and whether the
    candidate is better on the primary measure with no guardrail measure significantly worse."""
    out: dict[str, Any] = {}
    for m in MEASURES:
        a = {r["task"]: r[m] for r in recs if r["arm"] == "production" and m in r}
        b = {r["task"]: r[m] for r in recs if r["arm"] == "candidate" and m in r}
        keys = sorted(set(a) & set(b))
        out[m] = stats.paired_mean_diff([a[k] for k in keys], [b[k] for k in keys])
    better = out["repeat_share"]["ci_high"] < 0
    # every guardrail measure present (records before broken_call_share have only broken_share)
    worse = any(out[m]["ci_low"] > 0 for m in MEASURES[1:] if out[m].get("ci_low") is not None)
    # and the edits: episodes with an attempted edit must not fall (records before stop 54 have none)
    a = {r["task"]: r["edited"] for r in recs if r["arm"] == "production" and r.get("edited") is not None}
    b = {r["task"]: r["edited"] for r in recs if r["arm"] == "candidate" and r.get("edited") is not None}
    keys = sorted(set(a) & set(b))
    if keys:
        out["edited"] = stats.paired_mean_diff([a[k] for k in keys], [b[k] for k in keys])
        fewer = out["edited"].get("ci_high") is not None and out["edited"]["ci_high"] < 0
        out["fewer_edits"] = bool(fewer)
        worse = worse or fewer
    return {**out, "better": bool(better), "guardrail_worse": bool(worse), "confirmed": bool(better and not worse)}


class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a, self.quick = a, a.quick
        self.s = QUICK if a.quick else DEFAULT._replace(**{k: v for k, v in (
            ("users", a.users), ("confirm_tasks", a.confirm_tasks), ("steps", a.steps), ("mde", a.mde),
            ("user_cv", a.user_cv), ("aa_splits", a.aa_splits), ("hack_rounds", a.hack_rounds),
            ("canary_users", a.canary_users)) if v is not None})
        self.out = Path(a.out).resolve()
        self.backend = "hf" if a.quick else resolve_backend(a.backend)  # vLLM-CPU cannot run the tiny model
        self.production = "tiny" if a.quick else str(Path(a.production).resolve())
        self.base = LoopConfig.from_toml(a.config or shipped("configs/loop_behaviour.toml"), overrides(a.set))
        self.console = Console(stderr=True)
        self.stages: dict[str, float] = {}
        self.cycles: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []
        self.confirm_cache: dict[str, Path] = {}  # model path -> its held-out evaluation
        self.hacks: list[dict[str, Any]] = []
        self.root = self.out / "loop"  # the cycles' loop root (its store is <root>/etude.db)

    def stage(self, name: str, fn: Any, *args: Any) -> Any:
        self.console.rule(name)
        t = time.monotonic()
        try:
            return fn(*args)
        finally:
            self.stages[name] = round(time.monotonic() - t, 2)

    def confirm_tasks(self) -> list[Any]:
        return resolve_suite("builtin:curriculum:test:1", self.s.confirm_tasks, use="final", where="confirmation")

    def evaluate(self, cfg: LoopConfig, model: str, dest: Path, tasks: list[Any]) -> Path:
        """`model` on the held-out slice (once per model: a promoted candidate's evaluation is
        the next cycle's production's; greedy, so the same episodes)."""
        index = self.out / "confirm" / "index.json"  # model path -> its evaluation, across reruns of the bench
        if not self.confirm_cache and index.is_file():
            self.confirm_cache = {k: Path(v) for k, v in json.loads(index.read_text()).items()}
        if model in self.confirm_cache and (self.confirm_cache[model] / "results.jsonl").is_file():
            return self.confirm_cache[model]
        ecfg = replace(gate_eval_config(cfg, progress=True), max_tasks=None, workers=self.s.workers,
                       backend=self.backend)
        run_eval(tasks, model, dest, ecfg, use="final")
        self.confirm_cache[model] = dest
        index.write_text(json.dumps({k: str(v) for k, v in self.confirm_cache.items()}, indent=1))
        return dest

    def hack_cycle(self, kind: str, samples: Path) -> None:
        """One cycle canarying HACKS[kind]'s candidate (made from the current production) against
        production; it must be rolled back by an alarm, a guardrail or the readout."""
        model, info = self.stage(f"hack {kind}: train", hack_model, kind, self.production, samples,
                                 self.out / "hacks" / kind, self.s.hack_steps, self.base.seed)
        cfg = cycle_config(self.base, self.s, root=self.root, production=self.production,
                           backend=self.backend, previous=False, quick=self.quick)
        cfg = replace(cfg, candidate=str(model), traffic=replace(cfg.traffic, users=self.s.hack_users),
                      # a hack cycle collects nothing: its plan is for the stated noise, its window its users
                      canary=replace(cfg.canary, rounds=self.s.hack_rounds, min_rounds=1, mde=self.s.hack_mde,
                                     user_cv=self.s.user_cv, user_cv_from="", aa_check_splits=0, window_users=None))
        traffic = Traffic(canary_only=True)
        rep = self.stage(f"hack {kind}: cycle", lambda: run_cycle(cfg, traffic=traffic, progress=True).to_dict())
        name = Path(rep["cycle_dir"]).name
        by = decided_by(rep.get("reason") or "", rep.get("basis"))
        rolled = rep.get("decision") == "rollback"
        self.records.append({"record": "hack", "hack": kind, "cycle": name, "decision": rep.get("decision"),
                             "reason": rep.get("reason"), "decided_by": by, "promoted": int(rep.get("decision") == "promote"),
                             "caught": int(rolled and by in CAUGHT_BY)})
        self.add_cycle_records(rep, traffic, [])
        self.hacks.append({"hack": kind, "cycle": name, **info, "decision": rep.get("decision"),
                           "reason": rep.get("reason"), "decided_by": by, "alarms": rep.get("alarms"),
                           "arm_ratios": rep.get("arm_ratios"), "readout_settings": self.readout_settings(rep)})
        self.console.print(f"hack {kind}: {rep.get('decision')} by {by} ({rep.get('reason')})")

    def readout_settings(self, rep: dict[str, Any]) -> dict[str, Any]:
        canary = json.loads((Path(rep["cycle_dir"]) / "state.json").read_text())["config"]["canary"]
        return {"alpha": canary["alpha"], "weights": list(canary["weights"]), "power": canary["power"],
                **({"mde": canary["mde"]} if canary.get("mde") is not None else {}),
                **({"min_look_users": canary["min_look_users"]} if canary.get("min_look_users") else {})}

    def add_cycle_records(self, rep: dict[str, Any], traffic: Traffic, conf: list[dict[str, Any]]) -> None:
        name = Path(rep["cycle_dir"]).name
        self.records += [{"record": "stage", "cycle": name, "stage": n, "status": rep["stages"][n]["status"],
                          "seconds": float(rep["stages"][n].get("wall_s") or 0.0)} for n in STAGES]
        self.records += [{"record": "traffic", "cycle": name, **r, "sessions_per_min": 60.0 * r["sessions"] / r["seconds"]}
                         for r in traffic.rounds if r["seconds"] > 0]
        rows_file = Path(rep["cycle_dir"]) / "ab_rows.jsonl"
        rows = [json.loads(x) for x in rows_file.read_text().splitlines() if x.strip()] if rows_file.is_file() else []
        self.records += [{"record": "ab", "cycle": name, **r} for r in rows]
        self.records += conf

    def read_canary(self) -> bool:
        """Whether an earlier cycle read a canary on the primary metric (its effect plans the next)."""
        probe = cycle_config(self.base, self.s, root=self.root, production=self.production,
                             backend=self.backend, previous=False, quick=self.quick)
        try:
            previous_effect(probe)
        except EtudeError:
            return False
        return True

    def one_cycle(self, index: int, tasks: list[Any]) -> None:
        cfg = cycle_config(self.base, self.s, root=self.root, production=self.production,
                           backend=self.backend, previous=self.read_canary(), quick=self.quick)
        cdir = self.root / f"cycle-{index:04d}"  # explicit, so a rerun of the bench resumes it
        traffic = Traffic(log=self.out / "traffic" / f"{cdir.name}.jsonl")
        rep = self.stage(f"cycle {index}", lambda: run_cycle(cfg, cycle_dir=cdir, traffic=traffic,
                                                             progress=True).to_dict())
        name = Path(rep["cycle_dir"]).name
        state = json.loads((Path(rep["cycle_dir"]) / "state.json").read_text())
        prod, cand = rep["production_before"], rep.get("candidate")
        conf: list[dict[str, Any]] = []
        verdict: dict[str, Any] | None = None
        if cand:
            dirs = {"production": self.out / "confirm" / f"{name}-production",
                    "candidate": self.out / "confirm" / f"{name}-candidate"}
            got = {arm: self.stage(f"{name}: held-out {arm}", self.evaluate, cfg, m["path"], dirs[arm], tasks)
                   for arm, m in (("production", prod), ("candidate", cand))}
            conf = [r for arm, d in got.items() for r in episode_measures(d, arm, name)]
            verdict = verdict_of(conf)
        promoted = rep.get("decision") == "promote"
        collect = state["stages"]["collect"]["outputs"]
        pilot_rows = window_rows(open_store(cfg.db_url()), cfg, collect["since"], collect["until"])
        plan = json.loads((Path(rep["cycle_dir"]) / "plan.json").read_text()) if (Path(rep["cycle_dir"]) / "plan.json").is_file() else None
        rule_cfg = replace(cfg, canary=canary_of(plan, cfg)) if plan else cfg
        aa = aa_rates(pilot_rows, rule_cfg, splits=self.s.aa_splits, seed=index)
        self.records.append({
            "record": "cycle", "cycle": name, "index": index, "decision": rep.get("decision"),
            "basis": rep.get("basis"), "reason": rep.get("reason"), "promoted": int(promoted),
            "confirmed": None if verdict is None else int(verdict["confirmed"]),
            "true_promotion": int(promoted and bool(verdict and verdict["confirmed"])),
            "false_promotion": int(promoted and not (verdict and verdict["confirmed"])),
            "missed_improvement": int(rep.get("decision") == "rollback" and bool(verdict and verdict["confirmed"])),
            # the stages' own seconds (a rerun of the bench that resumes a finished cycle redoes none)
            "wall_s": sum(float(st.get("wall_s") or 0.0) for st in rep["stages"].values())})
        self.add_cycle_records(rep, traffic, conf)
        self.records += [{"record": "aa_split", "cycle": name, "split": o["split"], "outcome": o["outcome"],
                          "promote": int(o["outcome"] == "promote"),
                          "rollback": int(o["outcome"] in ("guardrail", "alarm"))} for o in aa["outcomes"]]
        measured_cv = collect_user_cv(pilot_rows, cfg)[0]  # None: fewer than two users with the metric
        self.cycles.append({
            "cycle": name, "production_before": prod, "candidate": cand, "production_after": rep.get("production_after"),
            "decision": rep.get("decision"), "reason": rep.get("reason"), "basis": rep.get("basis"),
            "plan": plan, "settled": rep.get("plan"), "collect_user_cv": measured_cv,
            "readout_settings": self.readout_settings(rep),
            # the config the cycle was created with; a rerun of the bench may resume it with --set changes,
            # so what distillation actually weighed is read from its samples
            "config": {k: state["config"][k] for k in ("train", "distill", "traffic", "canary")},
            "distill_weights": first_weights(Path(rep["cycle_dir"]) / "samples.jsonl"),
            "train_lr": train_lr(Path(rep["cycle_dir"]) / "train"),
            "distill": rep.get("distill"), "train": {k: v for k, v in (rep.get("train") or {}).items() if k != "history"},
            "train_history": (rep.get("train") or {}).get("history"), "gate": rep.get("eval"),
            "alarms": rep.get("alarms"), "arm_ratios": rep.get("arm_ratios"), "verdict": verdict,
            "aa": {k: aa[k] for k in ("splits", "users") if k in aa}, "traffic_rounds": traffic.rounds})
        self.console.print(f"{name}: {rep.get('decision')} ({rep.get('reason')}); ground truth "
                           f"{None if verdict is None else {m: round(verdict[m]['mean_diff'], 4) for m in MEASURES}}")
        if promoted:
            self.production = cand["path"]  # what the registry now serves (a later cycle reads it there)


def figures_of(records: list[dict[str, Any]], cycles: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    def some(sel: dict[str, Any]) -> bool:
        return any(all(r.get(k) == v for k, v in sel.items()) for r in records)

    cyc = {"record": "cycle"}
    figs: dict[str, dict[str, Any]] = {} if not some(cyc) else {
        "true_promotions": {"kind": "rate", "of": cyc, "field": "true_promotion"},
        "false_promotions": {"kind": "rate", "of": cyc, "field": "false_promotion"},
        "promoted": {"kind": "rate", "of": cyc, "field": "promoted"},
        "missed_improvements": {"kind": "rate", "of": cyc, "field": "missed_improvement"},
        "cycle_s.total": {"kind": "mean", "of": cyc, "field": "wall_s"},
    }
    if some({"record": "aa_split"}):
        figs["aa_false_promotion_rate"] = {"kind": "rate", "of": {"record": "aa_split"}, "field": "promote"}
        figs["aa_false_rollback_rate"] = {"kind": "rate", "of": {"record": "aa_split"}, "field": "rollback"}
    if some({"record": "traffic"}):
        figs["sessions_per_min"] = {"kind": "mean", "of": {"record": "traffic"}, "field": "sessions_per_min"}
        figs["sessions_in_flight"] = {"kind": "mean", "of": {"record": "traffic"}, "field": "in_flight"}
    for st in STAGES:
        sel = {"record": "stage", "stage": st, "status": "done"}
        if some(sel):
            figs[f"cycle_s.{st}"] = {"kind": "mean", "of": sel, "field": "seconds"}
    if some({"record": "hack"}):
        figs["hacks_caught"] = {"kind": "rate", "of": {"record": "hack"}, "field": "caught"}
        figs["hacks_promoted"] = {"kind": "rate", "of": {"record": "hack"}, "field": "promoted"}
        for kind in HACKS:
            if some({"record": "hack", "hack": kind}):
                figs[f"caught.{kind}"] = {"kind": "rate", "of": {"record": "hack", "hack": kind}, "field": "caught"}
    for c in cycles:
        name = c["cycle"]
        for metric in sorted({r["metric"] for r in records if r["record"] == "ab" and r["cycle"] == name}):
            figs[f"lift.{name}.{metric}"] = {"kind": "ab", "of": {"record": "ab", "cycle": name}, "metric": metric,
                                             **c["readout_settings"]}
        conf = {"record": "confirm", "cycle": name}
        if some(conf):
            a, b = {**conf, "arm": "production"}, {**conf, "arm": "candidate"}
            for m in MEASURES:
                figs[f"confirm.{name}.{m}"] = {"kind": "paired_mean", "a": a, "b": b, "key": "task", "field": m}
            figs[f"confirm.{name}.resolved"] = {"kind": "paired", "a": a, "b": b, "key": "task", "field": "resolved"}
            if all(r.get("edited") is not None for r in records if all(r.get(k) == v for k, v in conf.items())):
                figs[f"confirm.{name}.edited"] = {"kind": "paired_mean", "a": a, "b": b, "key": "task",
                                                  "field": "edited"}
            figs[f"production_repeat_share.{name}"] = {"kind": "mean", "of": a, "field": "repeat_share"}
    return figs


def plot(records: list[dict[str, Any]], cycles: list[dict[str, Any]], path: Path) -> None:
    """The held-out repeat share of each cycle's production and candidate, cycle by cycle."""
    import matplotlib  # noqa: PLC0415 - plotting only when a result is written

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for arm, style in (("production", "o-"), ("candidate", "s--")):
        xs, ys = [], []
        for i, c in enumerate(cycles, 1):
            v = [r["repeat_share"] for r in records if r["record"] == "confirm" and r["cycle"] == c["cycle"]
                 and r["arm"] == arm]
            if v:
                xs.append(i)
                ys.append(sum(v) / len(v))
        ax.plot(xs, ys, style, label=arm)
    ax.set_xlabel("cycle")
    ax.set_ylabel("held-out repeated calls per turn")
    ax.set_xticks(range(1, len(cycles) + 1))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--production", help="production's model directory (a warm start: etude sft --config "
                                         "configs/agent_sft.toml)")
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--config", help="loop config (default: the shipped loop_behaviour.toml)")
    ap.add_argument("--backend", default="auto", help="engine of the server and the evaluations: auto, hf or vllm")
    ap.add_argument("--out", default="runs/loop_cycles")
    ap.add_argument("--results", help="result file (default bench/results/loop_cycles.json; --quick: OUT/loop_cycles.json)")
    ap.add_argument("--users", type=int)
    ap.add_argument("--canary-users", type=int, help="users of a canary round (default: 100; --quick: --users)")
    ap.add_argument("--confirm-tasks", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--mde", type=float)
    ap.add_argument("--user-cv", type=float)
    ap.add_argument("--aa-splits", type=int)
    ap.add_argument("--hacks", default="",
                    help="instead of the cycles: canary these hack candidates (comma-separated of quit, clarify, "
                         "broken), each trained from --production on the prompts of --samples; writes loop_hacks.json")
    ap.add_argument("--hack-rounds", type=int, help="--hacks: canary rounds per hack cycle (default 1)")
    ap.add_argument("--samples", help="--hacks: a cycle's distilled production samples (default "
                                      "OUT/loop/cycle-0001/samples.jsonl, the cycles' first window)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a key of the loop config for the cycles this run starts (e.g. train.lr=1e-5); "
                         "each cycle's config is in meta.cycles[].config")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    try:
        overrides(a.set)
    except ValueError as e:
        print(f"loop_cycles: {e}", file=sys.stderr)
        return 2
    if not a.quick and not a.production:
        print("loop_cycles: give --production DIR (a warm start) or --quick", file=sys.stderr)
        return 2
    if a.cycles < 1:
        print("loop_cycles: --cycles must be at least 1", file=sys.stderr)
        return 2
    hacks = [h.strip() for h in a.hacks.split(",") if h.strip()]
    bad = [h for h in hacks if h not in HACKS]
    if bad:
        print(f"loop_cycles: unknown hack(s) {', '.join(bad)}; known: {', '.join(HACKS)}", file=sys.stderr)
        return 2
    samples = Path(a.samples or Path(a.out) / "loop" / "cycle-0001" / "samples.jsonl")
    if hacks and not samples.is_file():
        print(f"loop_cycles: --hacks trains on logged prompts, and {samples} does not exist (run the cycles first, "
              f"or give --samples)", file=sys.stderr)
        return 2
    t0 = time.time()
    b = Bench(a)
    stem = "loop_hacks" if hacks else "loop_cycles"
    results = Path(a.results) if a.results else (b.out / f"{stem}.json" if a.quick else RESULTS / f"{stem}.json")
    results.parent.mkdir(parents=True, exist_ok=True)
    if hacks:
        b.root = b.out / "hacks"  # a store of their own: the cycles' registry is left as it is
        if (b.root / "etude.db").is_file():  # a hack promoted there would be the control of the next one
            prod = registry.production(open_store(f"sqlite:///{(b.root / 'etude.db').resolve()}"), None)
            if prod is not None and Path(prod.path).resolve() != Path(b.production).resolve():
                print(f"loop_cycles: {b.root}'s production is {prod.path}, not --production {b.production} (an "
                      f"earlier hack was promoted there): use a fresh --out", file=sys.stderr)
                return 2
        for kind in hacks:
            b.hack_cycle(kind, samples)
        meta = {"what": "reward-hacking candidates, each made by training (LoRA SFT of production on its users' "
                        "logged prompts with the hack's text as every completion), canaried against production: "
                        "each must be rolled back by an alarm, a guardrail or the readout",
                "quick": a.quick, "sizes": b.s._asdict(), "production": str(a.production or "tiny"),
                "backend": b.backend, "hacks": b.hacks, "samples": str(samples),
                "rule": f"caught: rolled back, decided by {', '.join(CAUGHT_BY)} (not the gate or the window's end)"}
        write_result(results, figures_of(b.records, []), b.records,
                     provenance(seeds={"loop": b.base.seed}, started=t0, stages=b.stages), meta=meta)
        print(f"wrote {results}")
        return 0
    tasks = b.confirm_tasks()
    for i in range(1, a.cycles + 1):
        b.one_cycle(i, tasks)
    figures = figures_of(b.records, b.cycles)
    meta = {"what": "consecutive real-time cycles teaching production fewer repeated calls from its own users' "
                    "traffic, each decision checked on held-out tasks no cycle used",
            "quick": a.quick, "sizes": b.s._asdict(), "production": str(a.production or "tiny"),
            "backend": b.backend, "confirm_tasks": [t.instance_id for t in tasks], "cycles": b.cycles,
            "rule": "true promotion: promoted, and held out the candidate's paired mean repeat_share is below "
                    "production's (95% bootstrap interval below 0) with neither broken_share's (per turn) nor "
                    "broken_call_share's (per attempted call) interval wholly above 0, nor the share of episodes "
                    "with an attempted edit (edited) wholly below 0",
            "note": "cycle 1 plans for --mde, later cycles for the previous cycle's measured lift; the per-user "
                    "noise is the collect window's (cycles[].collect_user_cv) under [canary] user_cv_from = "
                    "\"collect\", else --user-cv for cycle 1 and the previous readout's after"}
    write_result(results, figures, b.records,
                 provenance(seeds={"loop": b.base.seed}, started=t0, stages=b.stages), meta=meta)
    plot(b.records, b.cycles, results.with_suffix(".png"))
    print(f"wrote {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
