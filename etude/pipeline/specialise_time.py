"""`etude specialise --until`: learn an organisation's code up to a cut-off, measured on what it
wrote after.

Read top to bottom in `run_time_specialise` (stages resume through etude.pipeline.stages):

1. split    — per repository (etude.tasks.timesplit): the cut-off commit, the text of its
              tree for training, the lines added after it for measuring. DIR/<repo>/split.json
              and items.jsonl; the split's proof (`check_no_leak`) is checked against the
              repository before anything trains;
2. train    — one LoRA adapter on all the repositories' cut-off text (etude.pipeline.codelm),
              saved at each fraction of the budget in `checkpoints` (the budget curve);
3. score    — base and each checkpoint on every repository's held-out lines, and base and the
              final adapter on the `--regress` repositories' post-cut-off lines (no regression
              elsewhere); one teacher-forced pass per line (codelm.score_items);
4. report   — DIR/report.json: per repository the loss, completion and adherence comparisons,
              each paired, with its interval and test, Holm-corrected within its family across
              repositories (`figure_specs`, computed by etude.evals.results.compute_figures from
              DIR/records.jsonl, the same way bench/verify.py recomputes a result file);
5. register — with --register, DIR/adapter becomes the org's candidate (what `etude loop --org`
              canaries), with the report's figures in its meta.

What this does not guarantee: a gain on every repository; that a line a model predicts under
teacher forcing is the line it would type after its own mistakes (each measure conditions on the
true prefix, as next-line and next-identifier completion benchmarks do); agent-level adherence on
held-out history tasks (the agent's edits calling the repository's functions) is not measured here
yet: `repo_em` is its line-level counterpart.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from etude.errors import EtudeError
from etude.evals.codelm import load_scorer, records_of, score_items
from etude.evals.results import compute_figures
from etude.paths import cache
from etude.pipeline.codelm import train_on_text
from etude.pipeline.specialise import check_base, check_org
from etude.pipeline.stages import Stages
from etude.policy.models import resolve
from etude.serve import registry
from etude.store import open_store
from etude.tasks.timesplit import (
    Document,
    build_split,
    cat_blobs,
    check_no_leak,
    defined_names,
    items_from_jsonl,
    items_to_jsonl,
    resolve_cutoff,
    resolve_repo,
)


@dataclass(frozen=True)
class TimeSpecialiseConfig:
    org: str
    repos: tuple[str, ...]
    """a local git repository or a builtin:history repository's name, each."""
    until: tuple[str, ...]
    """the cut-off: one for every repository, or one each (a revision or YYYY-MM-DD)."""
    out: str
    base: str = "smollm2"
    minutes: float = 8.0
    """training budget, wall minutes (the run also stops after `epochs` passes over the text)."""
    checkpoints: tuple[float, ...] = (0.25, 0.5, 1.0)
    """fractions of the budget at which the adapter is saved and measured (the budget curve)."""
    regress: tuple[str, ...] = ()
    """other repositories (same spellings) whose post-cut-off lines must not get worse."""
    regress_until: tuple[str, ...] = ()
    items: int = 320
    """held-out lines per repository (round-robin over its commits after the cut-off)."""
    gate_items: int = 120
    """further lines of the same commits (the round-robin continued, none of `items`) in
    DIR/<repo>/gate.jsonl: what `etude loop --org` gates this adapter on, so the held-out lines
    stay read once, for the report."""
    ctx_tokens: int = 256
    block: int = 512
    batch: int = 4
    lr: float = 5e-4
    epochs: float = 2.0
    val_fraction: float = 0.05
    """share of the cut-off's text kept out of training; the checkpoint with the lowest loss on it
    is shipped (early stopping that reads nothing written after the cut-off)."""
    lora_r: int = 16
    lora_alpha: int = 32
    seed: int = 0
    loss_margin: float = 0.05
    """no regression: the adapter's loss on another repository's lines at most this many nats per
    token above the base's (one-sided paired test)."""
    acc_margin: float = 0.01
    """no regression: its token accuracy there at most this much below the base's."""
    register: bool = False
    db: str | None = None

    def __post_init__(self) -> None:
        if not self.repos:
            raise EtudeError("--repos is empty")
        if len(self.until) not in (1, len(self.repos)):
            raise EtudeError(f"--until: give one cut-off, or one per repository ({len(self.repos)})")
        if self.regress and len(self.regress_until) not in (1, len(self.regress)):
            raise EtudeError("--regress-until: give one cut-off, or one per --regress repository")
        if self.minutes <= 0 or not self.checkpoints or not all(0 < f <= 1 for f in self.checkpoints):
            raise EtudeError("--minutes must be positive and checkpoints fractions in (0, 1]")
        if 1.0 not in self.checkpoints:
            object.__setattr__(self, "checkpoints", tuple(sorted({*self.checkpoints, 1.0})))

    def cutoffs(self) -> list[tuple[str, str, str]]:
        """(spec, until, role) of every repository: "own" (trained and measured) or "regress"."""
        own = [(r, self.until[0] if len(self.until) == 1 else self.until[i], "own") for i, r in enumerate(self.repos)]
        ru = self.regress_until or self.until[:1]
        other = [(r, ru[0] if len(ru) == 1 else ru[i], "regress") for i, r in enumerate(self.regress)]
        return own + other


