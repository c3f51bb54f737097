"""`etude sft`: the supervised warm start on agent trajectories, rendered by the one renderer that
serving and RL use (`etude.policy.local.encode_conversation`), with the loss on assistant tokens
only (tool calls and final answers).

Read top to bottom in `run_sft`:
1. gather trajectories from the configured sources, each cached under OUT/data/ as it is made:
   - `expert`: the scripted expert (etude.envs.expert) on curriculum tasks, through the real
     harness and sandbox, kept only when grading in a clean copy says resolved;
   - `self`: the policy's own resolved episodes (rejection sampling, `self_k` per task, deduped);
   - `production`: distilled interactions with positive reward (`etude distill` JSONL);
2. turn each into one token sequence — the prompt of every assistant turn is exactly what the
   harness would send the model at that turn, and its completion exactly what the model would
   have sampled (content + end-of-turn); turns whose prompts extend the previous sequence share
   it, so a 5-turn episode is one sequence, not five;
3. pack sequences into rows (first-fit decreasing, block-diagonal mask, restarting positions),
   mix sources by weight, train (AdamW, bf16 autocast, full weights or LoRA), checkpoint every
   `checkpoint_every` steps (weights as safetensors + optimizer + cursor), resume after a kill;
4. write OUT/final: a model directory every other command loads (`--model OUT/final`); a LoRA run
   is merged into the base weights there.

Not guaranteed: bit-identical continuation after resume with a different number of threads.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etude.configfile import apply_overrides, read_toml
from etude.envs import run_episode
from etude.envs.episode import open_task_episode, task_harness_config, task_request
from etude.envs.expert import ExpertPolicy
from etude.errors import EtudeError
from etude.harness.config import HarnessConfig
from etude.harness.record import trajectory_from_dict
from etude.policy.batcher import BatchedPolicy
from etude.policy.local import LocalPolicy, completion_ids, encode_conversation
from etude.policy.models import load_model
from etude.tasks.curriculum import builtin_curriculum
from etude.tasks.repo import prepare_repo
from etude.tasks.schema import load_tasks
from etude.tasks.seal import check_sources
from etude.train.checkpoint import ckpt_root, latest_checkpoint, load_checkpoint, save_checkpoint
from etude.train.config import LoraConfig, _build
from etude.train.lora import merge_and_save, save_adapter, wrap_lora
from etude.train.metrics import MetricsWriter
from etude.types import Message, Task, Trajectory

SOURCES = ("expert", "self", "production")


@dataclass(frozen=True)
class SourcesConfig:
    expert: float = 1.0
    """Weight of scripted-expert trajectories (0 turns the source off)."""
    self: float = 0.0
    """Weight of the policy's own resolved episodes (rejection sampling)."""
    production: float = 0.0
    """Weight of distilled production interactions with positive reward."""
    self_k: int = 4
    """Episodes per task for the `self` source."""
    self_model: str | None = None
    """Model that samples the `self` episodes (default: the config's `model`)."""
    production_file: str | None = None
    """JSONL of scored samples from `etude distill` (the `production` source)."""
    drill: float = 0.0
    """Weight of fix drills (`drill_trajectories`): grep, read, the gold edit, no tests run."""
    drill_tasks: str | None = None
    """Where drills come from: a tasks JSONL or "builtin:<split>" (default: the config's `tasks`),
    built with curriculum seed `drill_seed`; tasks also in `tasks` are left out (the expert does them)."""
    drill_seed: int = 7
    """Curriculum seed of built-in drill tasks: another seed mutates other sites of the same packages."""


