"""Benchmarks of etude, on its public API only (tests/bench/test_public_api.py).

Each bench runs with the installed etude: `.venv/bin/python bench/NAME.py`. A bench that imports
another (bench/gpu_suite.py uses bench/serve.py and bench/vllm_mismatch.py) runs as a module from
the repository root: `python -m bench.gpu_suite`. Not part of the installed package.
"""
