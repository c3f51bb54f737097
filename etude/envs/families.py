"""Training environments: problems in, scored episodes out. Every family feeds the same learner.
(`etude.train.envs` re-exports this module, the name it had before it moved here.)

An env is a `protocols.Env`: `problems(split)` (deterministic, train and test disjoint) and
`rollout(policy, problems, n=..., ...)` returning `n` `types.Episode`s per problem, prompt-major.
An episode holds one `TurnSample` per assistant turn (prompt ids, completion ids, behaviour
log-probs) plus its reward, reward terms and the policy version that produced it.

A single-turn env measures a reply once (`measure`: the answer's value, the sandbox's test run,
what an edit does to the file) and scores it through the reward rubric
(`etude.rewards.score_reply`): its terms (`rubric`) read the reply and the measurement, and the
reward is their weighted sum under `[env.rewards] weights`, merged over the env's `weights`. A
weight naming no term of the env is refused.

Families:
- `arith`: single-turn arithmetic with a verifiable integer answer (no sandbox). Terms `correct`
  (weight 1) and `format` (0.1).
- `pyfunc`: single-turn "write this Python function"; the answer is run against hidden tests in
  the real sandbox (bubblewrap). Terms `tests` (fraction of tests passed, weight 1) and `format`
  (a fenced block, weight 0: reported, not counted); resolved = all passed.
- `tasks`: multi-turn repository tasks through the harness and the sandbox
  (`etude.envs.TasksEnv`: `run_episode` + `etude.rewards.score`).
- `fix`: the edit turn of a repository task (`FixTurnEnv`, `etude.envs.fixturn`): a fix drill's
  conversation up to its edit is the prompt, the reply is scored by what its edit does to the file.
- `episodes`: stored episodes replayed as the rollouts (`EpisodesEnv`, from a JSONL of
  `Episode.to_dict()`): off-policy data already scored, with the behaviour log-probs of when it
  was sampled. The loop trains its candidate on distilled production samples this way.

What this does not guarantee: `pyfunc`'s pass marker is guarded by a per-run nonce read
before the candidate code is imported, which stops printing a fake marker but not every
possible hack (the code runs in the same process as the checker); it is sandboxed, not trusted.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import random
import re
import secrets
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import MappingProxyType
from typing import Any

from etude.envs import fixturn
from etude.envs.tasks_env import TasksEnv, load_task_spec
from etude.errors import EtudeError
from etude.harness import HarnessConfig
from etude.protocols import Env
from etude.rewards import RewardConfig, Rubric, make_rubric, score_reply
from etude.sandbox import SandboxConfig, run
from etude.types import Episode, Message, Problem, TurnSample


class SingleTurnEnv:
    """Base for one-prompt-one-answer families: subclasses give problems, `measure`, `resolved`, a
    `rubric` of terms over (`reply`, `measured`) and their default `weights`."""

    name = "single"
    workers = 1  # threads for `check` (sandboxed checks run in parallel)
    rubric: Rubric = make_rubric({})
    weights: Mapping[str, float] = MappingProxyType({})

    def _reward_config(self, rewards: dict[str, Any] | None) -> RewardConfig:
        """`[env.rewards]` over this env's default weights; a weight for no term of it is an error."""
        cfg = RewardConfig.from_dict(dict(rewards or {}), "env.rewards", weights=dict(self.weights))
        unknown = sorted(set(cfg.weights) - set(self.rubric))
        if unknown:
            raise EtudeError(f"env.rewards.weights: {', '.join(unknown)} is no term of env {self.name} "
                             f"(its terms: {', '.join(self.rubric)})")
        return cfg

    def problems(self, split: str) -> list[Problem]:
        raise NotImplementedError

    def measure(self, problem: Problem, text: str) -> dict[str, Any]:
        """What the rubric's terms read of one answer, measured once (`measured`)."""
        raise NotImplementedError

    def resolved(self, measured: dict[str, Any]) -> bool:
        raise NotImplementedError

    def check(self, problem: Problem, text: str) -> tuple[float, dict[str, float | None], bool]:
        """(reward, terms, resolved) of one answer: the rubric's weighted terms."""
        measured = self.measure(problem, text)
        br = score_reply(text, measured, self.reward_config, rubric=self.rubric)
        return br.total, dict(br.terms), self.resolved(measured)

    def rollout(self, policy: Any, problems: Sequence[Problem], *, n: int, max_tokens: int, temperature: float,
                top_p: float = 1.0, seed: int | None = None) -> list[Episode]:
        gens = policy.generate_batch([list(p.messages) for p in problems], (), n=n, max_tokens=max_tokens,
                                     temperature=temperature, top_p=top_p, seed=seed)
        probs = [p for p in problems for _ in range(n)]
        with ThreadPoolExecutor(self.workers) as pool:
            checks = list(pool.map(lambda pg: self.check(pg[0], pg[1].text), zip(probs, gens, strict=True)))
        return [
            Episode(p.id, p.family, r, terms, ok, [TurnSample.of(g)], g.policy_version, g.text,
                    {"finish": g.finish_reason})
            for p, g, (r, terms, ok) in zip(probs, gens, checks, strict=True)
        ]


