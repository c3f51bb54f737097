"""Bug injection by concrete-syntax-tree mutation (libcst), keeping the file's formatting.

Each mutator rewrites exactly one *site* (the `target`-th match, counting in source order) inside
a function body; module- and class-level code is left alone so a mutant still imports. The sites
are counted by running the same transformer with target = -1. Mutators:

  op_flip        a + b -> a - b, * <-> /, // -> *, % -> //, & <-> |, and <-> or, << <-> >>
  cmp_flip       == <-> !=, < <-> >=, > <-> <=, in <-> not in, is <-> is not
  off_by_one     an integer literal n -> n + 1 (or n - 1 for n > 1)
  invert_if      if c: -> if not (c):   (and if not c: -> if c:)
  remove_stmt    drop one simple statement (not a docstring, not the only one in its block)
  remove_cond    drop one `if` without else (the guarded code never runs)
  remove_loop    drop one for/while loop
  remove_return  drop one `return` from a block of two or more statements
  swap_args      f(a, b, ...) -> f(b, a, ...) for the first two positional arguments
  shuffle        swap two adjacent simple statements

What this does not guarantee: that a mutant changes behaviour (equivalent mutants exist; the
validator drops those: they fail no test).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

_BIN_FLIP: dict[type, type] = {
    cst.Add: cst.Subtract,
    cst.Subtract: cst.Add,
    cst.Multiply: cst.Divide,
    cst.Divide: cst.Multiply,
    cst.FloorDivide: cst.Multiply,
    cst.Modulo: cst.FloorDivide,
    cst.BitAnd: cst.BitOr,
    cst.BitOr: cst.BitAnd,
    cst.LeftShift: cst.RightShift,
    cst.RightShift: cst.LeftShift,
}
_CMP_FLIP: dict[type, type] = {
    cst.Equal: cst.NotEqual,
    cst.NotEqual: cst.Equal,
    cst.LessThan: cst.GreaterThanEqual,
    cst.GreaterThanEqual: cst.LessThan,
    cst.GreaterThan: cst.LessThanEqual,
    cst.LessThanEqual: cst.GreaterThan,
    cst.In: cst.NotIn,
    cst.NotIn: cst.In,
    cst.Is: cst.IsNot,
    cst.IsNot: cst.Is,
}


class _Mutator(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)
    name = ""

    def __init__(self, target: int) -> None:
        super().__init__()
        self.target = target
        self.count = 0
        self.line: int | None = None  # first line of the mutated site
        self.lines: list[int] = []  # counting (target -1): the first line of every site, in order
        self._func_depth = 0

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self._func_depth += 1
        return True

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self._func_depth -= 1
        return updated

    def _hit(self, node: cst.CSTNode) -> bool:
        """Count a site; True when it is the one to mutate."""
        if self._func_depth == 0:
            return False
        i = self.count
        self.count += 1
        if self.target == -1:
            self.lines.append(self.get_metadata(PositionProvider, node).start.line)
        elif i == self.target:
            self.line = self.get_metadata(PositionProvider, node).start.line
            return True
        return False


def _op(cls: type, old: cst.CSTNode) -> cst.CSTNode:
    before = getattr(old, "whitespace_before", cst.SimpleWhitespace(" "))
    after = getattr(old, "whitespace_after", cst.SimpleWhitespace(" "))
    if cls in (cst.NotIn, cst.IsNot):
        return cls(whitespace_before=before, whitespace_between=cst.SimpleWhitespace(" "), whitespace_after=after)
    return cls(whitespace_before=before, whitespace_after=after)


class OpFlip(_Mutator):
    name = "op_flip"

    def leave_BinaryOperation(self, original, updated):
        if type(updated.operator) in _BIN_FLIP and self._hit(original):
            return updated.with_changes(operator=_op(_BIN_FLIP[type(updated.operator)], updated.operator))
        return updated

    def leave_BooleanOperation(self, original, updated):
        if self._hit(original):
            new = cst.Or if isinstance(updated.operator, cst.And) else cst.And
            return updated.with_changes(operator=_op(new, updated.operator))
        return updated


class CmpFlip(_Mutator):
    name = "cmp_flip"

    def leave_ComparisonTarget(self, original, updated):
        if type(updated.operator) in _CMP_FLIP and self._hit(original):
            return updated.with_changes(operator=_op(_CMP_FLIP[type(updated.operator)], updated.operator))
        return updated


class OffByOne(_Mutator):
    name = "off_by_one"

    def leave_Integer(self, original, updated):
        if not updated.value.isdigit() or not self._hit(original):
            return updated
        n = int(updated.value)
        return updated.with_changes(value=str(n - 1 if n > 1 and self.target % 2 else n + 1))


class InvertIf(_Mutator):
    name = "invert_if"

    def leave_If(self, original, updated):
        if not self._hit(original):
            return updated
        test = updated.test
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return updated.with_changes(test=test.expression)
        wrapped = test if test.lpar else test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return updated.with_changes(test=cst.UnaryOperation(operator=cst.Not(), expression=wrapped))


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _is_return(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and any(isinstance(s, cst.Return) for s in stmt.body)


class _BlockMutator(_Mutator):
    """Mutations that edit a block's statement list."""

    def eligible(self, body: list[cst.CSTNode], i: int) -> bool:
        raise NotImplementedError

    def edit(self, body: list[cst.CSTNode], i: int) -> list[cst.CSTNode]:
        return body[:i] + body[i + 1 :]

    def leave_IndentedBlock(self, original, updated):
        body = list(updated.body)
        if len(body) < 2:
            return updated
        for i in range(len(body)):
            if self.eligible(body, i) and self._hit(original.body[i]):
                return updated.with_changes(body=self.edit(body, i))
        return updated