@dataclass(frozen=True)
class SFTConfig:
    model: str = "smollm2"
    """Model to fine-tune: "smollm2", "tiny" or a model directory."""
    tasks: str = "builtin:train"
    """Where expert and self episodes come from: "builtin:<split>" (the curriculum split) or a JSONL."""
    level: int = 1
    """Curriculum level of built-in tasks."""
    max_tasks: int | None = None
    """Use at most this many tasks (None: all)."""
    epochs: float = 1.0
    """Passes over the mixed data (fractions allowed)."""
    lr: float = 5e-5
    """Peak learning rate (linear warm-up over `warmup_steps`, then cosine to 10%)."""
    warmup_steps: int = 5
    weight_decay: float = 0.0
    batch_sequences: int = 8
    """Sequences per optimizer step."""
    row_tokens: int = 0
    """Packing budget of one forward row (a longer sequence gets a row of its own); 0 = one
    sequence per row. NOTE: on CPU keep 0: a packed row needs a dense block-diagonal mask, which
    sends attention down PyTorch's math path (O(L²) memory, ~10x slower here), while a lone
    sequence runs the fused causal kernel. A multi-turn episode is still one sequence."""
    max_sequence_tokens: int = 6144
    """Sequences longer than this are dropped (counted in the data summary)."""
    max_grad_norm: float = 1.0
    precision: str = "bf16"
    """"bf16" (autocast; fp32 master weights) or "fp32"."""
    seed: int = 0
    checkpoint_every: int = 20
    """Save weights + optimizer + cursor every this many steps (and at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (the oldest go first); a budget curve keeps them all."""
    time_limit_s: float | None = None
    """Stop training after the step that ends past this many wall seconds of this invocation
    (gathering included), then save and export as at the last step (the learning rate is then
    cut off mid-schedule). None: every step."""
    expert_workers: int = 2
    """Episodes run at once while gathering expert trajectories."""
    threads: int | None = None
    """torch threads (None: torch's default)."""
    harness: dict[str, Any] = field(default_factory=dict)
    """HarnessConfig fields for the episodes (max_steps, max_observation_chars, tools, ...)."""
    allow_test_split: bool = False
    """Let `tasks` / `sources.drill_tasks` hold sealed test-split packages (etude.tasks.seal; CLI
    --allow-test-split); the run is then marked contaminated in OUT/summary.json."""
    sources: SourcesConfig = SourcesConfig()
    lora: LoraConfig = LoraConfig()

    def __post_init__(self) -> None:
        if self.precision not in ("bf16", "fp32"):
            raise EtudeError(f"sft precision must be bf16 or fp32, not {self.precision!r}")
        if self.epochs <= 0 or self.batch_sequences < 1 or self.lr <= 0:
            raise EtudeError("epochs, batch_sequences and lr must be positive")
        if self.level not in (1, 2, 3):
            raise EtudeError(f"level must be 1, 2 or 3, not {self.level}")
        HarnessConfig.from_table(self.harness)  # a bad harness key is an error now, not after data gathering

    def harness_config(self) -> HarnessConfig:
        return HarnessConfig.from_table(self.harness)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_sft_config(path: str | Path, overrides: dict[str, Any] | None = None) -> SFTConfig:
    p = Path(path)
    if not p.is_file():
        raise EtudeError(f"no config file at {p}")
    return sft_config_from_dict(apply_overrides(read_toml(p, "sft config"), overrides))


def sft_config_from_dict(data: dict[str, Any]) -> SFTConfig:
    d = dict(data)
    if "sources" in d:
        d["sources"] = _build(SourcesConfig, d["sources"], "sources")
    if "lora" in d:
        d["lora"] = _build(LoraConfig, d["lora"], "lora")
    if "harness" in d and not isinstance(d["harness"], dict):
        raise EtudeError("[harness] must be a table")
    harness = d.pop("harness", {})
    cfg = _build(SFTConfig, d, "config")
    return dataclasses.replace(cfg, harness=dict(harness))


# ---------------------------------------------------------------- tasks


