# The two commands of the README: `make demo` (the main job) and `make test` (the whole suite).
.PHONY: demo demo-quick test test-fast setup lint

setup:
	@bash scripts/bootstrap.sh

demo: setup
	.venv/bin/etude demo

demo-quick: setup
	.venv/bin/etude demo --quick

test: setup
	.venv/bin/python -m pytest -q

# For developers: skip the slow end-to-end tests.
test-fast: setup
	.venv/bin/python -m pytest -q -m "not slow"

lint: setup
	.venv/bin/ruff check etude tests bench
