"""`etude search index DIR` / `etude search query DIR TEXT [-k N]` (same as `python -m etude.search`)."""

from __future__ import annotations

import typer

from etude.search.__main__ import main


def register(app: typer.Typer) -> None:
    search = typer.Typer(help="Semantic code search: pre-build an index, query it.", no_args_is_help=True)

    @search.command("index")
    def index(dir: str, embedder: str = typer.Option(None, help="minilm (default), hash, st:DIR or module:factory")) -> None:
        """Build or update DIR's index (only changed files are re-embedded)."""
        raise typer.Exit(main(["index", dir] + (["--embedder", embedder] if embedder else [])))

    @search.command("query")
    def query(dir: str, text: str, k: int = typer.Option(10, "-k"),
              embedder: str = typer.Option(None, help="minilm (default), hash, st:DIR or module:factory")) -> None:
        """Search DIR by meaning (its index is updated first)."""
        raise typer.Exit(main(["query", dir, text, "-k", str(k)] + (["--embedder", embedder] if embedder else [])))

    app.add_typer(search, name="search")