def _correct(measured: dict[str, Any]) -> float:
    return float(measured["correct"])


def _only_a_number(reply: str) -> float:
    return float(bool(re.fullmatch(r"\s*-?\d+\s*\.?\s*", reply)))


def _tests(measured: dict[str, Any]) -> float:
    return float(measured["tests"])


def _fenced(reply: str) -> float:
    return float(extract_code(reply)[1])


class ArithEnv(SingleTurnEnv):
    """"What is a + b?" with a,b in [10, max_operand]; reward 1 when the last integer of the
    answer is right, plus a small format term (answer is only the number)."""

    name = "arith"
    rubric = make_rubric({"correct": _correct, "format": _only_a_number})
    weights = MappingProxyType({"correct": 1.0, "format": 0.1})

    def __init__(self, num_train: int = 256, num_test: int = 64, seed: int = 0, max_operand: int = 99,
                 rewards: dict[str, Any] | None = None):
        self.num = {"train": num_train, "test": num_test}
        self.seed, self.hi = seed, max_operand
        self.reward_config = self._reward_config(rewards)

    def problems(self, split: str) -> list[Problem]:
        if split not in self.num:
            raise EtudeError(f"unknown split {split!r}")
        rng = random.Random(self.seed)
        pairs: list[tuple[int, int]] = []
        seen: set[tuple[int, int]] = set()
        want = self.num["train"] + self.num["test"]
        while len(pairs) < want:  # disjoint splits: each pair appears once overall
            ab = (rng.randint(10, self.hi), rng.randint(10, self.hi))
            if ab not in seen:
                seen.add(ab)
                pairs.append(ab)
        chosen = pairs[: self.num["train"]] if split == "train" else pairs[self.num["train"]:]
        return [self._problem(split, i, a, b) for i, (a, b) in enumerate(chosen)]

    def _problem(self, split: str, i: int, a: int, b: int) -> Problem:
        q = f"What is {a} + {b}? Reply with only the number."
        return Problem(f"arith-{split}-{i}", "arith", (Message("user", q),), a + b)

    def measure(self, problem: Problem, text: str) -> dict[str, Any]:
        # I read the last integer: models often restate the question ("49 + 22 = 71").
        nums = re.findall(r"-?\d+", text.replace(",", ""))
        return {"correct": (int(nums[-1]) if nums else None) == problem.answer}

    def resolved(self, measured: dict[str, Any]) -> bool:
        return measured["correct"]


# (name, signature line, description, [(args, expected)]); the first ones are for training.
PYFUNCS: tuple[tuple[str, str, str, list[tuple[tuple[Any, ...], Any]]], ...] = (
    ("add", "add(a, b)", "returns a + b", [((1, 2), 3), ((-1, 1), 0), ((10, 5), 15)]),
    ("square", "square(x)", "returns x squared", [((3,), 9), ((-2,), 4), ((0,), 0)]),
    ("is_even", "is_even(n)", "returns True if n is even, else False", [((2,), True), ((3,), False), ((0,), True)]),
    ("maximum", "maximum(a, b)", "returns the larger of a and b", [((1, 2), 2), ((5, 3), 5), ((-1, -4), -1)]),
    ("reverse", "reverse(s)", "returns the string s reversed", [(("abc",), "cba"), (("",), ""), (("ab",), "ba")]),
    ("length", "length(xs)", "returns the number of items in the list xs", [(([1, 2],), 2), (([],), 0)]),
    ("first", "first(xs)", "returns the first item of the list xs", [(([4, 5],), 4), ((["a"],), "a")]),
    ("double", "double(x)", "returns x times 2", [((2,), 4), ((0,), 0), ((-3,), -6)]),
    ("negate", "negate(x)", "returns -x", [((2,), -2), ((-5,), 5)]),
    ("upper", "upper(s)", "returns s in upper case", [(("ab",), "AB"), (("A1",), "A1")]),
    ("total", "total(xs)", "returns the sum of the numbers in the list xs", [(([1, 2, 3],), 6), (([],), 0)]),
    ("is_empty", "is_empty(xs)", "returns True if the list xs is empty", [(([],), True), (([1],), False)]),
)