def load_task_source(spec: str, level: int = 1, max_tasks: int | None = None,
                     progress: Callable[[str], None] | None = None, seed: int = 0) -> list[Task]:
    """"builtin:<split>" → the curriculum split at `level` (built with curriculum `seed`); anything
    else → a tasks JSONL."""
    if spec.startswith("builtin:"):
        return builtin_curriculum(spec.split(":", 1)[1], level, seed=seed, max_tasks=max_tasks, progress=progress)

    p = Path(spec)
    if not p.is_file():
        raise EtudeError(f"no tasks file at {p} (give a JSONL or builtin:train|validation|test)")
    tasks = load_tasks(p)
    return tasks[:max_tasks] if max_tasks else tasks


def new_drill_tasks(candidates: Sequence[Task], expert_tasks: Sequence[Task]) -> list[Task]:
    """The candidates worth a fix drill: one per bug (the first task of each patch), none whose
    patch is already an expert task's (the expert works that bug whole)."""
    seen = {t.patch for t in expert_tasks}
    out: list[Task] = []
    for t in candidates:
        if t.patch not in seen:
            seen.add(t.patch)
            out.append(t)
    return out


# ---------------------------------------------------------------- trajectories


class _JsonlCache:
    """Append-only JSONL of {"task_id", "key", "resolved", "trajectory"}; resumable by key."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self.rows: list[dict[str, Any]] = []
        if path.is_file():
            for ln in path.read_text().splitlines():
                try:
                    self.rows.append(json.loads(ln))
                except json.JSONDecodeError:
                    continue  # a line cut by a kill: that episode is simply run again
        self.done = {r["key"] for r in self.rows}

    def add(self, row: dict[str, Any]) -> None:
        with self.lock:
            path = self.path
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            self.rows.append(row)
            self.done.add(row["key"])


def expert_trajectories(tasks: Sequence[Task], hc: HarnessConfig, out: Path, *, seed: int = 0, workers: int = 2,
                        progress: Callable[[int, int], None] | None = None) -> list[Trajectory]:
    """Resolved expert trajectories, one per task that the expert can plan for (cached in `out`)."""

    cache = _JsonlCache(out)
    todo = [t for t in tasks if f"{t.instance_id}:{seed}" not in cache.done]

    def one(t: Task) -> None:
        key = f"{t.instance_id}:{seed}"
        try:
            template = prepare_repo(t)
            pol = ExpertPolicy.for_task(t, template, seed)
            if pol is None:
                cache.add({"task_id": t.instance_id, "key": key, "resolved": False, "skipped": "no plan"})
                return
            traj, outcome = run_episode(t, pol, hc)
            if pol.decoy_failed is False:  # its wrong fix passed the test: not a recovery to learn
                pol = ExpertPolicy(t, template, seed, wrong_first=False)  # a plan without one
                traj, outcome = run_episode(t, pol, hc)
            if pol.untrained:
                traj = dataclasses.replace(traj, meta={**traj.meta, "untrained_turns": list(pol.untrained)})
            cache.add({"task_id": t.instance_id, "key": key, "resolved": outcome.resolved,
                       "trajectory": traj.to_dict() if outcome.resolved else None})
        except Exception as e:  # noqa: BLE001 - one task the expert cannot do must not stop the gathering
            cache.add({"task_id": t.instance_id, "key": key, "resolved": False,
                       "skipped": f"{type(e).__name__}: {e}"[:200]})

    _run_all(todo, one, workers, len(tasks) - len(todo), len(tasks), progress)
    return [Trajectory_from(r["trajectory"]) for r in cache.rows if r.get("resolved") and r.get("trajectory")]


def drill_trajectories(tasks: Sequence[Task], hc: HarnessConfig, out: Path, *, seed: int = 0, workers: int = 2,
                       progress: Callable[[int, int], None] | None = None) -> list[Trajectory]:
    """Fix drills (cached in `out`): on each task the expert greps for the function, reads it and
    makes the gold edit through the real harness and tools, and nothing runs the tests or grades
    the diff (the edit is the gold hunk, so it undoes the bug by construction). A drill costs a
    workspace and a few in-process tool calls where a full expert episode also runs the tests
    and grades, so many more bugs can be shown for the same time. Its final answer is untrained
    (`meta.untrained_turns`): it would claim a result nobody checked. A drill whose edit the tool
    refused is dropped."""
    cache = _JsonlCache(out)
    todo = [t for t in tasks if f"{t.instance_id}:{seed}" not in cache.done]

    def one(t: Task) -> None:
        key = f"{t.instance_id}:{seed}"
        try:
            pol = ExpertPolicy.for_task(t, prepare_repo(t), seed, drill=True)
            if pol is None:
                cache.add({"task_id": t.instance_id, "key": key, "resolved": False, "skipped": "no plan"})
                return
            with open_task_episode(t) as ep:
                traj = ep.run(pol, task_request(t), task_harness_config(t, hc), task_id=t.instance_id)
                traj = dataclasses.replace(traj, diff=traj.diff or ep.diff())
            edits = [m for m in traj.messages if m.role == "tool" and m.name == "edit_file"]
            ok = len(edits) == 1 and not edits[0].content.startswith("Error")
            traj = dataclasses.replace(traj, meta={**traj.meta, "untrained_turns": list(pol.untrained), "drill": True})
            cache.add({"task_id": t.instance_id, "key": key, "resolved": ok, "trajectory": traj.to_dict() if ok else None})
        except Exception as e:  # noqa: BLE001 - one task the expert cannot do must not stop the gathering
            cache.add({"task_id": t.instance_id, "key": key, "resolved": False,
                       "skipped": f"{type(e).__name__}: {e}"[:200]})

    _run_all(todo, one, workers, len(tasks) - len(todo), len(tasks), progress)
    return [Trajectory_from(r["trajectory"]) for r in cache.rows if r.get("resolved") and r.get("trajectory")]


def self_trajectories(tasks: Sequence[Task], model: str, hc: HarnessConfig, out: Path, *, k: int = 4,
                      seed: int = 0, workers: int = 8,
                      progress: Callable[[int, int], None] | None = None) -> list[Trajectory]:
    """The policy's own resolved episodes (k per task), deduplicated by diff and call sequence."""

    cache = _JsonlCache(out)
    jobs = [(t, i) for t in tasks for i in range(k) if f"{t.instance_id}:{seed}:{i}" not in cache.done]
    if jobs:
        policy = BatchedPolicy(load_policy(model), max_batch=workers)

        def one(job: tuple[Task, int]) -> None:
            t, i = job
            traj, outcome = run_episode(t, policy, hc)
            cache.add({"task_id": t.instance_id, "key": f"{t.instance_id}:{seed}:{i}", "resolved": outcome.resolved,
                       "trajectory": traj.to_dict() if outcome.resolved else None})

        try:
            _run_all(jobs, one, workers, len(tasks) * k - len(jobs), len(tasks) * k, progress)
        finally:
            policy.close()
    seen: set[tuple[str, str]] = set()
    out_trajs = []
    for r in cache.rows:
        if not (r.get("resolved") and r.get("trajectory")):
            continue
        tr = Trajectory_from(r["trajectory"])
        sig = (tr.diff, "|".join(x.call.name for x in tr.tool_calls))
        if sig not in seen:
            seen.add(sig)
            out_trajs.append(tr)
    return out_trajs


