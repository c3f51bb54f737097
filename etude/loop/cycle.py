"""One real-time RL cycle, top to bottom: collect → distill → train → eval → register → canary →
readout → decide (promote or roll back). Read `run_cycle`, then one function per stage.

- collect:  traffic to production only (no experiment), window [since, until) of the org.
- distill:  etude.loop.distill of that window → `samples.jsonl` (token ids, behaviour
            log-probs, rewards) and `episodes.jsonl` (the same as the learner's episodes); too
            few samples ends the cycle with decision "skip".
- train:    etude.train.loop on those episodes (etude.loop.training) from the production
            checkpoint's weights → a model directory.
- eval:     etude.evals.run_eval of production and candidate on the held-out suite, then
            etude.evals.compare (production = A, candidate = B) → gate passed / failed /
            inconclusive (a suite below eval.min_tasks is refused: the stage fails with that error).
- register: the candidate in the registry (state candidate, parent = production); a failed gate,
            or an inconclusive one under eval.on_inconclusive = "rollback", skips canary and
            readout and rolls back.
- canary:   an experiment routes `canary.weights` of the org's users to control / canary; rounds
            of traffic, each followed by an interim readout, until the decision rule decides or
            `canary.rounds` is reached (the max window).
- readout:  the final A/B readout (etude.experiments.analyze on per-user rows from the store),
            arm ratios and hack alarms → `readout.json`.
- decide:   the rule (docs/loop.md): roll back on SRM, a fired alarm or a failed guardrail;
            promote when the primary metric's msprt_p < alpha with a positive lift, or its
            always-valid lift interval lies above -harm_margin; otherwise (the window is spent)
            roll back. A required gate that was inconclusive never promotes.

Every stage is idempotent and the cycle is resumable (see state.py): rerunning after a kill -9
resumes at the first unfinished stage and never redoes a finished one. Not guaranteed: a stage
interrupted mid-way and rerun repeats its side effects that are not idempotent by nature —
interrupted traffic rounds send more traffic (the window grows), an interrupted eval resumes
from its durable records.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etude.errors import EtudeError, NotFound
from etude.evals import CompareConfig, EvalConfig, compare, run_eval
from etude.evals.codelm import code_gate
from etude.evals.runner import resolve_suite
from etude.experiments import analyze
from etude.harness import HarnessConfig
from etude.loop.config import LoopConfig
from etude.loop.decision import decide, gate_only, gate_status, gated, inconclusive_reason
from etude.loop.distill import DistillConfig, distill
from etude.loop.metrics import ab_rows, alarms, arm_ratios, interaction_facts
from etude.loop.plan import (
    CanaryPlan,
    aa_check,
    as_registered_before,
    canary_of,
    collect_user_cv,
    registered_plan,
    resettle,
    settle,
    specialised_candidate,
    window_rows,
)
from etude.loop.population import make_population, repo_of
from etude.loop.readout import ab_config
from etude.loop.server import running_server
from etude.loop.state import STAGES, CycleState
from etude.loop.training import episodes_jsonl, export_merged, is_adapter, train_candidate
from etude.loop.users import run_population
from etude.policy.vllm_backend import require_vllm
from etude.serve import registry
from etude.serve.config import ServeConfig
from etude.serve.run import ensure_model
from etude.store import open_store
from etude.tasks import load_tasks, save_tasks, seal
from etude.tasks.seal import check_sources


@dataclass
class TrafficContext:
    """What a traffic hook gets: the phase ("collect" | "canary"), the round, and the way to the
    server. `server()` starts the loop's own server (once) and returns its /v1 URL."""

    phase: str
    round: int
    org: str
    db: str
    api_key: str
    cycle_dir: Path
    config: LoopConfig
    server: Callable[[], str]
    progress: bool = False


TrafficHook = Callable[[TrafficContext], Any]