_CHECKER = """import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script dir out
nonce = sys.stdin.readline().strip()
passed = 0
cases = {cases!r}
try:
    import solution
    fn = getattr(solution, {name!r})
except BaseException:
    fn = None
for args, want in cases:
    try:
        if fn is not None and fn(*args) == want:
            passed += 1
    except BaseException:
        pass
print("ETUDE", nonce, passed, len(cases))
"""


class PyFuncEnv(SingleTurnEnv):
    """Write a small Python function; hidden tests run in the sandbox."""

    name = "pyfunc"
    workers = 2
    rubric = make_rubric({"tests": _tests, "format": _fenced})
    weights = MappingProxyType({"tests": 1.0, "format": 0.0})

    def __init__(self, num_test: int = 4, seed: int = 0, rewards: dict[str, Any] | None = None):
        self.n_test = max(1, min(num_test, len(PYFUNCS) - 1))
        self.seed = seed
        self._sandbox_cfg: Any = None
        self.reward_config = self._reward_config(rewards)

    def problems(self, split: str) -> list[Problem]:
        if split not in ("train", "test"):
            raise EtudeError(f"unknown split {split!r}")
        cut = len(PYFUNCS) - self.n_test
        chosen = PYFUNCS[:cut] if split == "train" else PYFUNCS[cut:]
        return [self._problem(split, spec) for spec in chosen]

    def _problem(self, split: str, spec: tuple[str, str, str, list]) -> Problem:
        name, sig, desc, cases = spec
        q = f"Write a Python function `{sig}` that {desc}. Reply with only the code in a ```python block."
        return Problem(f"pyfunc-{split}-{name}", "pyfunc", (Message("user", q),), (name, cases))

    def measure(self, problem: Problem, text: str) -> dict[str, Any]:
        name, cases = problem.answer
        code, _ = extract_code(text)
        if self._sandbox_cfg is None:
            self._sandbox_cfg = SandboxConfig(timeout_s=10, memory_mb=512)
        nonce = secrets.token_hex(8)
        with tempfile.TemporaryDirectory(prefix="etude-pyfunc-") as ws:
            Path(ws, "solution.py").write_text(code)
            Path(ws, "check.py").write_text(_CHECKER.format(cases=cases, name=name))
            res = run(["python", "-I", "check.py"], workspace=Path(ws), config=self._sandbox_cfg, stdin=nonce + "\n")
        m = re.search(rf"^ETUDE {nonce} (\d+) (\d+)$", res.stdout, re.M)
        return {"tests": int(m.group(1)) / int(m.group(2)) if m else 0.0}

    def resolved(self, measured: dict[str, Any]) -> bool:
        return measured["tests"] == 1.0


def extract_code(text: str) -> tuple[str, bool]:
    """The first fenced code block (any language tag), else the whole text."""
    m = re.search(r"```[a-zA-Z0-9_+-]*\n(.*?)(```|$)", text, re.S)
    return (m.group(1), True) if m else (text, False)