def load_policy(model: str) -> Any:
    """A LocalPolicy for "smollm2", "tiny" or a model directory; a bad path is one clear line."""

    if model not in ("smollm2", "tiny") and not (Path(model) / "config.json").is_file():
        raise EtudeError(f"not a model directory (no config.json): {model}")
    try:
        return LocalPolicy.from_pretrained(model)
    except Exception as e:  # noqa: BLE001 - an unreadable checkpoint is the operator's error
        raise EtudeError(f"cannot load model {model!r}: {type(e).__name__}: {e}") from None


def _run_all(items: Sequence[Any], fn: Callable[[Any], None], workers: int, done: int, total: int,
             progress: Callable[[int, int], None] | None) -> None:
    with ThreadPoolExecutor(max(1, workers)) as pool:
        for _ in pool.map(fn, items):
            done += 1
            if progress:
                progress(done, total)


def Trajectory_from(d: dict[str, Any]) -> Trajectory:  # noqa: N802 - reads like the type it builds
    return trajectory_from_dict(d)


# ---------------------------------------------------------------- token sequences


@dataclass
class Sequence_:
    ids: list[int]
    labels: list[int]  # -100 where no loss
    source: str = "expert"

    @property
    def loss_tokens(self) -> int:
        return sum(1 for x in self.labels if x != -100)


