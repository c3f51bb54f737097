"""semantic_search: find code by meaning (and by exact names) in the workspace.

Each call first refreshes the workspace's index (only files whose content changed since the
last call are re-chunked and re-embedded), then ranks every chunk: embedding similarity fused
with BM25, exact symbol names pinned first (see etude.search). The output is compact and
bounded: per hit `path:start-end  symbol (kind)` and the first lines of the chunk.

Context: `ctx.template` (optional) names the folder a copy-on-write workspace was made from, so
the template's index is reused; `ctx.config.search` (optional) is an etude.search.SearchConfig
(or its fields as a dict, as a TOML harness config gives them). The first call on a large repository has to embed all of it (tens of
minutes on a CPU for thousands of files): each call embeds for at most `tool_budget_s` seconds,
the files whose text best matches the query (BM25) first, answers from what is indexed so far
and says how many files are still missing; later calls continue. Index templates ahead of time (`etude.search.open_index(dir).refresh()`) to avoid it.
`run` never raises: every failure is a ToolResult(ok=False).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.protocols import ToolContext
from etude.search import SearchConfig, open_index
from etude.tools.base import BaseTool, ToolError, function_schema
from etude.types import ToolResult

MAX_K = 50
MAX_QUERY_CHARS = 2000
CONTEXT_LINES = 4  # lines of each hit shown (its signature and docstring, usually)
LINE_CHARS = 160  # a longer context line is cut
MAX_OUTPUT_CHARS = 8000  # hits past this are left out (and counted in meta)


class SemanticSearch(BaseTool):
    name = "semantic_search"
    schema = function_schema(
        "semantic_search",
        "Find code by describing what it does (or by naming a function/class). Returns the best "
        "matching functions, classes and methods as path:start-end with their first lines.",
        {
            "query": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_QUERY_CHARS,
                "description": "what the code does, in words, or identifiers to look for",
            },
            "k": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_K,
                "default": 10,
                "description": "how many results to return",
            },
        },
        ["query"],
    )

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            if not isinstance(args, dict):
                return ToolResult.fail(
                    f"arguments must be a JSON object, got {type(args).__name__}", error_kind="invalid_arguments"
                )
            return super().run(args, ctx)
        except Exception as e:  # noqa: BLE001 - a tool never raises into the agent loop
            return ToolResult.fail(f"semantic_search failed: {type(e).__name__}: {e}", error_kind="exception")

    def _run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        query, k = _check_args(args)
        try:
            cfg = search_config(ctx)
            t0 = time.perf_counter()
            # focus=query: under the budget, the files that best match the query are embedded first
            idx = open_index(Path(ctx.workspace), template=ctx.template, config=cfg,
                             budget_s=cfg.tool_budget_s, focus=query)
            left = max(cfg.tool_budget_s - (time.perf_counter() - t0), 0.0)
            stats = idx.refresh(budget_s=left, focus=query)  # at least one batch is always done: progress is certain
            hits = idx.search(query, k)
        except EtudeError as e:
            raise ToolError(str(e), kind="bad_workspace" if "directory" in str(e) else "search_error") from None
        text, shown = _format(Path(idx.root), hits)
        if stats.files_pending:
            text += (f"\nnote: the index is still being built: {stats.files_pending} files are not searched yet; "
                     "search again to continue indexing")
        meta = {
            "results": [h.to_dict() for h in hits[:shown]],
            "omitted": len(hits) - shown,
            "index": stats.to_dict(),
            "embedder": idx.embedder.id,
        }
        return ToolResult(ok=True, output=text, meta=meta)


def search_config(ctx: ToolContext) -> SearchConfig:
    """The context's SearchConfig: `ctx.config.search` as given, built from a dict, or the default."""
    cfg = getattr(ctx.config, "search", None)
    if isinstance(cfg, SearchConfig):
        return cfg
    if isinstance(cfg, dict):
        try:
            return SearchConfig(**cfg)
        except TypeError as e:
            raise EtudeError(f"tools_config.search: {e}") from None
    return SearchConfig()


def _check_args(args: dict[str, Any]) -> tuple[str, int]:
    """The query and k, or a ToolError the model can act on (run_tool validates too; direct calls don't)."""
    query, k = args.get("query"), args.get("k", 10)
    extra = sorted(set(args) - {"query", "k"})
    if extra:
        raise ToolError(
            f"unknown argument(s) {', '.join(map(repr, extra))} (expected: query, k)", kind="invalid_arguments"
        )
    if not isinstance(query, str) or not query.strip():
        raise ToolError(
            'query is empty; describe the code you are looking for, e.g. "parse the config file"',
            kind="invalid_arguments",
        )
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"query is longer than {MAX_QUERY_CHARS} characters; shorten it", kind="invalid_arguments")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ToolError(f"k must be an integer from 1 to {MAX_K}, got {k!r}", kind="invalid_arguments")
    return query.strip(), k


def _format(root: Path, hits: list) -> tuple[str, int]:
    """The hits as text within MAX_OUTPUT_CHARS; returns (text, how many hits it holds)."""
    if not hits:
        return "no matches (the workspace has no indexable text files)", 0
    blocks: list[str] = []
    used = 0
    for hit in hits:
        block = _block(root, hit)
        if blocks and used + len(block) > MAX_OUTPUT_CHARS:
            break
        blocks.append(block)
        used += len(block) + 1
    text = "\n".join(blocks)
    if len(blocks) < len(hits):
        text += f"\n... [{len(hits) - len(blocks)} more results left out to keep this short; ask with a smaller k]"
    return text, len(blocks)


def _block(root: Path, hit) -> str:
    label = f"{hit.symbol} ({hit.kind})" if hit.symbol else f"({hit.kind})"
    head = f"{hit.path}:{hit.start_line}-{hit.end_line}  {label}  score {hit.score:.3f}"
    lines = _lines(root / hit.path, hit.start_line, min(hit.end_line, hit.start_line + CONTEXT_LINES - 1))
    body = [f"  {n:>5} | {line[:LINE_CHARS]}" for n, line in lines]
    return "\n".join([head, *body])


def _lines(path: Path, start: int, end: int) -> list[tuple[int, str]]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    lines = text.split("\n")
    return [(n, lines[n - 1].rstrip()) for n in range(start, min(end, len(lines)) + 1)]


TOOL = SemanticSearch()