class EpisodesEnv:
    """Replays stored episodes: each is one training problem, and `rollout` returns the stored
    episode of each problem asked for (the policy is not called; n must be 1). No held-out split:
    evaluating a candidate trained this way is the caller's (the loop's eval gate)."""

    name = "episodes"

    def __init__(self, episodes_file: str | None = None):
        if not episodes_file:
            raise EtudeError("env episodes needs episodes_file (a JSONL of Episode.to_dict())")
        try:
            lines = Path(episodes_file).read_text().splitlines()
        except OSError as e:
            raise EtudeError(f"cannot read episodes_file {episodes_file}: {e.strerror or e}") from None
        eps = [Episode.from_dict(json.loads(line)) for line in lines if line.strip()]
        self.episodes = [e for e in eps if e.turns and any(t.completion_ids for t in e.turns)]
        if not self.episodes:
            raise EtudeError(f"episodes_file {episodes_file} holds no episode with a completion")

    def problems(self, split: str) -> list[Problem]:
        if split != "train":
            return []
        return [Problem(id=f"{e.problem_id}#{i}", family=e.family, messages=(), answer=i)
                for i, e in enumerate(self.episodes)]

    def rollout(self, policy: Any, problems: Sequence[Problem], *, n: int, max_tokens: int, temperature: float,
                top_p: float, seed: int | None) -> list[Episode]:
        if n != 1:
            raise EtudeError(f"env episodes replays one stored episode per problem; group_size must be 1, not {n}")
        return [self.episodes[p.answer] for p in problems]


class FixTurnEnv(SingleTurnEnv):
    """The edit turn of fix drills (`etude.envs.fixturn`): the conversation up to a drill's edit
    turn is the prompt, and the reply is scored by what its edit does to the file: the rubric's
    terms are the tiers, 1 for the best one reached (weights 1.0 the gold file, 0.3 an edit of the
    buggy line, 0.1 an edit elsewhere, 0 well-formed calls, -0.2 unparsable)."""

    name = "fix"
    workers = 4
    rubric = fixturn.FIX_RUBRIC
    weights = fixturn.REWARDS

    def __init__(self, tasks_file: str | None = None, eval_tasks_file: str | None = None, num_train: int = 256,
                 num_test: int = 64, harness: dict[str, Any] | None = None, rewards: dict[str, Any] | None = None):
        if not tasks_file:
            raise EtudeError("env fix needs tasks_file (a JSONL of tasks, or builtin:curriculum:train)")
        self.specs = {"train": (tasks_file, num_train),
                      "test": (eval_tasks_file or "builtin:curriculum:validation", num_test)}
        self.hc = HarnessConfig.from_table(dict(harness or {}), "env.harness")  # a bad key fails now
        self.reward_config = self._reward_config(rewards)
        self._problems: dict[str, list[Problem]] = {}

    def problems(self, split: str) -> list[Problem]:
        if split not in self.specs:
            raise EtudeError(f"unknown split {split!r}")
        if split not in self._problems:
            spec, limit = self.specs[split]
            use, where = ("train", "env.tasks_file") if split == "train" else ("select", "env.eval_tasks_file")
            tasks = load_task_spec(spec, limit or None, use=use, where=where)
            items = fixturn.edit_turn_prompts(tasks, self.hc, fixturn.drill_cache(self.hc))
            if split == "train" and not items:
                raise EtudeError(f"env fix: no task of {spec} has a drill (single-hunk level-1 tasks do)")
            self._problems[split] = [
                Problem(f"fix-{it['task']}", "fix", tuple(it["messages"]),
                        {k: it[k] for k in ("src", "gold", "path", "bug_line")})
                for it in items]
        return self._problems[split]

    def measure(self, problem: Problem, text: str) -> dict[str, Any]:
        a = problem.answer
        # the drills' call syntax (env.harness tool_format; "auto" without a policy: hermes)
        return fixturn.score_edit(text, a["src"], a["gold"], a["path"], a["bug_line"], self.hc.text_format())

    def resolved(self, measured: dict[str, Any]) -> bool:
        return measured["right_fix"]


ENVS = {"arith": ArithEnv, "pyfunc": PyFuncEnv, "tasks": TasksEnv, "episodes": EpisodesEnv, "fix": FixTurnEnv}


def make_env(cfg: Any) -> Env:
    """Build the env named by an `EnvConfig`."""
    cls = ENVS.get(cfg.name)
    if cls is None:
        raise EtudeError(f"unknown env {cfg.name!r}; known: {', '.join(ENVS)}")
    # Each env gets the config fields its constructor takes, so a direct call with a misspelt
    # key fails (no **kwargs sink swallows it).
    takes = inspect.signature(cls).parameters
    return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name in takes})