def conversation_sequences(tokenizer: Any, messages: Sequence[Message], source: str = "expert",
                           untrained: Collection[int] = ()) -> list[Sequence_]:
    """Token sequences of a conversation with the loss on each assistant turn, except the turns
    numbered (0-based, assistant turns only) in `untrained` (an expert's deliberate wrong fix).
    Each turn's prompt is `encode_conversation(messages[:k])` — what the harness sends at that
    turn — and its target `completion_ids(messages[k])`; a turn whose prompt starts with the
    running sequence extends it, any other starts a new sequence (so the result is exact either
    way)."""
    out: list[Sequence_] = []
    cur: Sequence_ | None = None
    turn = -1
    for k, m in enumerate(messages):
        if m.role != "assistant":
            continue
        turn += 1
        prompt = encode_conversation(tokenizer, messages[:k])
        comp = completion_ids(tokenizer, m)
        target = [-100] * len(comp) if turn in untrained else comp
        if cur is not None and prompt[: len(cur.ids)] == cur.ids:
            extra = prompt[len(cur.ids):]
            cur.ids += extra + comp
            cur.labels += [-100] * len(extra) + target
        else:
            cur = Sequence_(list(prompt) + comp, [-100] * len(prompt) + target, source)
            out.append(cur)
    return out


def production_sequences(path: Path) -> list[Sequence_]:
    """Single-turn sequences from `etude distill` output with positive total reward."""
    if not path.is_file():
        raise EtudeError(f"no production samples at {path} (write them with `etude distill`)")
    out = []
    for ln in path.read_text().splitlines():
        try:
            r = json.loads(ln)
        except json.JSONDecodeError:
            continue
        if float((r.get("reward") or {}).get("total", 0.0)) > 0 and r.get("completion_token_ids"):
            p, c = list(r["prompt_token_ids"]), list(r["completion_token_ids"])
            out.append(Sequence_(p + c, [-100] * len(p) + c, "production"))
    return out


def mix(pools: dict[str, list[Sequence_]], weights: dict[str, float], epochs: float, seed: int) -> list[Sequence_]:
    """One shuffled training order: each source contributes in proportion to its weight, relative
    to the expert pool's size (or the largest pool when there is no expert), times `epochs`."""
    rng = random.Random(seed)
    live = {s: p for s, p in pools.items() if p and weights.get(s, 0) > 0}
    if not live:
        raise EtudeError("no usable SFT trajectories: every enabled source came back empty")
    base = len(live.get("expert") or max(live.values(), key=len))
    total_w = sum(weights[s] for s in live)
    order: list[Sequence_] = []
    for s, pool in live.items():
        want = int(round(epochs * base * len(live) * weights[s] / total_w))
        picks = [pool[i % len(pool)] for i in range(want)]
        order += picks
    rng.shuffle(order)
    return order


# ---------------------------------------------------------------- training