def arm_of(fraction: float, chosen: float = 1.0) -> str:
    """The records' arm of a checkpoint: "adapter" for the one the run ships (`chosen`, by the
    loss on the cut-off's held-out blocks), "adapter@F" for the budget curve's others."""
    return "adapter" if fraction == chosen else f"adapter@{fraction:g}"


def figure_specs(run: str, own: Sequence[str], regress: Sequence[str], fractions: Sequence[float], *,
                 loss_margin: float, acc_margin: float, prefix: str = "", chosen: float = 1.0) -> dict[str, dict[str, Any]]:
    """The report's comparisons (each adapter arm against the base, paired by line). Families:
    `loss`, `completion` (token accuracy and the three exact matches) and `adherence` across the
    repositories (Holm within each), for the shipped checkpoint (`chosen`); the budget curve's
    other checkpoints in `curve`; no
    regression as one-sided non-inferiority tests (no family: each must hold). `prefix` goes before
    every arm name (records kept beside other records whose arms are "base", as the demo's are)."""
    figs: dict[str, dict[str, Any]] = {}
    for repo in own:
        def sel(arm: str, repo: str = repo, **extra: Any) -> dict[str, Any]:
            return {"run": run, "repo": repo, "arm": prefix + arm, **extra}

        for f in sorted(fractions):
            arm = arm_of(f, chosen)
            pre = f"{repo}." if f == chosen else f"{repo}@{f:g}."
            figs[pre + "loss"] = {"kind": "paired_mean", "a": sel("base"), "b": sel(arm), "key": "item",
                                  "field": "nll", "cluster": "commit", "family": "loss" if f == chosen else "curve"}
            if f != chosen:
                continue
            figs[pre + "token_acc"] = {"kind": "paired_mean", "a": sel("base"), "b": sel(arm), "key": "item",
                                       "field": "token_acc", "cluster": "commit", "family": "completion"}
            for m in ("line_em", "rest_em"):
                figs[pre + m] = {"kind": "paired", "a": sel("base"), "b": sel(arm), "key": "item", "field": m,
                                 "family": "completion"}
            figs[pre + "ident_em"] = {"kind": "paired", "a": sel("base", has_ident=1), "b": sel(arm, has_ident=1),
                                      "key": "item", "field": "ident_em", "family": "completion"}
            figs[pre + "adherence"] = {"kind": "paired", "a": sel("base", has_repo=1), "b": sel(arm, has_repo=1),
                                       "key": "item", "field": "repo_em", "family": "adherence"}
            figs[pre + "line_em_unseen"] = {"kind": "paired", "a": sel("base", seen=0), "b": sel(arm, seen=0),
                                            "key": "item", "field": "line_em"}
            figs[pre + "rest_em_unseen"] = {"kind": "paired", "a": sel("base", seen=0), "b": sel(arm, seen=0),
                                            "key": "item", "field": "rest_em"}
    for repo in regress:
        a = {"run": run, "repo": repo, "arm": prefix + "base"}
        b = {"run": run, "repo": repo, "arm": prefix + "adapter"}
        figs[f"{run}.regress.{repo}.loss"] = {"kind": "noninferiority", "a": a, "b": b, "key": "item", "field": "neg_nll",
                                        "margin": loss_margin}
        figs[f"{run}.regress.{repo}.token_acc"] = {"kind": "noninferiority", "a": a, "b": b, "key": "item",
                                             "field": "token_acc", "margin": acc_margin}
    return figs