@dataclass
class CycleReport:
    cycle: int
    cycle_dir: str
    state: dict[str, Any]
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def decision(self) -> str | None:
        return self.state["stages"]["decide"]["outputs"].get("decision")

    def to_dict(self) -> dict[str, Any]:
        st = self.state["stages"]
        out = lambda name: st[name]["outputs"]  # noqa: E731
        return {
            "cycle": self.cycle, "cycle_dir": self.cycle_dir, "finished": self.state.get("finished", False),
            "stages": {n: {"status": st[n]["status"], "wall_s": st[n].get("wall_s"),
                           "total_wall_s": st[n].get("total_wall_s"), "attempts": st[n].get("attempts", 0)}
                       for n in STAGES},
            "production_before": self.state.get("production"),
            "collect": out("collect"), "distill": out("distill").get("summary"),
            "train": {k: v for k, v in out("train").items() if k != "history"} | {"history": out("train").get("history")},
            "eval": out("eval").get("verdict"), "candidate": out("register").get("checkpoint"),
            "canary": {k: v for k, v in out("canary").items() if k != "readouts"},
            "ab": out("readout").get("ab"), "arm_ratios": out("readout").get("arm_ratios"),
            "alarms": out("readout").get("alarms"),
            "plan": self.state.get("plan"), "basis": out("decide").get("basis"),
            "primary": ((self.state.get("config") or {}).get("canary") or {}).get("primary"),
            "decision": out("decide").get("decision"), "reason": out("decide").get("reason"),
            "production_after": out("decide").get("production"), "wall_s": self.wall_s,
        }


# -- cycle directories ------------------------------------------------------------------------
def cycle_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("cycle-[0-9][0-9][0-9][0-9]") if (p / "state.json").is_file())


def next_cycle_dir(root: Path) -> Path:
    """The unfinished cycle to resume, else a new one after the last."""
    dirs = cycle_dirs(root)
    if dirs and not json.loads((dirs[-1] / "state.json").read_text()).get("finished"):
        return dirs[-1]
    last = int(dirs[-1].name.split("-")[1]) if dirs else 0
    return root / f"cycle-{last + 1:04d}"


# -- the cycle --------------------------------------------------------------------------------
def run_cycle(config: LoopConfig, *, cycle_dir: str | Path | None = None, traffic: TrafficHook | None = None,
              progress: bool = True) -> CycleReport:
    """Run (or resume) one cycle; returns its report (also in `cycle_dir/report.json`)."""
    if config.server.backend == "vllm":  # one line naming `make setup-vllm`, before anything is written
        require_vllm("the loop's server backend vllm ([server] backend / --backend)")
    if config.eval.backend == "vllm":
        require_vllm("the eval gate's backend vllm ([eval] backend)")
    if config.specialise:
        check_org(config)  # before anything is written: a bad --org leaves no trace
    # the sealed test split (etude.tasks.seal): neither users' requests nor the gate come from it
    contamination = check_sources([("[traffic] tasks", config.traffic.tasks if config.traffic.kind == "scripted" else None),
                                   ("[eval] suite", config.eval.suite)], config.allow_test_split)
    if config.traffic.kind == "scripted" and not config.specialise:
        check_traffic_gate(config)  # the candidate trains on traffic: its gate must hold none of it
    root = Path(config.root)
    cdir = Path(cycle_dir) if cycle_dir else next_cycle_dir(root)
    planned = _settled_plan(config, cdir)  # an unreachable plan under "refuse" stops here, nothing written
    if planned.mode == "gate-only":
        again = config.canary.user_cv_from == "collect" and planned.users_per_arm is not None
        print(f"etude loop: {'planned again on the collect window' if again else 'gate-only decision'}: "
              f"{planned.line}", file=sys.stderr, flush=True)
    config = planned.apply(config)
    root.mkdir(parents=True, exist_ok=True)
    index = int(m.group(1)) if (m := re.search(r"(\d+)$", cdir.name)) else 1
    t0 = time.monotonic()
    with ExitStack() as stack:
        run = _Cycle(config, cdir, index, traffic, stack, progress)
        if contamination:
            run.state.data["contamination"] = contamination
        if "plan" not in run.state.data:
            run.state.data["plan"] = planned.to_dict()
            run.state.save()
        run.all_stages()
    report = CycleReport(index, str(cdir), run.state.data, wall_s=round(time.monotonic() - t0, 3))
    _write_json(cdir / "report.json", report.to_dict())
    return report


def _settled_plan(cfg: LoopConfig, cdir: Path) -> CanaryPlan:
    """The canary plan a resumed cycle started with, else a new one (etude.loop.plan.settle)."""
    state = cdir / "state.json"
    if state.is_file() and "plan" in (data := json.loads(state.read_text())):
        return CanaryPlan.from_dict(data["plan"])
    return settle(cfg, open_store(cfg.db_url()))


