"""`etude specialise`: a LoRA adapter that specialises the agent to one organisation's
repositories, measured on functions of those repositories it never trained on.

Read top to bottom in `run_specialise` (every stage is resumable through etude.pipeline.stages;
a rerun with the same --out continues after the last finished stage):

1. tasks    — level-1 curriculum tasks of each repository (NAME==VERSION from PyPI, or a local
              git repository's working tree);
2. split    — by function (etude.pipeline.split): held-out functions never reach training, and a
              `select` slice of the train functions chooses between checkpoints. DIR/split.json;
2b. drills  — more bugs of another seed, mutated only inside train functions, for fix drills;
3. sft      — LoRA SFT on `--base`: the scripted expert's resolved episodes of the train tasks
              and fix drills of those bugs;
4. rl       — GRPO on the edit turn (env `fix`) continuing the same adapter, for what is left of
              the `--minutes` budget, validated on the select slice;
5. choose   — the SFT or the RL adapter, by right fixes on the select slice (never held out);
6. evaluate — base and adapter on the held-out tasks, and on the general validation split (a
              regression check), paired, in sandboxes;
7. report   — DIR/report.json (the fields docs/agent.md lists) and DIR/report.html with plots;
8. register — with --register, the adapter becomes the org's candidate in the registry, which
              `etude loop --org ORG` canaries.

The artefact is DIR/adapter (peft's adapter directory, a few MiB), loadable by `etude serve`,
`etude eval` (through DIR/merged, base + adapter merged for evaluation) and `etude loop`.

What this does not guarantee: a gain. A 135M model on 2 cores learns little per minute, and
the held-out functions are new code; the report says what was measured, with its interval.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from etude.errors import EtudeError
from etude.evals.runner import resolve_suite
from etude.paths import home
from etude.pipeline.compare import paired_table
from etude.pipeline.isolate import in_child
from etude.pipeline.learning import EvalSetup, eval_harness
from etude.pipeline.learning import evaluate as learning_evaluate
from etude.pipeline.report import write_specialise_report
from etude.pipeline.split import FunctionSplit, check_disjoint, split_by_function, touched_functions
from etude.pipeline.stages import Stages
from etude.policy import resolve_backend
from etude.provenance import provenance
from etude.serve import registry
from etude.store import open_store
from etude.store.sql import ORG_RE
from etude.tasks import save_tasks, seal
from etude.tasks.curriculum import function_curriculum, package_curriculum, pinned_sha256, repo_curriculum
from etude.tasks.fetch import fetch_sdist, normalise, parse_spec
from etude.tasks.history import HistoryConfig, mine_history, summary
from etude.tasks.schema import load_tasks
from etude.tasks.seal import check_source, sealed_packages
from etude.train import load_config, train
from etude.train.config import with_rollout_backend
from etude.train.lora import merge_adapter_dir
from etude.train.sft import load_sft_config, run_sft
from etude.types import Task

DRILL_SEED_OFFSET = 7  # drills mutate other sites of the same code (another curriculum seed)


@dataclass(frozen=True)
class SpecialiseConfig:
    org: str
    """the organisation (a slug, as API keys and the registry spell it)."""
    repos: tuple[str, ...]
    """its repositories: NAME==VERSION from PyPI, or the path of a local git repository."""
    out: str
    """everything this run writes (state, tasks, split, adapters, evaluations, report)."""
    base: str | None = None
    """model to specialise; None: the org's production checkpoint in the registry, else the
    embedded default ("smollm2")."""
    minutes: float = 15.0
    """training budget (SFT + RL), wall minutes; task building and evaluation come on top. 15 (it
    was 40, with 100 general tasks) to bring a whole run on 2 CPU cores near issue 30's 60 minutes
    (task building cached); not yet met: the four evaluations take 35-40 minutes there
    (bench/results/specialise.json, demo.json), the drills 3, and each training stage runs at
    least a step or two whatever is left of the budget. The demo's specialisation (12 minutes,
    49 held-out tasks) took 60.4 minutes without building its tasks."""
    seed: int = 0
    register: bool = False
    db: str | None = None
    """store URL the adapter is registered in with `register` (default: $ETUDE_DB, else
    ~/.etude/etude.db)."""
    tasks_per_repo: int = 120
    """level-1 tasks built per repository (fewer when its tests catch fewer mutants)."""
    drills_per_repo: int = 60
    """fix-drill bugs built per repository, each inside a train function (0: no drills)."""
    history_tasks: int | None = None
    """tasks mined from a local repository's git history (`etude tasks mine --repo`: a commit that
    fixes something with a test becomes a task whose statement is its message), added to its
    curriculum tasks and split by function with them. None: up to 20 per local repository; 0:
    none. A NAME==VERSION repository has no history here."""
    heldout_fraction: float = 0.4
    """share of the (capped) tasks whose functions are held out."""
    select_fraction: float = 0.15
    heldout_per_function: int | None = 3
    """at most this many held-out tasks per function (a function with many mutants would
    otherwise fill the held-out side with near-copies of one bug site)."""
    min_heldout: int = 30
    """fewer held-out tasks than this cannot carry the report: one line, exit 2."""
    general: str = "builtin:curriculum:validation"
    """the regression check's suite: general tasks of no org repository (never the test split)."""
    general_tasks: int = 30
    """at most this many tasks of `general` (30: both evaluations about 12 minutes on 2 cores)."""
    agent_config: str = "configs/agent_sft.toml"
    """the agent's harness and SFT hyperparameters (model, tasks and LoRA set here)."""
    rl_config: str = "configs/fix_rl.toml"
    """GRPO on the edit turn (model, tasks, LoRA and steps set here)."""
    sft_share: float | None = 0.6
    """share of `minutes` the SFT stage may use (gathering included); RL gets the rest. None: SFT
    runs all its epochs whatever the budget (as runs before this field did)."""
    sft_epochs: float = 2.0
    sft_lr: float = 3e-4
    lora_r: int = 16
    lora_alpha: int = 32
    rl_lr: float = 5e-5
    rl_weights: tuple[tuple[str, float], ...] = (("well_formed", -0.1),)
    """stage 4's fix-env tier weights over the env's defaults (`[env.rewards] weights`): a reply
    that does not try to edit scores below one that tries and misses (0). With the defaults (0
    for both) GRPO from an adapter that edits collapsed to never editing, select-slice applied
    edits 24/96 -> 0/96; with -0.1 it did not, 37/96 and 3 right fixes (bench/results/edit_rl.json,
    edit_rl_attempt.json: chosen on the select slice)."""
    rl_step_s: float = 90.0
    """expected seconds per RL step on this machine, to turn the budget into steps (the run
    also stops at the budget's end whatever the estimate)."""
    backend: str = "auto"
    """episodes of evaluations and RL rollouts: "hf", "vllm" or "auto"."""
    verify_edits: int | None = None
    """the evaluations' harness checks each edit turn against the failing test the task's
    request names and samples it again while the test still fails, up to this many attempts
    (HarnessConfig.verify_edits; the same for base and adapter). None (or 0): off, one greedy
    attempt (None, so that runs from before this field resume their evaluations)."""
    workers: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verify_edits is not None and self.verify_edits < 0:
            raise EtudeError(f"verify_edits must be 0 or more, not {self.verify_edits}")
        if self.verify_edits is not None and self.verify_edits <= 1:  # one attempt: off, as None says
            object.__setattr__(self, "verify_edits", None)