def targets(figs: dict[str, dict[str, Any]], run: str, own: Sequence[str], regress: Sequence[str]) -> dict[str, Any]:
    """Issue 47's targets per repository, read off the computed figures."""
    out: dict[str, Any] = {}
    for repo in own:
        loss = figs[f"{repo}.loss"]
        comp = {m: figs[f"{repo}.{m}"] for m in ("token_acc", "line_em", "rest_em", "ident_em")}
        better = [m for m, f in comp.items()
                  if (f.get("gain", f.get("mean_diff")) or 0) > 0 and (f.get("p_holm") if f.get("p_holm") is not None else 1) < 0.05]
        adh = figs[f"{repo}.adherence"]
        out[repo] = {
            "loss_lower": loss["ci_high"] is not None and loss["ci_high"] < 0,
            "completion_better": better,
            "adherence_not_lower": adh["gain"] >= 0 or adh.get("p_holm", 1) >= 0.05,
        }
    out["no_regression"] = {r: bool(figs[f"{run}.regress.{r}.loss"]["noninferior"]
                                    and figs[f"{run}.regress.{r}.token_acc"]["noninferior"]) for r in regress}
    return out


def base_cache(cfg: TimeSpecialiseConfig, items_text: str, names_text: str) -> Path | None:
    """Where the base model's rows for these lines are kept between runs (the base is scored once
    per set of lines, whichever org's run asks): keyed by the base's weights file digest, the
    lines, the repository's names and the context length. None for a base without a local
    weights file."""
    where = resolve(cfg.base)
    weights = sorted(Path(where).glob("*.safetensors")) if isinstance(where, Path) else []
    if not weights:
        return None
    h = hashlib.sha256()
    for w in weights:
        st = w.stat()
        h.update(f"{w.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    h.update(items_text.encode() + b"\0" + names_text.encode() + f"\0{cfg.ctx_tokens}".encode())
    return cache() / "codelm_scores" / f"{h.hexdigest()[:24]}.jsonl"


class TimeSpecialise:
    def __init__(self, cfg: TimeSpecialiseConfig, console: Console | None = None):
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.con = console or Console()
        self.stages = Stages(self.out, cfg, self.con)
        self.run_name = cfg.org

    def _progress(self, what: str) -> Progress:
        return Progress(TextColumn(f"  {what}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=self.con, transient=True)

    def split(self) -> tuple[dict[str, Any], str]:
        res: dict[str, Any] = {}
        for spec, until, role in self.cfg.cutoffs():
            s = build_split(spec, until, n_items=self.cfg.items + self.cfg.gate_items, seed=self.cfg.seed)
            gate = s.items[self.cfg.items:]  # the same round-robin goes on: other lines of the same commits
            s = dataclasses.replace(s, items=s.items[:self.cfg.items])
            name = s.cutoff.repo.name
            if name in res:
                raise EtudeError(f"{spec}: repository {name} is named twice")
            rec = s.to_dict()
            check_no_leak(rec, s.cutoff.repo.path)
            d = self.out / name
            d.mkdir(parents=True, exist_ok=True)
            (d / "split.json").write_text(json.dumps(rec, indent=1) + "\n")
            (d / "items.jsonl").write_text(items_to_jsonl(s.items))
            (d / "gate.jsonl").write_text(items_to_jsonl(gate))
            (d / "names.json").write_text(json.dumps(sorted(defined_names(s.documents))))
            res[name] = {"role": role, "path": s.cutoff.repo.path, "cutoff": s.cutoff.sha, "cutoff_date": s.cutoff.date,
                         "heldout_commits": len(s.cutoff.commits), "documents": len(s.documents), **rec["items"]}
        own = [n for n, r in res.items() if r["role"] == "own"]
        return res, "; ".join(f"{n}: cut-off {r['cutoff'][:10]} ({r['cutoff_date'][:10]}), {r['heldout_commits']} commits "
                              f"after, {r['n']} lines" for n, r in res.items()) + f" (trained: {', '.join(own)})"

    def _splits(self, split: dict[str, Any], role: str) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        """(name, stage result, split.json) of the repositories of one role."""
        return [(name, r, json.loads((self.out / name / "split.json").read_text()))
                for name, r in split.items() if r["role"] == role]

    def train(self, split: dict[str, Any]) -> tuple[dict[str, Any], str]:
        docs: list[Document] = []
        for name, r, rec in self._splits(split, "own"):
            blobs = cat_blobs(Path(r["path"]), [d["blob"] for d in rec["training"]])
            texts = {d["path"]: blobs[d["blob"]].decode("utf-8") for d in rec["training"]}
            check_no_leak(rec, r["path"], texts)  # the text about to be trained on is the cut-off's
            docs += [Document(path=f"{name}/{d['path']}", blob=d["blob"], text=texts[d["path"]]) for d in rec["training"]]
        cfg = self.cfg
        with self._progress("training") as prog:
            task = prog.add_task("train", total=None)
            res = train_on_text(cfg.base, docs, self.out / "checkpoints", minutes=cfg.minutes, checkpoints=cfg.checkpoints,
                                block=cfg.block, batch=cfg.batch, lr=cfg.lr, epochs=cfg.epochs, r=cfg.lora_r,
                                alpha=cfg.lora_alpha, seed=cfg.seed, val_fraction=cfg.val_fraction,
                                progress=lambda k, n: prog.update(task, completed=k, total=n))
        final = next(c for c in res["checkpoints"] if c["fraction"] == res["chosen"])
        dest = self.out / "adapter"
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(final["dir"], dest)
        res["adapter"] = str(dest)
        vals = ", ".join(f"{c['fraction']:g}: {c['val_loss']:.3f}" for c in res["checkpoints"] if c["val_loss"] is not None)
        return res, (f"{res['steps']} steps of {res['batch']}x{res['block']} tokens on {res['blocks']} blocks "
                     f"({len(docs)} files) in {res['seconds']:.0f} s; shipped the checkpoint at {res['chosen']:g} of "
                     f"the budget" + (f" (loss on {res['val_blocks']} held-out blocks of the cut-off's text: {vals})"
                                      if vals else ""))

    def score(self, split: dict[str, Any], train: dict[str, Any]) -> tuple[dict[str, Any], str]:
        arms: list[tuple[str, str | None, list[str]]] = [("base", None, list(split))]
        own = [n for n, r in split.items() if r["role"] == "own"]
        chosen = train.get("chosen", 1.0)
        for c in train["checkpoints"]:
            f = c["fraction"]
            arms.append((arm_of(f, chosen), c["dir"], own if f != chosen else list(split)))
        records: list[dict[str, Any]] = []
        for arm, adapter, repos in arms:
            model = tok = None
            for name in repos:
                text = (self.out / name / "items.jsonl").read_text()
                items = items_from_jsonl(text)
                names_text = (self.out / name / "names.json").read_text()
                names = frozenset(json.loads(names_text))
                cached = base_cache(self.cfg, text, names_text) if adapter is None else None
                if cached is not None and cached.is_file():  # the base's rows of these very lines
                    rows = [json.loads(x) for x in cached.read_text().splitlines()]
                else:
                    if model is None:
                        model, tok = load_scorer(self.cfg.base, adapter)
                    with self._progress(f"{arm} on {name}") as prog:
                        task = prog.add_task("score", total=len(items))
                        rows = score_items(model, tok, items, names=names, ctx_tokens=self.cfg.ctx_tokens,
                                           progress=lambda k, n, t=task: prog.update(t, completed=k))
                    if cached is not None:
                        cached.parent.mkdir(parents=True, exist_ok=True)
                        tmp = cached.with_suffix(".tmp")
                        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
                        tmp.replace(cached)
                records += records_of(name, split[name]["role"], arm, items, rows, self.run_name)
            del model
        path = self.out / "records.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return {"records": str(path), "n": len(records)}, f"{len(records)} scored lines over {len(arms)} models"

    def report(self, split: dict[str, Any], train: dict[str, Any]) -> tuple[dict[str, Any], str]:
        records = [json.loads(x) for x in (self.out / "records.jsonl").read_text().splitlines()]
        own = [n for n, r in split.items() if r["role"] == "own"]
        regress = [n for n, r in split.items() if r["role"] == "regress"]
        specs = figure_specs(self.run_name, own, regress, [c["fraction"] for c in train["checkpoints"]],
                             loss_margin=self.cfg.loss_margin, acc_margin=self.cfg.acc_margin,
                             chosen=train.get("chosen", 1.0))
        figs = compute_figures(specs, records)
        rep = {"org": self.cfg.org, "base": self.cfg.base, "split": split, "train": train, "figures": figs,
               "targets": targets(figs, self.run_name, own, regress), "adapter": train["adapter"], "stages": self.stages.times()}
        (self.out / "report.json").write_text(json.dumps(rep, indent=1, default=str) + "\n")
        lines = []
        for n in own:
            lo, em = figs[f"{n}.loss"], figs[f"{n}.rest_em"]
            lines.append(f"{n}: loss {lo['mean_a']:.3f} -> {lo['mean_b']:.3f} nats/token "
                         f"(diff {lo['mean_diff']:+.3f}, 95% CI {lo['ci_low']:+.3f}..{lo['ci_high']:+.3f}); "
                         f"rest-of-line {em['a_k']}/{em['n']} -> {em['b_k']}/{em['n']} (Holm p {em['p_holm']:.3g})")
        return rep, "; ".join(lines)

    def register(self) -> tuple[dict[str, Any], str]:
        rep = json.loads((self.out / "report.json").read_text())
        cp = registry.register_adapter(
            open_store(self.cfg.db), self.cfg.org, self.out / "adapter", self.out / "adapters",
            meta={"base": rep["base"], "kind": "specialised-by-time", "report": str(self.out / "report.json"),
                  "targets": rep["targets"]})
        return {"name": cp.name, "state": cp.state, "version": cp.version}, f"registered {cp.name} as {self.cfg.org}'s candidate"


SPLIT_USES = ("repos", "until", "regress", "regress_until", "items", "gate_items", "seed")
TRAIN_USES = SPLIT_USES + ("base", "minutes", "checkpoints", "block", "batch", "lr", "epochs", "val_fraction",
                           "lora_r", "lora_alpha")


def preflight(cfg: TimeSpecialiseConfig) -> None:
    """Every repository and cut-off resolves (one EtudeError line otherwise), before DIR is made."""
    check_org(cfg.org)
    check_base(cfg.base, cfg.org)
    for spec, until, _ in cfg.cutoffs():
        resolve_cutoff(resolve_repo(spec), until)


def run_time_specialise(cfg: TimeSpecialiseConfig, console: Console | None = None) -> dict[str, Any]:
    preflight(cfg)
    ts = TimeSpecialise(cfg, console)
    st = ts.stages
    ts.con.print(f"[bold]etude specialise --until[/bold] — org {cfg.org}, base {cfg.base}, budget {cfg.minutes:g} min, "
                 f"output in {ts.out}")
    t0 = time.monotonic()
    split = st.run("1. split", ts.split, uses=SPLIT_USES)
    train = st.run("2. train", lambda: ts.train(split), uses=TRAIN_USES, after=("1. split",))
    st.run("3. score", lambda: ts.score(split, train), uses=TRAIN_USES + ("ctx_tokens",), after=("1. split", "2. train"))
    rep = st.run("4. report", lambda: ts.report(split, train), resumable=False)
    if cfg.register:
        rep["registered"] = st.run("5. register", ts.register, uses=TRAIN_USES + ("org", "db"), after=("2. train",))
    rep["wall_s"] = round(time.monotonic() - t0, 1)
    return rep
