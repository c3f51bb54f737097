"""Measuring a model on lines of code it has to predict: the measures of specialisation by time
(etude.pipeline.specialise_time) and the loop's code gate for its adapters.

`score_items` measures one model on held-out lines with one teacher-forced forward pass per line
(context truncated on the left to `ctx_tokens`, the line and its newline tokenised on their own and
appended). Per line:
- `nll` (nats per token of the line and its newline) and `token_acc` (share of its tokens that
  are the argmax given the true prefix);
- `line_em`: every token is the argmax, i.e. greedy decoding writes exactly this line and ends it
  (a greedy decoder's output equals the reference tokens exactly when each reference token is the
  argmax after the reference prefix; a different tokenisation of the same text counts as a miss);
- `rest_em`: the second half of the line's tokens, given the first half;
- `ident_em`: the line's first identifier that is not a Python keyword, given what precedes it;
- `repo_em` (adherence, where the line uses a name the repository defined at the cut-off): every
  such name is predicted, i.e. the model calls the repository's own function or class where the
  maintainers did. None for a line without one.

`code_gate` compares production and a candidate on a run's gate lines (see its doc).
"""

from __future__ import annotations

import json
import keyword
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.evals.results import compute_figures
from etude.policy.models import load_model
from etude.tasks.timesplit import IDENT_RE, Item, items_from_jsonl

Progress = Callable[[int, int], None]


def tokens(tok: Any, text: str) -> list[int]:
    """`text`'s token ids, without special tokens (what both training and scoring feed the model)."""
    return tok(text, add_special_tokens=False)["input_ids"]


def load_scorer(base: str, adapter: str | None = None) -> tuple[Any, Any]:
    """The base model (bf16, eval mode), with `adapter` (a peft directory) on it when given."""
    import peft
    import torch

    model, tok = load_model(base, dtype=torch.bfloat16)
    if adapter:
        model = peft.PeftModel.from_pretrained(model, adapter).eval()
    return model, tok


def _ident_spans(line: str, names: frozenset[str] | None = None) -> list[tuple[int, int, str]]:
    out = []
    for m in IDENT_RE.finditer(line):
        w = m.group(0)
        if keyword.iskeyword(w) or len(w) < 2:
            continue
        if names is None or w in names:
            out.append((m.start(), m.end(), w))
    return out


def _covering(offsets: Sequence[tuple[int, int]], start: int, end: int) -> list[int]:
    return [k for k, (a, b) in enumerate(offsets) if a < end and b > start]


def prepare(tok: Any, item: Item, ctx_tokens: int, names: frozenset[str]) -> dict[str, Any]:
    ctx = tokens(tok, item.context)[-ctx_tokens:] if item.context else []
    if not ctx:
        ctx = [tok.eos_token_id]  # a line at the top of a file is predicted after a document boundary
    enc = tok(item.line + "\n", add_special_tokens=False, return_offsets_mapping=True)
    tgt, offs = enc["input_ids"], [tuple(o) for o in enc["offset_mapping"]]
    first = _ident_spans(item.line)[:1]
    ident = _covering(offs, first[0][0], first[0][1]) if first else []
    repo = sorted({k for a, b, _ in _ident_spans(item.line, names) for k in _covering(offs, a, b)})
    return {"ids": ctx + tgt, "n_ctx": len(ctx), "n_tgt": len(tgt), "ident": ident, "repo": repo,
            "repo_names": [w for _, _, w in _ident_spans(item.line, names)]}


def score_items(model: Any, tok: Any, items: Sequence[Item], *, names: frozenset[str] = frozenset(),
                ctx_tokens: int = 256, batch: int = 8, progress: Progress | None = None) -> list[dict[str, Any]]:
    """One row per item (the module doc's measures), in the items' order."""
    import torch

    prepared = [prepare(tok, it, ctx_tokens, names) for it in items]
    order = sorted(range(len(items)), key=lambda i: len(prepared[i]["ids"]))  # similar lengths batch well
    rows: list[dict[str, Any] | None] = [None] * len(items)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    done = 0
    with torch.no_grad():
        for s in range(0, len(order), batch):
            idx = order[s:s + batch]
            width = max(len(prepared[i]["ids"]) for i in idx)
            ids = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):
                seq = prepared[i]["ids"]
                ids[r, :len(seq)] = torch.tensor(seq)
                mask[r, :len(seq)] = 1
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
            logp = torch.log_softmax(logits, dim=-1)
            for r, i in enumerate(idx):
                p = prepared[i]
                a, n = p["n_ctx"], p["n_tgt"]
                tgt = ids[r, a:a + n]
                lp = logp[r, a - 1:a - 1 + n]
                nll = -lp.gather(1, tgt[:, None])[:, 0]
                right = (lp.argmax(-1) == tgt).tolist()
                half = n // 2
                rows[i] = {
                    "nll": float(nll.mean()), "nll_sum": float(nll.sum()), "ntok": n,
                    "token_acc": sum(right) / n, "line_em": int(all(right)), "rest_em": int(all(right[half:])),
                    "ident_em": int(all(right[k] for k in p["ident"])) if p["ident"] else None,
                    "repo_em": int(all(right[k] for k in p["repo"])) if p["repo"] else None,
                    "repo_names": p["repo_names"],
                }
            done += len(idx)
            if progress:
                progress(done, len(items))
    return [r for r in rows if r is not None]