def pack_rows(seqs: Sequence[Sequence_], budget: int) -> list[list[int]]:
    """Indices grouped into rows of ≤ `budget` tokens (first-fit decreasing)."""
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i].ids))
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = len(seqs[i].ids)
        for r, free in enumerate(room):
            if n <= free:
                rows[r].append(i)
                room[r] -= n
                break
        else:
            rows.append([i])
            room.append(budget - n)
    return rows


def row_loss(model: Any, seqs: Sequence[Sequence_]) -> tuple[Any, int]:
    """Summed cross-entropy over the label tokens of one packed row, and how many there are."""
    import torch

    dev = next(model.parameters()).device
    ids, pos, grp, labels = [], [], [], []
    for g, s in enumerate(seqs):
        ids += s.ids
        pos += list(range(len(s.ids)))
        grp += [g] * len(s.ids)
        labels += s.labels[1:] + [-100]  # the label at position t is the token at t + 1
    keep = [i for i, y in enumerate(labels) if y != -100]
    if not keep:
        return torch.zeros((), device=dev), 0
    kw: dict[str, Any] = {}
    if len(seqs) > 1:
        L = len(ids)
        g = torch.tensor(grp, device=dev)
        mask = torch.tril(torch.ones(L, L, dtype=torch.bool, device=dev)) & (g[:, None] == g[None, :])
        kw["attention_mask"] = mask[None, None]
    logits = model(input_ids=torch.tensor([ids], device=dev), position_ids=torch.tensor([pos], device=dev),
                   logits_to_keep=torch.tensor(keep, device=dev), **kw).logits[0]
    target = torch.tensor([labels[i] for i in keep], device=dev)
    loss = torch.nn.functional.cross_entropy(logits.float(), target, reduction="sum")
    return loss, len(keep)