def check_org(cfg: LoopConfig) -> None:
    """`--org ORG` needs an organisation with an API key of its own (not one the loop made for
    itself) and a shared production checkpoint to specialise; EtudeError (one line) otherwise."""
    store = open_store(cfg.db_url())
    keys = [k for k in store.list_keys(cfg.org) if k["revoked_at"] is None and not str(k["name"]).startswith("loop-")]
    if not keys:
        raise EtudeError(f"organisation {cfg.org!r} has no API key: create one with `etude keys create --org "
                         f"{cfg.org}` (nothing was trained, the registry and the router are unchanged)")
    if registry.production(store, None) is None:
        raise EtudeError(f"no shared production checkpoint to specialise for {cfg.org!r}: serve or register one first "
                         f"(nothing was trained, the registry and the router are unchanged)")


class _Cycle:
    """The state of one cycle run; each stage is a method."""

    def __init__(self, cfg: LoopConfig, cdir: Path, index: int, traffic: TrafficHook | None, stack: ExitStack,
                 progress: bool) -> None:
        self.cfg, self.dir, self.index, self.stack, self.show = cfg, cdir, index, stack, progress
        self.store = open_store(cfg.db_url())
        self.state = CycleState.load_or_create(cdir, index, cfg.to_dict())
        self._ensure_production()
        self.traffic = traffic or builtin_traffic
        self._key: str | None = None
        self._base_url: str | None = None

    # -- plumbing
    def _ensure_production(self) -> None:
        if "production" not in self.state.data:
            prod = registry.production(self.store, self.cfg.org)
            if prod is None:
                prod = ensure_model(self.store, ServeConfig(model=self.cfg.model))
            self.state.data["production"] = {"name": prod.name, "path": prod.path, "version": prod.version}
            self.state.save()
        self.prod = self.state.data["production"]

    def api_key(self) -> str:
        if self._key is None:  # a fresh key per run, revoked when the run ends: none is kept on disk
            key = self._key = self.store.create_key(self.cfg.org, name=f"loop-{self.index}")
            self.stack.callback(self.store.revoke_key, self.cfg.org, key.split("_")[1])
        return self._key

    def server(self) -> str:
        if self._base_url is None:
            srv = self.cfg.server
            h = self.stack.enter_context(running_server(
                self.cfg.db_url(), model=self.cfg.model, threads=self.cfg.traffic.threads,
                log_path=self.dir / "server.log", backend=srv.backend, max_batch=srv.max_batch,
                startup_timeout_s=srv.startup_timeout_s))
            self._base_url = h.base_url
        return self._base_url

    def _traffic(self, phase: str, rnd: int) -> Any:
        ctx = TrafficContext(phase, rnd, self.cfg.org, self.cfg.db_url(), self.api_key(), self.dir, self.cfg,
                             self.server, self.show)
        return self.traffic(ctx)

    def all_stages(self) -> None:
        from rich.console import Console

        if self.cfg.torch_threads:
            import torch

            torch.set_num_threads(self.cfg.torch_threads)
        con = Console(stderr=True, quiet=not self.show)
        for name in STAGES:
            if self.state.status(name) in ("done", "skipped"):
                con.print(f"[dim]cycle {self.index} · {name}: {self.state.status(name)} (not redone)[/dim]")
                continue
            with con.status(f"cycle {self.index} · {name} …"):
                self.state.start(name)
                getattr(self, f"stage_{name}")()
            s = self.state.stage(name)
            con.print(f"cycle {self.index} · {name}: {s['status']} in {s.get('wall_s', 0):.1f} s")
        self.state.data["finished"] = True
        self.state.save()

    def _skip_rest(self, after: str, reason: str, decision: str | None = None) -> None:
        for name in STAGES[STAGES.index(after) + 1:]:
            if name == "decide" and decision is not None:
                continue
            self.state.skip(name, reason)
        if decision is not None:
            self.state.stage("decide")["outputs"].update(planned=decision, planned_reason=reason)
            self.state.save()

    # -- stages
    def stage_collect(self) -> None:
        out = self.state.stage("collect")["outputs"]
        since = out.get("since") or time.time()
        self.state.progress("collect", since=since)
        sessions = self._traffic("collect", 0)
        until = time.time()
        n = len(self.store.interactions(org=self.cfg.org, since=since, until=until))
        if n == 0 and self.cfg.specialise:  # not finished: a rerun collects again (same since)
            raise EtudeError(f"organisation {self.cfg.org!r} has no interactions in the collection window: nothing to "
                             f"train its adapter on (nothing was trained, the registry and the router are unchanged)")
        extra: dict[str, Any] = {}
        if self.cfg.canary.user_cv_from == "collect" and self.cfg.traffic.kind == "scripted":
            extra = self._plan_from_collect(since, until)
        self.state.finish("collect", since=since, until=until, interactions=n, sessions=_session_summary(sessions),
                          **extra)
        if extra.get("refused"):
            self._skip_rest("collect", extra["refused"], "skip")

    def _plan_from_collect(self, since: float, until: float) -> dict[str, Any]:
        """`[canary] user_cv_from = "collect"`: the plan again, for the noise production's users
        showed in this window (etude.loop.plan.resettle), saved before the canary's first user.
        The collect stage's outputs, with "refused" when the plan is unreachable under "refuse"."""
        rows = window_rows(self.store, self.cfg, since, until)  # read once: the noise and the A/A check
        cv, users = collect_user_cv(rows, self.cfg)
        out: dict[str, Any] = {"user_cv": cv, "user_cv_users": users}
        if cv is None:
            return out
        old = CanaryPlan.from_dict(self.state.data["plan"])
        try:
            new = resettle(self.cfg, self.store, old, cv, users)
            if new.mode == "ab" and self.cfg.canary.aa_check_splits:
                new, out["aa_check"] = aa_check(self.cfg, new, rows, seed=self.index)
        except EtudeError as e:
            return {**out, "refused": str(e)}
        if new.mode == "gate-only" and old.mode != "gate-only":
            print(f"etude loop: gate-only decision: {new.line}", file=sys.stderr, flush=True)
        self.state.data["plan"] = new.to_dict()
        return out

    def stage_distill(self) -> None:
        c = self.state.stage("collect")["outputs"]
        dc = DistillConfig(max_staleness=self.cfg.distill.max_staleness,
                           latency_budget_s=self.cfg.distill.latency_budget_s,
                           reward=self.cfg.distill.reward_config())
        res = distill(self.store, self.cfg.org, (c["since"], c["until"]), dc)
        path = self.dir / "samples.jsonl"
        _write_text(path, "".join(json.dumps(s.to_dict()) + "\n" for s in res))
        # what the trainer replays
        _write_text(self.dir / "episodes.jsonl",
                    episodes_jsonl(res, self.cfg.train.baseline, self.cfg.train.negative_weight))
        self.state.finish("distill", summary=res.summary(), path=str(path))
        if len(res) < self.cfg.train.min_samples and not self.cfg.candidate:
            self._skip_rest("distill", f"{len(res)} samples < train.min_samples {self.cfg.train.min_samples}", "skip")

    def stage_train(self) -> None:
        if self.cfg.candidate:  # trained elsewhere: canary it as it is
            if not Path(self.cfg.candidate).is_dir():
                raise EtudeError(f"--candidate {self.cfg.candidate}: not a model directory")
            self.state.finish("train", checkpoint=str(Path(self.cfg.candidate).resolve()), given=True, steps=0,
                              samples=0, base=self.prod["path"], adapter=is_adapter(self.cfg.candidate), history=[])
            return
        cp = specialised_candidate(self.store, self.cfg.org) if self.cfg.specialise else None
        if cp is not None:  # `etude specialise --register` trained it: canary that adapter, train nothing
            self.state.data["base"] = {"name": cp.meta.get("base"), "path": cp.meta["base"]}
            self.state.finish("train", checkpoint=cp.path, specialised=cp.name, base=cp.meta["base"], steps=0,
                              samples=0, adapter=True, history=[])
            return
        summ = train_candidate(self.dir / "episodes.jsonl", self._base(), self.dir / "train", self.cfg.train,
                               temperature=self.cfg.traffic.sampling_temperature(), seed=self.cfg.seed + self.index,
                               lora=self.cfg.specialise)
        self.state.finish("train", **summ)

    def _base(self) -> str:
        """What the candidate is trained from: production's weights; for an org's adapter
        (`specialise`), the shared production checkpoint, recorded in state.json so a resumed
        cycle keeps the same base."""
        if not self.cfg.specialise:
            return self.prod["path"]
        if "base" not in self.state.data:
            shared = registry.production(self.store, None)
            if shared is None:
                raise EtudeError("no shared production checkpoint to train the organisation's adapter on")
            self.state.data["base"] = {"name": shared.name, "path": shared.path}
            self.state.save()
        return self.state.data["base"]["path"]

    def _model_dir(self, path: str, name: str) -> str:
        """A model directory the eval harness loads: an adapter is merged into its base first
        (under `<root>/merged/<name>`, kept for later cycles)."""
        if not is_adapter(path):
            return path
        cp = registry.get_checkpoint(self.store, name) if name == self.prod["name"] else None
        base = (cp.meta.get("base") if cp else None) or self._base()
        return str(export_merged(path, base, Path(self.cfg.root) / "merged" / name))

    def stage_eval(self) -> None:
        ecfg = self._eval_config()
        suite = self.cfg.eval.suite
        if self.cfg.specialise:  # the org's own held-out tasks, from its repositories
            suite = str(Path(self.cfg.root) / "heldout.jsonl")
            save_tasks(org_tasks(self.cfg)[1], suite)
        prod_dir = Path(self.cfg.root) / "evals" / f"{self.prod['name']}-{_eval_key(ecfg, suite)}"
        cand_dir = self.dir / "eval-candidate"
        a = run_eval(suite, self._model_dir(self.prod["path"], self.prod["name"]), prod_dir, ecfg, use="gate")
        trained = self.state.stage("train")["outputs"]
        cand_name = trained.get("specialised") or f"{self.cfg.name}-c{self.index:04d}"
        b = run_eval(suite, self._model_dir(trained["checkpoint"], cand_name), cand_dir, ecfg, use="gate")
        cc = CompareConfig(rule=self.cfg.eval.rule, min_tasks=self.cfg.eval.min_tasks,
                           **({"margins": dict(self.cfg.eval.margins)} if self.cfg.eval.margins is not None else {}))
        verdict = compare(prod_dir, cand_dir, cc, use="gate")
        code = self._code_gate(trained, cand_name)
        if code is not None:  # an adapter trained by time: its gate lines beside the held-out tasks
            verdict["code"] = code
            if not code["passed"]:
                verdict["gate_passed"] = False
                verdict["gate"] = "failed"
                verdict["regressions"] = [*verdict.get("regressions", []), f"code gate: {code['why']}"]
        _write_json(self.dir / "eval-compare.json", verdict)
        short = {"gate": verdict["gate"], "gate_passed": verdict["gate_passed"], "regressions": verdict["regressions"],
                 "inconclusive": verdict["inconclusive"], "improvements": verdict["improvements"],
                 "tasks": verdict["tasks"], "min_tasks": verdict["min_tasks"],
                 "metrics": {m: {k: verdict["metrics"][m].get(k) for k in ("a", "b", "delta", "ci_low", "ci_high",
                                                                          "p_value", "ni_p_value", "verdict",
                                                                          "regression")}
                             for m in ("resolved", "adherence", "reward", "broken_calls")},
                 "production_resolved": a["correctness"]["resolved_rate"]["mean"],
                 "candidate_resolved": b["correctness"]["resolved_rate"]["mean"], "production_dir": str(prod_dir),
                 "suite": suite, "code": verdict.get("code"),
                 "candidate_dir": str(cand_dir)}
        self.state.finish("eval", verdict=short)

    def _code_gate(self, trained: dict[str, Any], cand_name: str) -> dict[str, Any] | None:
        """For a candidate of `etude specialise --until`: production and candidate on the run's gate
        lines (etude.pipeline.specialise_time.code_gate); None for any other candidate."""
        if not trained.get("specialised"):
            return None
        cp = registry.get_checkpoint(self.store, trained["specialised"])
        if cp.meta.get("kind") != "specialised-by-time":
            return None
        return code_gate(cp.meta["report"], self._model_dir(self.prod["path"], self.prod["name"]),
                         self._model_dir(trained["checkpoint"], cand_name))

    def _eval_config(self) -> Any:
        return gate_eval_config(self.cfg, progress=self.show)

    def stage_register(self) -> None:
        trained = self.state.stage("train")["outputs"]
        name = trained.get("specialised") or f"{self.cfg.name}-c{self.index:04d}"
        path = trained["checkpoint"]
        try:
            cp = registry.get_checkpoint(self.store, name)  # registered before a crash: keep it
        except NotFound:
            meta = {"cycle": self.index, "loop": self.cfg.name}
            if self.cfg.specialise:
                meta["base"] = self._base()
            cp = registry.register_checkpoint(self.store, name, path, version=int(self.prod["version"]) + 1,
                                              parent=self.prod["name"], meta=meta,
                                              org=self.cfg.org if self.cfg.specialise else None)
        self.state.finish("register", checkpoint={"name": cp.name, "path": cp.path, "version": cp.version})
        gate = self.state.stage("eval")["outputs"]["verdict"]
        plan = self.state.data.get("plan") or {}
        if plan.get("mode") == "gate-only":  # no canary: the gate alone decides, and says so
            verdict, reason = gate_only(gate, plan["line"])
            self._skip_rest("register", reason, verdict)
            return
        if not self.cfg.eval.required:
            return
        status = gate_status(gate)
        if status == "failed":
            self._skip_rest("register", f"eval gate failed: {', '.join(gate['regressions'])}", "rollback")
        elif status == "inconclusive" and self.cfg.eval.on_inconclusive == "rollback":
            self._skip_rest("register", f"eval gate {inconclusive_reason(gate)}", "rollback")

    def stage_canary(self) -> None:
        c, out = self.cfg.canary, self.state.stage("canary")["outputs"]
        exp_id = f"{self.cfg.name}-canary-c{self.index:04d}"
        cand = self.state.stage("register")["outputs"]["checkpoint"]["name"]
        if "since" not in out:
            self.state.progress("canary", since=time.time(), experiment=exp_id, rounds=0, readouts=[])
        # A salt derived from the config makes the user split reproducible for a given seed.
        salt = hashlib.sha256(f"{exp_id}:{self.cfg.seed}".encode()).hexdigest()[:16]
        registry.set_experiment(self.store, exp_id, [("control", self.prod["name"], c.weights[0]),
                                                     ("canary", cand, c.weights[1])], org=self.cfg.org, salt=salt)
        # the plan, registered before the first user (a different one on resume is refused), is
        # what every readout of this canary decides on
        plan = registered_plan(self.cfg, self.state.data.get("plan"), exp_id)
        before = registry.registered_plan(self.store, exp_id)
        reg = registry.register_plan(self.store, exp_id, as_registered_before(plan, before["plan"] if before else None))
        _write_json(self.dir / "plan.json", {**reg["plan"], "registered": reg["sha256"]})
        c = canary_of(reg["plan"], self.cfg)
        if not out["readouts"]:  # the plan is on /dashboard before the first user arrives
            self._publish(exp_id, {"ab": None, "arm_ratios": {}, "alarms": []}, None, None, "no canary traffic yet")
        while out["rounds"] < c.rounds:
            self._traffic("canary", out["rounds"])
            rd = self._readout(exp_id)
            verdict, reason = decide(rd, c) if out["rounds"] + 1 >= c.min_rounds else (None, "min_rounds not reached")
            self._publish(exp_id, rd, out["rounds"] + 1, verdict, reason)
            out["readouts"].append({"round": out["rounds"], "decision": verdict, "reason": reason,
                                    "users": rd["ab"].get("users") if rd["ab"] else None})
            self.state.progress("canary", rounds=out["rounds"] + 1)
            if verdict is not None:
                break
        self.state.finish("canary", interactions=len(self.store.interactions(org=self.cfg.org, experiment_id=exp_id)))

    def _canary(self, exp_id: str) -> Any:
        """The [canary] settings the experiment registered before its traffic (the config's when
        it registered none: a cycle that predates registration)."""
        reg = registry.registered_plan(self.store, exp_id)
        return canary_of(reg["plan"], self.cfg) if reg else self.cfg.canary

    def _readout(self, exp_id: str) -> dict[str, Any]:
        c = self._canary(exp_id)
        facts = interaction_facts(self.store, self.cfg.org, exp_id)
        rows = ab_rows(facts)
        arms = {r["arm"] for r in rows}
        ab = analyze(rows, ab_config(self.cfg, c)) if arms == {"control", "treatment"} else None
        plan = c.plan()
        if ab is not None and plan is not None:
            ab["plan"] = plan.to_dict()
        ratios = arm_ratios(facts)
        return {"ab": ab, "arm_ratios": ratios, "alarms": alarms(ratios, self.cfg.alarms, ab, c.alpha), "rows": rows}

    def _publish(self, exp_id: str, rd: dict[str, Any], rnd: int | None, decision: str | None, reason: str) -> None:
        """Record the readout the loop decides on in the store, where `etude serve`'s /dashboard
        reads it (the server has no loop config, and etude.serve may not import etude.loop)."""
        plan = self._canary(exp_id).plan()  # the registered plan's users per arm (its measured user_cv)
        registry.record_readout(self.store, exp_id, {
            "round": rnd, "rounds": self.cfg.canary.rounds, "ab": rd["ab"], "plan": plan.to_dict() if plan else None,
            "primary": self.cfg.canary.primary, "arm_ratios": rd["arm_ratios"], "alarms": rd["alarms"],
            "decision": decision, "reason": reason, "cycle": self.index})

    def stage_readout(self) -> None:
        exp_id = self.state.stage("canary")["outputs"]["experiment"]
        rd = self._readout(exp_id)
        _write_text(self.dir / "ab_rows.jsonl", "".join(json.dumps(r) + "\n" for r in rd.pop("rows")))
        c = self._canary(exp_id)
        verdict, reason = decide(rd, c)
        if verdict is None:
            verdict, reason = "rollback", f"undecided after {c.rounds} round(s) (the max window): {reason}"
        if self.cfg.eval.required:
            verdict, reason = gated(verdict, reason, self.state.stage("eval")["outputs"].get("verdict") or {})
        _write_json(self.dir / "readout.json", rd)
        self.state.finish("readout", **rd)
        self.state.stage("decide")["outputs"].update(planned=verdict, planned_reason=reason)
        self.state.save()

    def stage_decide(self) -> None:
        out = self.state.stage("decide")["outputs"]
        decision, reason = out.get("planned", "skip"), out.get("planned_reason", "")
        cand = self.state.stage("register")["outputs"].get("checkpoint", {}).get("name")
        if cand is not None:
            cp = registry.get_checkpoint(self.store, cand)
            if decision == "promote" and cp.state != "production":
                registry.promote(self.store, cand, f"loop cycle {self.index}: {reason}")
            if decision == "promote":
                _stop_experiment(self.store, self.state.stage("canary")["outputs"].get("experiment"))
            elif decision == "rollback" and cp.state != "retired":
                registry.rollback(self.store, cand, reason=f"loop cycle {self.index}: {reason}")
        prod = registry.production(self.store, self.cfg.org)
        basis = "gate-only" if (self.state.data.get("plan") or {}).get("mode") == "gate-only" else (
            "readout" if self.state.status("readout") == "done" else "gate")
        self.state.finish("decide", decision=decision, reason=reason, basis=basis,
                          production={"name": prod.name, "version": prod.version} if prod else None)