def records_of(repo: str, role: str, arm: str, items: Sequence[Any], rows: Sequence[dict[str, Any]],
               run: str) -> list[dict[str, Any]]:
    """Flat records (one per line and arm) that the figures are computed from."""
    out = []
    for it, r in zip(items, rows, strict=True):
        out.append({
            "run": run, "repo": repo, "role": role, "arm": arm, "item": it.id, "commit": it.commit, "kind": it.kind,
            "seen": int(it.seen_at_cutoff), "nll": r["nll"], "neg_nll": -r["nll"], "ntok": r["ntok"],
            "token_acc": r["token_acc"], "line_em": r["line_em"], "rest_em": r["rest_em"],
            "has_ident": int(r["ident_em"] is not None), "ident_em": r["ident_em"] or 0,
            "has_repo": int(r["repo_em"] is not None), "repo_em": r["repo_em"] or 0,
        })
    return out


def code_gate(report: str | Path, production: str, candidate: str, *, ctx_tokens: int = 256,
              loss_margin: float = 0.0, acc_margin: float = 0.01) -> dict[str, Any]:
    """The loop's gate for an adapter of this run (`etude loop --org`, beside its held-out tasks) of an adapter of `etude specialise --until`:
    production and candidate (model directories: an adapter merged on its base) scored on each
    repository's gate lines (DIR/<repo>/gate.jsonl, never the report's held-out lines). It passes
    when on every repository the candidate's loss is lower (the clustered bootstrap interval of
    the paired difference below -loss_margin) and its token accuracy non-inferior (margin
    acc_margin, one-sided paired t). Returns {"passed", "repos": {name: {loss, token_acc}}, "why"}."""
    run = Path(report).parent
    rep = json.loads(Path(report).read_text())
    own = [n for n, r in rep["split"].items() if r["role"] == "own"]
    missing = [n for n in own if not (run / n / "gate.jsonl").is_file()]
    if missing:
        raise EtudeError(f"{run}: no gate lines for {', '.join(missing)} (a run from before gate.jsonl; rerun "
                         "etude specialise --until)")
    records: list[dict[str, Any]] = []
    for arm, model_dir in (("production", production), ("candidate", candidate)):
        model, tok = load_scorer(model_dir)
        for n in own:
            items = items_from_jsonl((run / n / "gate.jsonl").read_text())
            names = frozenset(json.loads((run / n / "names.json").read_text()))
            rows = score_items(model, tok, items, names=names, ctx_tokens=ctx_tokens)
            records += records_of(n, "gate", arm, items, rows, "gate")
        del model
    specs: dict[str, dict[str, Any]] = {}
    for n in own:
        a, b = {"repo": n, "arm": "production"}, {"repo": n, "arm": "candidate"}
        specs[f"{n}.loss"] = {"kind": "paired_mean", "a": a, "b": b, "key": "item", "field": "nll", "cluster": "commit"}
        specs[f"{n}.token_acc"] = {"kind": "noninferiority", "a": a, "b": b, "key": "item", "field": "token_acc",
                                   "margin": acc_margin}
    figs = compute_figures(specs, records)
    out: dict[str, Any] = {"repos": {}, "lines": len(records) // 2}
    why = []
    for n in own:
        lo, acc = figs[f"{n}.loss"], figs[f"{n}.token_acc"]
        lower = lo["ci_high"] is not None and lo["ci_high"] < -loss_margin
        out["repos"][n] = {"loss": {k: lo[k] for k in ("n", "mean_a", "mean_b", "mean_diff", "ci_low", "ci_high", "p")},
                           "token_acc": {k: acc[k] for k in ("mean_a", "mean_b", "mean_diff", "lower_bound", "p",
                                                             "noninferior")},
                           "passed": bool(lower and acc["noninferior"])}
        if not lower and lo["ci_high"] is None:
            why.append(f"{n}: loss {lo['mean_diff']:+.3f} nats/token on {lo['n']} line(s) of {lo['n_clusters']} "
                       "commit(s): too few for an interval (not lower)")
        elif not lower:
            why.append(f"{n}: loss {lo['mean_diff']:+.3f} nats/token, interval up to {lo['ci_high']:+.3f} (not lower)")
        if not acc["noninferior"]:
            why.append(f"{n}: token accuracy {acc['mean_diff'] or 0:+.3f}, not within -{acc_margin:g}")
    out["passed"] = not why
    out["why"] = "; ".join(why) or "loss lower and token accuracy non-inferior on every repository's gate lines"
    return out
