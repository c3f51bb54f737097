"""libcst mutators: each changes exactly one site inside a function and keeps formatting."""

import difflib

import pytest

from etude.tasks.mutators import MUTATORS, count_sites, mutate

SRC = '''"""Module docstring."""
LIMIT = 10  # module level: never mutated


def clamp(values, lo,  hi):   # odd spacing must survive
    """Clamp every value."""
    out = []
    for v in values:
        if v < lo and lo is not None:
            v = lo
        total = v + 1
        out.append(min(v, hi))
    while False:
        pass
    if not out:
        return []
    count = len(out) * 2
    return out
'''


@pytest.mark.parametrize("name", sorted(MUTATORS))
def test_every_mutator_changes_one_place_and_compiles(name):
    n = count_sites(SRC, name)
    assert n >= 1, f"{name} found no site"
    seen = set()
    for site in range(n):
        m = mutate(SRC, name, site)
        if m is None:
            continue
        compile(m.code, "m", "exec")
        changed = [ln for ln in difflib.unified_diff(SRC.splitlines(), m.code.splitlines(), n=0, lineterm="")
                   if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]  # fmt: skip
        assert changed, f"{name}#{site} changed nothing"
        assert "def clamp(values, lo,  hi):   # odd spacing must survive" in m.code
        assert "LIMIT = 10  # module level: never mutated" in m.code
        assert m.line > 4  # inside the function
        seen.add(m.code)
    assert seen, f"{name} produced no mutant"


def test_specific_rewrites():
    cmp = {mutate(SRC, "cmp_flip", i).code for i in range(count_sites(SRC, "cmp_flip"))}
    assert any("if v >= lo and lo is not None:" in c for c in cmp)
    assert any("lo is None" in c for c in cmp)
    inv = mutate(SRC, "invert_if", 0).code
    assert "if not (v < lo and lo is not None):" in inv
    ops = {mutate(SRC, "op_flip", i).code for i in range(count_sites(SRC, "op_flip"))}
    assert any("total = v - 1" in c for c in ops) and any("v < lo or lo" in c for c in ops)
    swapped = {mutate(SRC, "swap_args", i).code for i in range(count_sites(SRC, "swap_args"))}
    assert any("min(hi, v)" in c for c in swapped)


def test_module_level_code_and_bad_source_have_no_sites():
    assert count_sites("X = 1 + 2\nif X == 3:\n    Y = 4\n", "op_flip") == 0
    assert count_sites("def broken(:\n", "op_flip") == 0