def gate_eval_config(cfg: LoopConfig, *, progress: bool = False) -> EvalConfig:
    """How the eval gate runs an episode (`[eval]`: workers, turns, tokens, sampled at the users'
    temperature, or its `[eval.harness]`; `verify_edits` on top; one sample per task), for the
    gate and for anyone measuring the same way."""
    e = cfg.eval
    h = e.harness or HarnessConfig(max_steps=e.max_steps, max_tokens_per_turn=e.max_tokens,
                                   temperature=cfg.traffic.sampling_temperature())
    if e.verify_edits:
        h = h.replace(verify_edits=e.verify_edits)
    return EvalConfig(workers=e.workers, samples=1, max_tasks=e.max_tasks, report=False, progress=progress, harness=h,
                      backend=e.backend)


def _stop_experiment(store: Any, exp_id: str | None) -> None:
    """After a promotion the control arm's checkpoint is retired: the experiment must stop."""
    if exp_id and registry.get_experiment(store, exp_id).status == "active":
        registry.stop_experiment(store, exp_id)


# -- traffic ----------------------------------------------------------------------------------
def builtin_traffic(ctx: TrafficContext) -> Any:
    """The traffic of `[traffic] kind` for one phase and round (what a cycle runs without a
    `traffic=` hook; a hook may call it and add its own measurements around it)."""
    t = ctx.config.traffic
    if t.kind == "scripted":
        cfg = ctx.config
        tasks = org_tasks(cfg)[0] if cfg.specialise else resolve_suite(t.tasks, t.max_tasks, use="train",
                                                                        where="[traffic] tasks")
        # a canary window of its own size ([canary] window_users): the collect window's users and more
        n = cfg.canary.window_users if ctx.phase == "canary" and cfg.canary.window_users else t.users
        users = make_population(tasks, n, seed=cfg.seed, model=cfg.users, prefix=f"{cfg.name}-user")
        # the same users every round; each round takes the next requests of their streams
        slot = 0 if ctx.phase == "collect" else 1 + ctx.round
        return run_population(ctx.server(), ctx.api_key, users, round_key=f"{ctx.cycle_dir.name}:{ctx.phase}:{ctx.round}",
                              sessions_per_user=t.sessions_per_user, model=cfg.users,
                              start=slot * t.sessions_per_user, max_steps=t.max_steps, max_tokens=t.max_tokens,
                              temperature=t.temperature, concurrency=t.concurrency, progress=ctx.progress,
                              executor=t.executor, ray_address=t.ray_address or None, harness=t.harness)
    if t.kind == "command":
        env = {**os.environ, "ETUDE_LOOP_PHASE": ctx.phase, "ETUDE_LOOP_ROUND": str(ctx.round), "ETUDE_DB": ctx.db,
               "ETUDE_API_KEY": ctx.api_key, "ETUDE_LOOP_ORG": ctx.org}
        res = subprocess.run(t.command, shell=True, env=env, check=False)  # noqa: S602 - the operator's own command
        if res.returncode != 0:
            raise EtudeError(f"traffic command exited with status {res.returncode}: {t.command}")
        return None
    time.sleep(t.wait_s)  # kind "none": real users talk to the deployed server meanwhile
    return None


