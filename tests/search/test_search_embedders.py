"""The pluggable embedder protocol: names, folders and module:factory specs; clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from etude.errors import EtudeError
from etude.search import Embedder, HashingEmbedder, get_embedder
from etude.search.embed import SentenceTransformerEmbedder


class TinyEmbedder:
    """A user's own embedder, loaded by `module:factory`."""

    id = "tiny/2"
    dim = 2

    def embed(self, texts, *, query=False):
        v = np.array([[len(t), 1.0] for t in texts], np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def make_tiny():
    return TinyEmbedder()


def test_hashing_embedder_is_deterministic_unit_and_lexical():
    emb = get_embedder("hash")
    assert isinstance(emb, Embedder) and emb is get_embedder("hash")  # cached per process
    a, b, c = emb.embed(["parse the config file", "parse the config file", "render html page"])
    assert np.allclose(a, b) and np.isclose(np.linalg.norm(a), 1.0)
    assert float(a @ emb.embed(["config parsing"])[0]) > float(a @ c)
    assert HashingEmbedder(dim=64).embed([]).shape == (0, 64)


def test_module_factory_spec_and_env_default(monkeypatch):
    emb = get_embedder(f"{__name__}:make_tiny")
    assert emb.id == "tiny/2" and emb.embed(["ab"]).shape == (1, 2)
    monkeypatch.setenv("ETUDE_SEARCH_EMBEDDER", "hash")
    assert get_embedder().id.startswith("hash/")


@pytest.mark.parametrize("spec, message", [
    ("nonsense", "unknown embedder"),
    ("no_such_module_xyz:factory", "cannot load embedder"),
    (f"{__name__}:TinyEmbedder.nothing", "cannot load embedder"),
])
def test_bad_specs_are_one_line_errors(spec, message):
    with pytest.raises(EtudeError, match=message):
        get_embedder(spec)


def test_missing_model_folder(tmp_path):
    with pytest.raises(EtudeError, match="model folder not found"):
        SentenceTransformerEmbedder(str(tmp_path / "none"))
    with pytest.raises(EtudeError, match="model folder not found"):
        get_embedder(f"st:{tmp_path / 'none'}")
