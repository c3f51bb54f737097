"""Semantic code search: syntax-aware chunks, embeddings + BM25, an incremental on-disk index.

    from etude.search import open_index, SearchConfig, get_embedder, Embedder
    idx = open_index(repo_dir)            # or open_index(workspace, template=template_dir)
    idx.refresh()                         # only files whose content changed are re-embedded
    for hit in idx.search("where are tool calls parsed", k=5):
        print(hit.path, hit.start_line, hit.end_line, hit.symbol)

The agent-facing tool is `etude.tools.semantic_search`. See docs/search.md.
"""

from etude.search.chunking import Chunk, chunk_file
from etude.search.embed import Embedder, HashingEmbedder, SentenceTransformerEmbedder, get_embedder, register_embedder
from etude.search.index import RefreshStats, SearchConfig, SearchIndex, open_index
from etude.search.rank import Hit, RankConfig

__all__ = [
    "Chunk", "Embedder", "HashingEmbedder", "Hit", "RankConfig", "RefreshStats", "SearchConfig", "SearchIndex",
    "SentenceTransformerEmbedder", "chunk_file", "get_embedder", "open_index", "register_embedder",
]