def check_traffic_gate(cfg: LoopConfig) -> None:
    """Refuse a loop whose scripted users' requests and gate suite share a task: the candidate is
    trained on the traffic, so a shared task would be gated on what it trained on."""
    t, e = cfg.traffic, cfg.eval
    if str(t.tasks) == str(e.suite):
        raise EtudeError(f"[traffic] tasks and [eval] suite are the same source ({t.tasks}): the candidate trains on "
                         "its users' traffic, so its gate needs tasks the traffic never holds; give disjoint sources")
    seal.disjoint(resolve_suite(t.tasks, t.max_tasks, use="train", where="[traffic] tasks"),
                  resolve_suite(e.suite, e.max_tasks, use="gate", where="[eval] suite"),
                  "[traffic] tasks", "[eval] suite")


def org_tasks(cfg: LoopConfig) -> tuple[list[Any], list[Any]]:
    """(its users' requests, its gate suite) for `cfg.org`. With a specialised candidate
    (`specialised_candidate`): its run's train-side tasks are the users' requests and its select
    slice (functions kept out of training, for choices) is the gate, so the two are disjoint and
    the run's held-out functions stay sealed for the final figure (etude.tasks.seal). Else tasks of
    its repositories (`[orgs.ORG] repos`, else all) from the traffic spec, split in order and disjoint."""
    cp = specialised_candidate(open_store(cfg.db_url()), cfg.org) if cfg.specialise else None
    if cp is not None and cp.meta.get("kind") == "specialised":
        tasks = Path(cp.meta["report"]).parent / "tasks"
        users = seal.guard(load_tasks(tasks / "train.jsonl"), use="train", where=f"{cp.name}'s train tasks")
        gate = seal.guard(load_tasks(tasks / "select.jsonl"), use="gate", where=f"{cp.name}'s select tasks")
        gate, users = gate[:cfg.eval.max_tasks], users[:cfg.traffic.max_tasks]
        if not gate or not users:
            raise EtudeError(f"organisation {cfg.org!r}: the specialised candidate {cp.name} has {len(gate)} select and "
                             f"{len(users)} train task(s); the gate and the users need at least one each")
        seal.disjoint(users, gate, "the users' requests", "the gate")
        return users, gate
    repos = set(cfg.org_repos())
    need = cfg.traffic.max_tasks + cfg.eval.max_tasks  # without a repos filter, only as many as are used
    tasks = [x for x in resolve_suite(cfg.traffic.tasks, None if repos else need, use="train", where="[traffic] tasks")
             if not repos or repo_of(x) in repos]
    traffic, heldout = tasks[:cfg.traffic.max_tasks], tasks[cfg.traffic.max_tasks:cfg.traffic.max_tasks + cfg.eval.max_tasks]
    if not traffic or not heldout:
        raise EtudeError(f"organisation {cfg.org!r}: {len(tasks)} task(s) of its repositories in {cfg.traffic.tasks!r}; "
                         f"need more than traffic.max_tasks = {cfg.traffic.max_tasks} to hold some out for its gate")
    return traffic, heldout


def _session_summary(sessions: Any) -> dict[str, Any] | None:
    if not isinstance(sessions, list):
        return None
    ok = [s for s in sessions if "error" not in s]
    return {"sessions": len(sessions), "errors": len(sessions) - len(ok), "resolved": sum(bool(s.get("resolved")) for s in ok),
            "users": len({s["user"] for s in sessions}), "scripted": all(s.get("scripted") for s in sessions),
            "first_error": next((s["error"] for s in sessions if "error" in s), None),
            "ray_nodes": len({s["node_id"] for s in sessions if s.get("node_id")})}  # 0: they ran on threads


def _eval_key(e: EvalConfig, suite: str) -> str:
    """The production evaluation's cache key: the suite and everything in the gate's EvalConfig
    (`gate_eval_config`) that changes how an episode runs (its harness, engine and task count)."""
    text = json.dumps([suite, e.max_tasks, e.harness_config().to_dict(), e.backend], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _write_json(path: Path, obj: Any) -> None:
    _write_text(path, json.dumps(obj, indent=1, default=str))
