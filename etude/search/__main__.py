"""`python -m etude.search index DIR` (build or update DIR's index, with a progress bar) and
`python -m etude.search query DIR "TEXT" [-k N]` (print hits). For pre-indexing task templates,
so an agent's first semantic_search on them is instant."""

from __future__ import annotations

import argparse
import json
import sys

from etude.errors import EtudeError
from etude.search import SearchConfig, open_index


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m etude.search", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ix = sub.add_parser("index", help="build or update the index of DIR")
    ix.add_argument("dir")
    q = sub.add_parser("query", help="search DIR (its index is updated first)")
    q.add_argument("dir")
    q.add_argument("text")
    q.add_argument("-k", type=int, default=10)
    for p in (ix, q):
        p.add_argument("--embedder", default=None, help="minilm (default), hash, st:DIR or module:factory")
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except EtudeError as e:
        print(f"etude.search: error: {e}", file=sys.stderr)
        return e.exit_code


def _run(args: argparse.Namespace) -> int:
    idx = open_index(args.dir, config=SearchConfig(embedder=args.embedder, progress=args.cmd == "index"))
    stats = idx.refresh()
    if args.cmd == "index":
        print(json.dumps(stats.to_dict()))
        return 0
    for hit in idx.search(args.text, k=args.k):
        print(f"{hit.path}:{hit.start_line}-{hit.end_line}  {hit.symbol or '(' + hit.kind + ')'}  {hit.score:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