def lr_at(cfg: SFTConfig, step: int, total: int) -> float:
    """The learning rate of step `step` (from 0) of `total`: linear warm-up over
    `cfg.warmup_steps`, then cosine decay from `cfg.lr` to a tenth of it."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


class SFTTrainer:
    """The SFT trainer: `cfg.model` (fp32 weights, on the GPU when there is one; a LoRA adapter
    when `cfg.lora.enabled`) and AdamW over its trainable parameters. `step(batch, lr)` takes one
    optimiser step on a batch of `Sequence_` (rows packed to `cfg.row_tokens` when set, under bf16
    autocast when `cfg.precision` says so); `save`/`restore` checkpoint in etude.train.checkpoint's
    layout; `export` writes the final model. `run_sft` drives it; bench/gpu_sft.py too."""

    def __init__(self, cfg: SFTConfig, out: Path):
        import torch


        self.cfg, self.out = cfg, out
        torch.manual_seed(cfg.seed)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        try:
            self.model, self.tokenizer = load_model(cfg.model)
        except EtudeError:
            raise
        except Exception as e:  # noqa: BLE001 - a path that is not a model is the operator's error
            raise EtudeError(f"cannot load model {cfg.model!r}: {type(e).__name__}: {e}") from None
        self.model.float()
        if torch.cuda.is_available():  # a GPU when there is one (the learner's weights stay fp32)
            self.model.to("cuda")
        if cfg.lora.enabled:
            self.model = wrap_lora(self.model, cfg.lora)
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
        self.params = params
        self.updates, self.dist = 0, None  # what etude.train.checkpoint reads of a learner

    def autocast(self) -> Any:
        import contextlib

        import torch

        if self.cfg.precision == "bf16":
            return torch.autocast("cpu" if not torch.cuda.is_available() else "cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(self, batch: Sequence[Sequence_], lr: float) -> dict[str, float]:
        import torch

        for g in self.opt.param_groups:
            g["lr"] = lr
        n_tok = sum(s.loss_tokens for s in batch)
        total = 0.0
        rows = pack_rows(batch, self.cfg.row_tokens) if self.cfg.row_tokens else [[i] for i in range(len(batch))]
        for row in rows:
            with self.autocast():
                loss, n = row_loss(self.model, [batch[i] for i in row])
            if n:
                (loss / max(1, n_tok)).backward()
                total += float(loss.detach())
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return {"loss": total / max(1, n_tok), "grad_norm": float(norm), "tokens": float(sum(len(s.ids) for s in batch)),
                "loss_tokens": float(n_tok), "lr": lr}

    # -- checkpoints: the layout of etude.train.checkpoint (safetensors weights, optimizer and RNG,
    # state.json, written atomically, `latest` a file naming the step)

    def save(self, step: int, state: dict[str, Any]) -> Path:
        self.updates = step
        return save_checkpoint(self.out, self, {**state, "step": step}, keep=self.cfg.keep_checkpoints)

    def restore(self) -> dict[str, Any] | None:
        latest = ckpt_root(self.out) / "latest"
        if latest.is_symlink():  # written before the shared layout (optimizer.pt); not read any more
            raise EtudeError(f"{self.out} holds an SFT checkpoint of an older etude (pickled optimizer); "
                             "rerun with a new --out, or delete its checkpoints/ to start over")
        path = latest_checkpoint(self.out)
        return load_checkpoint(path, self) if path is not None else None

    def export(self) -> Path:
        """OUT/final: a plain model directory (LoRA merged) that every command loads; a LoRA run
        also writes the adapter alone to OUT/adapter (its base recorded in adapter_config.json)."""
        if self.cfg.lora.enabled:
            save_adapter(self.model, self.tokenizer, self.out / "adapter", base=self.cfg.model)
        return merge_and_save(self.model, self.tokenizer, self.out / "final")


def gather(cfg: SFTConfig, out: Path, progress: Any = None) -> dict[str, list[Trajectory] | list[Sequence_]]:
    """Trajectories (expert, self) and production sequences, per source, from cache or made now."""
    hc = cfg.harness_config()
    pools: dict[str, Any] = {}
    w = cfg.sources
    tasks: list[Task] = []
    if w.expert > 0 or w.self > 0:
        tasks = load_task_source(cfg.tasks, cfg.level, cfg.max_tasks)
        if not tasks:
            raise EtudeError(f"no tasks in {cfg.tasks}")
    if w.expert > 0:
        pools["expert"] = expert_trajectories(tasks, hc, out / "data" / "expert.jsonl", seed=cfg.seed,
                                              workers=cfg.expert_workers,
                                              progress=progress and progress("expert episodes"))
    if w.self > 0:
        pools["self"] = self_trajectories(tasks, w.self_model or cfg.model, hc, out / "data" / "self.jsonl",
                                          k=w.self_k, seed=cfg.seed,
                                          progress=progress and progress("own episodes"))
    if w.production > 0:
        if not w.production_file:
            raise EtudeError("sources.production > 0 needs sources.production_file (from `etude distill`)")
        pools["production"] = production_sequences(Path(w.production_file))
    if w.drill > 0:
        spec = w.drill_tasks or cfg.tasks
        drill_tasks = new_drill_tasks(load_task_source(spec, cfg.level, None, seed=w.drill_seed), tasks)
        if not drill_tasks:
            raise EtudeError(f"sources.drill > 0 but {spec} has no tasks beyond the expert's")
        pools["drill"] = drill_trajectories(drill_tasks, hc, out / "data" / "drill.jsonl", seed=cfg.seed,
                                            workers=cfg.expert_workers, progress=progress and progress("fix drills"))
    return pools


def _finished(cfg: SFTConfig, out: Path) -> dict[str, Any] | None:
    """The summary of a finished run of this very config in `out` (its final model present)."""
    try:
        same = json.loads((out / "config.json").read_text()) == json.loads(json.dumps(cfg.to_dict()))
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not same or not (out / "final" / "config.json").is_file():
        return None
    return {**summary, "resumed_from_step": summary["steps"]}


def run_sft(cfg: SFTConfig, out_dir: str | Path, *, progress: bool = True) -> dict[str, Any]:
    """Gather, tokenise, train (or resume) and export; returns a summary (also OUT/summary.json)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress display (ours), not one per shard save
    out = Path(out_dir)
    w = cfg.sources
    contamination = check_sources([("sft tasks", cfg.tasks if (w.expert > 0 or w.self > 0) else None),
                                   ("sft sources.drill_tasks", (w.drill_tasks or cfg.tasks) if w.drill > 0 else None)],
                                  cfg.allow_test_split)
    out.mkdir(parents=True, exist_ok=True)
    if (done := _finished(cfg, out)) is not None:
        return done  # the same run, already finished: nothing to gather, train or export again
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    t0 = time.time()
    cols = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn())
    with Progress(*cols, disable=not progress) as bar:
        def tracker(name: str) -> Callable[[int, int], None]:
            job = bar.add_task(name, total=None, info="")

            def update(done: int, total: int) -> None:
                bar.update(job, completed=done, total=total)
            return update

        pools = gather(cfg, out, tracker)
        gather_s = time.time() - t0
        trainer = SFTTrainer(cfg, out)
        seqs: dict[str, list[Sequence_]] = {}
        dropped = 0
        for src, items in pools.items():
            if src == "production":
                cand = list(items)
            else:
                cand = [s for tr in items for s in conversation_sequences(
                    trainer.tokenizer, tr.messages, src, tr.meta.get("untrained_turns") or ())]
            keep = [s for s in cand if len(s.ids) <= cfg.max_sequence_tokens and s.loss_tokens]
            dropped += len(cand) - len(keep)
            seqs[src] = keep
        weights = {"expert": cfg.sources.expert, "self": cfg.sources.self, "production": cfg.sources.production,
                   "drill": cfg.sources.drill}
        order = mix(seqs, weights, cfg.epochs, cfg.seed)
        steps = math.ceil(len(order) / cfg.batch_sequences)
        state = trainer.restore() or {"step": 0}
        metrics = MetricsWriter(out, resume_step=state["step"] if state["step"] else -1)
        job = bar.add_task("sft", total=steps, completed=state["step"], info="")
        last: dict[str, Any] = {}
        try:
            t_train = time.time()
            done = state["step"]
            for step in range(state["step"], steps):
                if cfg.time_limit_s is not None and step > state["step"] and time.time() - t0 >= cfg.time_limit_s:
                    break  # the budget is spent: save and export this step below
                batch = order[step * cfg.batch_sequences:(step + 1) * cfg.batch_sequences]
                ts = time.time()
                rec = trainer.step(batch, lr_at(cfg, step, steps))
                rec.update({"kind": "train", "step": step + 1, "step_s": time.time() - ts,
                            "tokens_per_s": rec["tokens"] / max(1e-9, time.time() - ts), "time": time.time()})
                metrics.write(rec)
                last = rec
                bar.update(job, completed=step + 1, info=f"loss {rec['loss']:.3f}")
                done = step + 1
                if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < steps:
                    trainer.save(step + 1, {"steps": steps})
            train_s = time.time() - t_train
        finally:
            metrics.close()
    if done:
        trainer.save(done, {"steps": steps})
    final = trainer.export()
    summary = {
        "out": str(out), "final": str(final), "steps": done, "planned_steps": steps,
        "resumed_from_step": state["step"] or None,
        "sequences": {s: len(v) for s, v in seqs.items()}, "trajectories": {s: len(v) for s, v in pools.items()},
        "dropped_too_long": dropped, "train_tokens": sum(len(s.ids) for s in order),
        "loss_tokens": sum(s.loss_tokens for s in order), "last": last,
        "gather_s": round(gather_s, 1), "train_s": round(train_s, 1),
        **({"adapter": str(out / "adapter")} if cfg.lora.enabled else {}),
        **({"contamination": contamination} if contamination else {}),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