# ---------------------------------------------------------------- input checks (before anything is written)


def check_org(org: str) -> str:

    if not ORG_RE.match(org or ""):
        raise EtudeError(f"--org {org!r} is not a slug (letters, digits, '.', '_', '-'; starting with a letter or digit)")
    return org


def parse_repos(arg: str | Sequence[str]) -> tuple[str, ...]:
    """`--repos SPEC[,SPEC...]`: each NAME==VERSION or a local git repository (resolved path)."""
    items = [x.strip() for x in (arg.split(",") if isinstance(arg, str) else arg) if x.strip()]
    if not items:
        raise EtudeError("--repos is empty: give NAME==VERSION or the path of a git repository, comma-separated")
    out: list[str] = []
    sealed = sealed_packages()
    for x in items:
        if "==" in x:
            name, _ = parse_spec(x)

            if normalise(name) in sealed:
                raise EtudeError(f"{x}: a package of the sealed test split cannot be trained on "
                                 "(etude.tasks.seal); pick a repository of the organisation's own")
            out.append(x)
            continue
        p = Path(x).expanduser()
        if not p.is_dir():
            raise EtudeError(f"{x}: neither NAME==VERSION nor a directory")
        r = subprocess.run(["git", "-C", str(p), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
        if r.returncode != 0:
            raise EtudeError(f"{x}: not a git repository")
        top = Path(r.stdout.strip()).resolve()
        seal.guard_repo(top, use="train", where=f"--repos {x}")  # a local clone of a sealed package
        out.append(str(top))
    return tuple(out)


def check_base(base: str | None, org: str) -> str:
    """The model to specialise: `base` if it is one, else the org's production checkpoint, else
    the embedded default. Reads the registry only when its database exists (nothing is created)."""
    if base is not None:
        if base in ("smollm2", "tiny"):
            return base
        p = Path(base)
        if not ((p / "config.json").is_file() and any(p.glob("*.safetensors"))):
            raise EtudeError(f"--base {base!r} is not a model directory (config.json and safetensors weights) "
                             "nor smollm2/tiny")
        return str(p.resolve())
    import os

    url = os.environ.get("ETUDE_DB") or ""
    if not url:  # the default SQLite file; its absence means no registry (and nothing is created)
        db = home(create=False) / "etude.db"
        if not db.is_file():
            return "smollm2"
        url = f"sqlite:///{db}"

    cp = registry.production(open_store(url), org)
    if cp is None:
        return "smollm2"
    if (Path(cp.path) / "adapter_config.json").is_file():
        raise EtudeError(f"the org's production checkpoint {cp.name} is an adapter; give --base the model it sits on")
    return cp.path


# ---------------------------------------------------------------- tasks


def example_org_repo(dest: Path) -> Path:
    """The example organisation's repository (etude/data/org_example) as a git repository at
    `dest` (made once; one commit with a fixed author and date, so its tasks cache across runs)."""
    import os

    dest = Path(dest)
    if (dest / ".git").is_dir():
        return dest.resolve()
    src = Path(__file__).resolve().parents[1] / "data" / "org_example"
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
           "GIT_AUTHOR_NAME": "etude", "GIT_AUTHOR_EMAIL": "etude@example.org", "GIT_COMMITTER_NAME": "etude",
           "GIT_COMMITTER_EMAIL": "etude@example.org"}
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-qm", "the example organisation's library"]):
        subprocess.run(["git", *cmd], cwd=dest, check=True, env=env, capture_output=True)
    return dest.resolve()


def check_packages(repos: Sequence[str]) -> None:
    """Fetch every NAME==VERSION's sdist now, so an unknown package or version is one line before
    anything is written (a failed fetch leaves no folder in the cache: etude.tasks.fetch)."""
    for spec in repos:
        if "==" in spec:
            fetch_sdist(*parse_spec(spec))


def repo_tasks(spec: str, n: int, seed: int, progress: Any = None) -> list[Task]:
    """Level-1 curriculum tasks of one repository (built once, then cached)."""

    if "==" in spec:
        return package_curriculum(spec, 1, n, seed, pinned_sha256(spec), progress)
    return repo_curriculum(Path(spec), 1, n, seed, progress)


def history_tasks(spec: str, n: int, progress: Any = None) -> tuple[list[Task], str]:
    """Up to `n` tasks mined from a local repository's commits, and a one-line account of the
    mining (kept and skipped by reason). A PyPI spec, or a history with nothing to mine, gives none."""
    if "==" in spec or n <= 0:
        return [], ""
    try:
        tasks, skipped = mine_history(Path(spec), HistoryConfig(max_tasks=n), progress)
    except EtudeError as e:  # e.g. no commit could be mined: the curriculum tasks still stand
        return [], f"{Path(spec).name}: history gave no task ({e})"
    return tasks, f"{Path(spec).name}: " + summary(sum(skipped.values()) + len(tasks), len(tasks), skipped)


def _save(tasks: Sequence[Task], path: Path) -> str:
    save_tasks(list(tasks), path)
    return str(path)


# ---------------------------------------------------------------- the run


class Specialise:
    def __init__(self, cfg: SpecialiseConfig, console: Console | None = None):
        check_org(cfg.org)
        self.cfg = dataclasses.replace(cfg, repos=parse_repos(cfg.repos))
        self.base = check_base(cfg.base, cfg.org)
        check_packages(self.cfg.repos)
        check_source(cfg.general, "the general regression suite")  # never the sealed test split

        self.backend = resolve_backend(cfg.backend)
        self.workers = cfg.workers or (16 if self.backend == "vllm" else 8)
        self.out = Path(cfg.out).resolve()
        self.con = console or Console()
        self.t0 = time.time()
        self.stages = Stages(self.out, {**dataclasses.asdict(self.cfg), "base": self.base}, self.con)

    # -- 1. tasks
    def tasks(self) -> tuple[dict[str, Any], str]:
        c = self.cfg
        org, mined, notes = [], 0, []
        for spec in c.repos:
            with self.con.status(f"building tasks of {spec}") as status:
                def say(m: str, s: str = spec) -> None:
                    status.update(f"{Path(s).name}: {m}")
                org += repo_tasks(spec, c.tasks_per_repo, c.seed, say)
                hist, note = history_tasks(spec, 20 if c.history_tasks is None else c.history_tasks, say)
                org += hist
                mined += len(hist)
                if note:
                    notes.append(note)
                    self.con.print(note)
        if not org:
            raise EtudeError(f"no level-1 tasks could be built from {', '.join(c.repos)} (do their tests run?)")
        _save(org, self.out / "tasks" / "org.jsonl")
        return ({"org": len(org), "history": mined, "history_notes": notes},
                f"{len(org)} tasks from {len(c.repos)} repositories ({mined} from their git history)")

    # -- 2. split
    def split(self) -> tuple[dict[str, Any], str]:
        c = self.cfg
        org = load_tasks(self.out / "tasks" / "org.jsonl")
        touched = {t.instance_id: touched_functions(t) for t in org}
        sp: FunctionSplit = split_by_function(org, touched, heldout_fraction=c.heldout_fraction,
                                              select_fraction=c.select_fraction, seed=c.seed,
                                              heldout_per_function=c.heldout_per_function)
        check_disjoint(sp.train + sp.select, sp.heldout, touched)
        if len(sp.heldout) < c.min_heldout:
            raise EtudeError(f"{', '.join(c.repos)} yield {len(sp.heldout)} held-out tasks "
                             f"({len(org)} tasks over {len(sp.functions['heldout']) + len(sp.functions['train'])} "
                             f"functions); the report needs at least {c.min_heldout}: add repositories or raise "
                             "tasks_per_repo")
        d = sp.to_dict(c.seed)
        (self.out / "split.json").write_text(json.dumps(d, indent=1) + "\n")
        # the held-out functions are the org's test set: marked, so no loader lets them train, select
        # or gate (etude.tasks.seal), unless a retired set (probed during development) is re-run
        retired = seal.retired(c.repos)
        held = sp.heldout if retired else seal.seal_heldout(sp.heldout, f"org {c.org}: held-out functions")
        for side, ts in (("train", sp.train), ("select", sp.select), ("heldout", held)):
            _save(ts, self.out / "tasks" / f"{side}.jsonl")
        return ({k: d[k]["n_tasks"] for k in ("train", "select", "heldout")},
                f"train {len(sp.train)} tasks / {d['train']['n_functions']} functions, select {len(sp.select)}, "
                f"held out {len(sp.heldout)} / {d['heldout']['n_functions']} functions, {len(sp.dropped)} dropped "
                f"(both sides)")

    # -- 2b. fix drills on the train functions
    def drills(self) -> tuple[dict[str, Any], str]:
        """More bugs in the train functions alone (another curriculum seed, every mutant tried at a
        train function's line, so none is built in vain), minus any whose patch a train task has;
        recorded in split.json under `drills`. Select and held-out functions are never mutated."""
        c = self.cfg
        split = json.loads((self.out / "split.json").read_text())
        train_fns = set(split["train"]["functions"])
        train_patches = {t.patch for t in load_tasks(self.out / "tasks" / "train.jsonl")}
        built: list[Task] = []
        for spec in c.repos if c.drills_per_repo else ():
            with self.con.status(f"building fix drills of {spec}") as status:
                built += function_curriculum(spec, train_fns, c.drills_per_repo, c.seed + DRILL_SEED_OFFSET,
                                             lambda m: status.update(f"drills of {m}"))
        touched = {t.instance_id: touched_functions(t) for t in built}
        drills = [t for t in built if touched[t.instance_id] <= train_fns and t.patch not in train_patches]
        split["drills"] = {"tasks": [t.instance_id for t in drills], "n_tasks": len(drills), "built": len(built),
                           "functions": len({f for t in drills for f in touched[t.instance_id]})}
        (self.out / "split.json").write_text(json.dumps(split, indent=1) + "\n")
        _save(drills, self.out / "tasks" / "drills.jsonl")
        return ({"drills": len(drills), "built": len(built)},
                f"{len(drills)} fix drills on {split['drills']['functions']} train functions")

    # -- 3. SFT (LoRA)
    def sft(self) -> tuple[dict[str, Any], str]:

        c = self.cfg
        drills = self.out / "tasks" / "drills.jsonl"
        n_drills = len(load_tasks(drills)) if drills.is_file() else 0
        cfg = load_sft_config(c.agent_config, {
            "model": self.base, "tasks": str(self.out / "tasks" / "train.jsonl"), "epochs": c.sft_epochs,
            "lr": c.sft_lr, "seed": c.seed, "time_limit_s": c.sft_share * c.minutes * 60 if c.sft_share is not None else None,
            "checkpoint_every": 5, "keep_checkpoints": 10_000, "lora.enabled": True, "lora.r": c.lora_r, "lora.alpha": c.lora_alpha,
            "sources.drill": 1.0 if n_drills else 0.0,
            **({"sources.drill_tasks": str(drills)} if n_drills else {})})
        res = in_child(run_sft, cfg, self.out / "sft")  # its memory goes back to the system when it ends
        return res, (f"{res['steps']} LoRA steps on {res['trajectories'].get('expert', 0)} expert episodes and "
                     f"{res['trajectories'].get('drill', 0)} drills, final loss {res['last'].get('loss', float('nan')):.3f}")

    # -- 4. RL on the edit turn (LoRA continued)
    def rl(self, adapter: str, seconds_left: float) -> tuple[dict[str, Any], str]:

        c = self.cfg
        if seconds_left < 30:
            return {"steps": 0, "skipped": f"{seconds_left:.0f} s of budget left"}, "skipped: no budget left"
        if not load_tasks(self.out / "tasks" / "select.jsonl"):
            return {"steps": 0, "skipped": "no select tasks to validate on"}, "skipped: no select slice"
        # at least two steps (a first and a second update); the time limit ends it at the budget
        steps = max(2, int(seconds_left // c.rl_step_s))
        every = max(1, steps // 2)
        cfg = rl_stage_config(c.rl_config, self.out, self.base, adapter, self.backend, lr=c.rl_lr, steps=steps,
                              seed=c.seed, every=every, time_limit_s=seconds_left, weights=dict(c.rl_weights))
        res = in_child(train, cfg, self.out / "rl", progress=True)
        evals = [{"step": e["step"], "right_fix": e.get("eval/successes"), "reward": e.get("eval/reward")}
                 for e in res["evals"]]
        return {"steps": res["steps"], "checkpoint": res["checkpoint"], "evals": evals, "last": res["last"]}, (
            f"{res['steps']} GRPO steps on the edit turn; select-slice right fixes by step: "
            + ", ".join(f"{e['step']}: {e['right_fix']}" for e in evals))

    # -- 5. choose on the select slice
    def choose(self, sft: dict[str, Any], rl: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """Ship the adapter `pick_adapter` chooses, in bf16, with its merged model beside it."""
        chosen, why = pick_adapter(sft["adapter"], rl)
        dest = self.out / "adapter"
        tmp = self.out / ".adapter-tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        # the artefact is the adapter alone: no optimizer state, no tokenizer (its base has one),
        # weights in bf16 (what serving samples in; half the fp32 bytes)
        shutil.copytree(chosen, tmp, ignore=shutil.ignore_patterns("optimizer*", "rng*", "state.json", "tokenizer*",
                                                                   "chat_template*", "special_tokens*", "README.md"))
        _to_bf16(tmp / "adapter_model.safetensors")
        acfg = json.loads((tmp / "adapter_config.json").read_text())
        acfg["base_model_name_or_path"] = self.base  # what `etude serve` and vLLM load it on
        (tmp / "adapter_config.json").write_text(json.dumps(acfg, indent=2))
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
        size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())

        merge_adapter_dir(dest, self.base, self.out / "merged")
        return {"adapter": str(dest), "from": chosen, "why": why, "bytes": size}, f"{why}; {size / 2**20:.1f} MiB"

    # -- 6. evaluations
    def evaluate(self, suite: Path | str, model: str, name: str, max_tasks: int | None = None, *,
                 use: str) -> tuple[dict[str, Any], str]:
        h = eval_harness(self.cfg.agent_config).replace(verify_edits=self.cfg.verify_edits or 0)
        # this stage runs because its inputs changed: an evaluation left in its folder by another
        # model (OUT/merged is rewritten when another adapter is chosen) is not resumed
        setup = EvalSetup(h, self.workers, self.backend, bootstrap=200, max_tasks=max_tasks, fresh_for_new_weights=True)
        s, line = learning_evaluate(suite, model, self.out / name, setup, use=use)
        return {"dir": str(self.out / name), "resolved_rate": s["correctness"]["resolved_rate"]["mean"]}, f"{line}, {name}"

    def general_suite(self) -> Path:

        f = self.out / "tasks" / "general.jsonl"
        _save(resolve_suite(self.cfg.general, self.cfg.general_tasks, use="gate", where="the general regression suite"), f)  # cheap; follows a changed config
        return f

    # -- 7. report
    def report(self) -> tuple[dict[str, Any], str]:
        c = self.cfg
        split = json.loads((self.out / "split.json").read_text())
        held = paired_table(self.out / "eval-heldout-base", self.out / "eval-heldout-adapter")
        gen = paired_table(self.out / "eval-general-base", self.out / "eval-general-adapter")
        gen["no_regression"] = bool(gen["adapter"]["rate"] >= gen["base"]["rate"] - 0.03 and gen["harm_p"] > 0.05)
        chosen = self.stages.result("5. choose")
        rep = {
            "org": c.org, "repos": list(c.repos), "base": self.base,
            "adapter": {"path": chosen["adapter"], "bytes": chosen["bytes"], "chosen": chosen["why"]},
            "split": {side: {"functions": split[side]["n_functions"], "tasks": split[side]["n_tasks"]}
                      for side in ("train", "select", "heldout")} | {"dropped": len(split["dropped"]),
                                                                     "drills": split["drills"]["n_tasks"]},
            "heldout": held, "general": gen,
            # a retired held-out set (etude.tasks.seal.RETIRED) was probed while choices were made
            "heldout_role": ("development (retired as a test set: " + "; ".join(seal.retired(c.repos).values()) + ")"
                             if seal.retired(c.repos) else "test"),
            "stages": self.stages.times(),
            "budget_minutes": c.minutes,
            "provenance": provenance(seeds={"split": c.seed, "curriculum": c.seed,
                                            "drills": c.seed + DRILL_SEED_OFFSET}, started=self.t0,
                                     stages=self.stages.times()),
        }
        (self.out / "report.json").write_text(json.dumps(rep, indent=1, default=str) + "\n")

        html = write_specialise_report(self.out, rep)
        h = held
        return rep, (f"held out: base {h['base']['resolved']}/{h['tasks']} -> adapter {h['adapter']['resolved']}/"
                     f"{h['tasks']} (McNemar p = {h['mcnemar_p']:.3g}); general: no_regression = "
                     f"{gen['no_regression']}; {html}")

    # -- 8. register
    def register(self) -> tuple[dict[str, Any], str]:

        cp = register_run(open_store(self.cfg.db), self.cfg.org, self.out)
        return {"name": cp.name, "state": cp.state, "version": cp.version, "path": cp.path}, f"registered {cp.name} as {self.cfg.org}'s candidate"


def register_run(store: Any, org: str, run: Path, snapshots: Path | None = None) -> registry.Checkpoint:
    """The adapter of a finished run (RUN/adapter, RUN/report.json) as ORG's candidate, as
    `--register` does: an immutable snapshot named by its digest (under `snapshots`, default
    RUN/adapters), at the org's next version (registry.register_adapter), with the base, the
    report and its held-out measurement in meta (what `etude loop --org` plans and gates with)."""
    run = Path(run)
    rep = json.loads((run / "report.json").read_text())
    return registry.register_adapter(
        store, org, run / "adapter", snapshots or run / "adapters",
        meta={"base": rep["base"], "kind": "specialised", "report": str(run / "report.json"),
              "heldout": rep["heldout"], "no_regression": rep["general"]["no_regression"]})


def _to_bf16(path: Path) -> None:
    """Rewrite a safetensors file with its floating-point tensors in bfloat16."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in load_file(str(path)).items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def pick_adapter(sft_adapter: str, rl: dict[str, Any]) -> tuple[str, str]:
    """Stage 5's choice, and why: the RL adapter when its last select-slice evaluation has more
    right fixes than its first (step 0 = the SFT adapter), or as many and a mean reward at least
    as high; else the SFT adapter. (The reward breaks ties: an RL run that stopped editing keeps
    its right fixes at 0 = 0 but its reward falls.) Never reads held-out tasks."""
    evals = [e for e in rl.get("evals", []) if e.get("right_fix") is not None]
    if not (rl.get("steps") and rl.get("checkpoint") and evals):
        return sft_adapter, "SFT adapter (no RL steps)"
    first, last = evals[0], evals[-1]
    says = f"select right fixes {first['right_fix']} -> {last['right_fix']}"
    if first.get("reward") is not None and last.get("reward") is not None:
        says += f", mean reward {first['reward']:.3f} -> {last['reward']:.3f}"
    if (last["right_fix"], last.get("reward") or 0.0) >= (first["right_fix"], first.get("reward") or 0.0):
        return rl["checkpoint"], f"RL adapter: {says}"
    return sft_adapter, f"SFT adapter: RL lowered {says}"


def rl_stage_config(rl_config: str, out: Path, base: str, adapter: str, backend: str, *, lr: float, steps: int,
                    seed: int, every: int, time_limit_s: float | None = None,
                    weights: dict[str, float] | None = None, **extra: Any):
    """The TrainConfig of stage 4 (GRPO on the edit turn, the LoRA adapter continued from
    `adapter`) for the run in `out` after its split and drills: it trains on the train tasks and
    the drills (written to tasks/rl_train.jsonl here) and validates on tasks/select.jsonl;
    `weights` are fix-env tier weights over the env's defaults (None or empty: the defaults);
    `extra` are further overrides (bench/rl_memory.py turns gradient checkpointing off and on)."""
    tasks = out / "tasks"
    drills = load_tasks(tasks / "drills.jsonl") if (tasks / "drills.jsonl").is_file() else []
    _save(load_tasks(tasks / "train.jsonl") + drills, tasks / "rl_train.jsonl")
    return load_config(rl_config, with_rollout_backend({
        "model": base, "lora.enabled": True, "lora.init": adapter, "lr": lr, "steps": steps,
        "seed": seed, "eval_every": every, "checkpoint_every": every or steps, "keep_checkpoints": 4,
        "time_limit_s": time_limit_s, "env.tasks_file": str(out / "tasks" / "rl_train.jsonl"),
        "env.eval_tasks_file": str(out / "tasks" / "select.jsonl"), "env.num_train": 100000,
        "env.num_test": 100000, "eval_problems": None, **({"env.rewards.weights": weights} if weights else {}),
        **extra}, backend))


# What each stage reads (config fields; with the earlier stages it names): a rerun with another
# budget keeps the tasks, the split and the base model's evaluations (etude.pipeline.stages).
BUILD_USES = ("repos", "tasks_per_repo", "seed", "history_tasks")
SPLIT_USES = BUILD_USES + ("heldout_fraction", "select_fraction", "heldout_per_function", "min_heldout")
EPISODE_USES = ("agent_config", "backend", "verify_edits")


def sft_inputs(cfg: SpecialiseConfig) -> tuple[str, ...]:
    """The fields the SFT stage reads (the budget only when SFT has a share of it)."""
    return SPLIT_USES + ("base", "agent_config", "sft_epochs", "sft_lr", "lora_r", "lora_alpha", "sft_share") + (
        ("minutes",) if cfg.sft_share is not None else ())


def run_specialise(cfg: SpecialiseConfig, console: Console | None = None, until: str | None = None) -> dict[str, Any]:
    """Every stage in order, resuming finished ones. `until` (a stage name, e.g. "3. SFT (LoRA)"):
    stop after that stage and return the stages' results so far (a bench that needs a trained
    adapter and not the evaluations)."""
    if until is not None and until not in STAGES:
        raise EtudeError(f"no stage {until!r}; the stages are: {', '.join(STAGES)}")
    sp = Specialise(cfg, console)
    st = sp.stages
    sp.con.print(f"[bold]etude specialise[/bold] — org {cfg.org}, base {sp.base}, {sp.backend} episodes, "
                 f"budget {cfg.minutes:g} min, output in {sp.out}")
    sft_uses = sft_inputs(cfg)

    def run(name: str, fn: Any, **kw: Any) -> Any:
        if name not in STAGES:  # the names `until` and the docs go by: a stage renamed here alone fails every run
            raise RuntimeError(f"stage {name!r} is missing from etude.pipeline.specialise.STAGES")
        res = st.run(name, fn, **kw)
        if name == until:
            raise _Until
        return res

    try:
        run("1. tasks", sp.tasks, uses=BUILD_USES)
        run("2. split", sp.split, uses=SPLIT_USES, after=("1. tasks",))
        run("2b. drills", sp.drills, uses=SPLIT_USES + ("drills_per_repo",), after=("2. split",))
        t_train = time.monotonic()
        sft = run("3. SFT (LoRA)", sp.sft, uses=sft_uses, after=("2. split", "2b. drills"))
        spent = st.state["stages"]["3. SFT (LoRA)"]["seconds"] if st.done("3. SFT (LoRA)") else time.monotonic() - t_train
        rl = run("4. RL on the edit turn", lambda: sp.rl(sft["adapter"], cfg.minutes * 60 - spent),
                 uses=sft_uses + ("minutes", "rl_config", "rl_lr", "rl_weights", "rl_step_s", "backend"), after=("3. SFT (LoRA)",))
        run("5. choose", lambda: sp.choose(sft, rl), uses=("base",), after=("3. SFT (LoRA)", "4. RL on the edit turn"))
        heldout = sp.out / "tasks" / "heldout.jsonl"
        run("6a. held-out, base", lambda: sp.evaluate(heldout, sp.base, "eval-heldout-base", use="final"),
            uses=SPLIT_USES + EPISODE_USES + ("base",), after=("2. split",))
        run("6b. held-out, adapter", lambda: sp.evaluate(heldout, str(sp.out / "merged"), "eval-heldout-adapter", use="final"),
            uses=SPLIT_USES + EPISODE_USES, after=("2. split", "5. choose"))
        gen = sp.general_suite()
        general = EPISODE_USES + ("general", "general_tasks")
        run("6c. general, base", lambda: sp.evaluate(gen, sp.base, "eval-general-base", use="gate"), uses=general + ("base",))
        run("6d. general, adapter", lambda: sp.evaluate(gen, str(sp.out / "merged"), "eval-general-adapter", use="gate"),
            uses=general, after=("5. choose",))
        rep = run("7. report", sp.report, resumable=False)
        if cfg.register:
            rep["registered"] = run("8. register", sp.register, uses=("org", "db"), after=("5. choose",))
    except _Until:
        return {"until": until, "stages": st.times()}
    return rep


class _Until(Exception):
    """run_specialise reached its `until` stage."""


STAGES = ("1. tasks", "2. split", "2b. drills", "3. SFT (LoRA)", "4. RL on the edit turn", "5. choose",
          "6a. held-out, base", "6b. held-out, adapter", "6c. general, base", "6d. general, adapter", "7. report",
          "8. register")