class RemoveStmt(_BlockMutator):
    name = "remove_stmt"

    def eligible(self, body, i):
        s = body[i]
        return isinstance(s, cst.SimpleStatementLine) and not _is_docstring(s) and not _is_return(s)


class RemoveCond(_BlockMutator):
    name = "remove_cond"

    def eligible(self, body, i):
        return isinstance(body[i], cst.If) and body[i].orelse is None


class RemoveLoop(_BlockMutator):
    name = "remove_loop"

    def eligible(self, body, i):
        return isinstance(body[i], (cst.For, cst.While))


class RemoveReturn(_BlockMutator):
    name = "remove_return"

    def eligible(self, body, i):
        return _is_return(body[i])


class Shuffle(_BlockMutator):
    name = "shuffle"

    def eligible(self, body, i):
        def simple(s: cst.CSTNode) -> bool:
            return isinstance(s, cst.SimpleStatementLine) and not _is_docstring(s) and not _is_return(s)

        return i + 1 < len(body) and simple(body[i]) and simple(body[i + 1])

    def edit(self, body, i):
        return body[:i] + [body[i + 1], body[i]] + body[i + 2 :]


class SwapArgs(_Mutator):
    name = "swap_args"

    def leave_Call(self, original, updated):
        args = list(updated.args)
        if len(args) < 2 or any(a.keyword is not None or a.star for a in args[:2]):
            return updated
        if not self._hit(original):
            return updated
        a, b = args[0], args[1]
        args[0], args[1] = a.with_changes(value=b.value), b.with_changes(value=a.value)
        return updated.with_changes(args=args)


MUTATORS: dict[str, type[_Mutator]] = {
    m.name: m
    for m in (OpFlip, CmpFlip, OffByOne, InvertIf, RemoveStmt, RemoveCond, RemoveLoop, RemoveReturn, SwapArgs, Shuffle)
}


@dataclass(frozen=True)
class Mutation:
    mutator: str
    site: int
    line: int
    code: str  # the whole mutated module


def count_sites(source: str, mutator: str) -> int:
    """How many sites `mutator` can change in this module (0 when it does not parse)."""
    return len(site_lines(source, mutator))


def site_lines(source: str, mutator: str) -> list[int]:
    """The first line of each site `mutator` can change, in site order (`mutate(source, mutator,
    i).line` is `site_lines(...)[i]`); empty when the source does not parse."""
    try:
        wrapper = MetadataWrapper(cst.parse_module(source))
    except cst.ParserSyntaxError:
        return []
    m = MUTATORS[mutator](-1)
    wrapper.visit(m)
    return m.lines


def mutate(source: str, mutator: str, site: int) -> Mutation | None:
    """The module with site `site` mutated, or None if nothing changed or it no longer compiles."""
    wrapper = MetadataWrapper(cst.parse_module(source))
    m = MUTATORS[mutator](site)
    code = wrapper.visit(m).code
    if code == source or m.line is None:
        return None
    try:
        compile(code, "<mutant>", "exec")
    except SyntaxError:
        return None
    return Mutation(mutator, site, m.line, code)
