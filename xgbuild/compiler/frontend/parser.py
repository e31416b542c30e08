"""Parser: tokens -> `ast.Module`, recursive descent with precedence climbing.

Errors are reported, not raised: after one, the parser skips to the end of the statement (or to
the next file-level declaration) and goes on, so independent mistakes are all reported and one
mistake gives one error.

Depth is bounded once, here, so that no later stage can run out of stack: nesting (parentheses,
calls, blocks) deeper than MAX_DEPTH, and a syntax tree deeper than MAX_TREE_DEPTH (a chain
`a + b + ...` or `x[0:4][0:4]...` is a tree as deep as it is long), stop parsing with one XG0004
diagnostic. The checker and lowering recurse at most a few frames per tree level, so every tree
the parser hands on fits the stack they run with (frontend `deep_stack`).

Literals are range-checked as they are read: an integer literal must fit in `int64` (its minimum
written as `-9223372036854775808`), a float literal must be finite in `float64`.
"""

from __future__ import annotations

import math

from . import ast as A
from .codes import BAD_DECL, BAD_LOOP, INDENT, LITERAL_RANGE, SYNTAX, TOO_DEEP
from .diagnostics import Diagnostics
from .lexer import T, Token
from .source import Span

MAX_DEPTH = 100
EXTERN_ROLES = ("state", "counter")     # `extern state ...`, `extern counter ...` (frontend/state.py)
MAX_TREE_DEPTH = 2500    # levels of the syntax tree: module, function, blocks, then every operator
INT64_MAX = (1 << 63) - 1

# Binding powers of the binary operators; comparisons do not chain.
_BINARY = {"or": 1, "and": 2, "==": 4, "!=": 4, "<": 4, "<=": 4, ">": 4, ">=": 4,
           "+": 5, "-": 5, "*": 6, "/": 6, "%": 6, "@": 6}
_NOT_BP = 3
_UNARY_BP = 7
_COMPARISON_BP = 4


class _Sync(Exception):
    """Unwinds to the nearest statement or declaration boundary after a reported error."""


class _Abort(Exception):
    """Unwinds the whole parse (nesting limit reached)."""


class Parser:
    def __init__(self, tokens: list[Token], diags: Diagnostics, first_id: int = 0) -> None:
        self.toks = tokens
        self.pos = 0
        self.diags = diags
        self.depth = 0
        self.suppressed = 0     # syntax errors not reported because their line already had one
        self._next_id = first_id   # node ids stay unique across the files of one program
        self.negated = False       # the literal being read follows a unary `-` (int64's minimum)
        self.else_ifs = 0          # `else if`s in the chain being parsed

    # --- helpers --------------------------------------------------------------------------------
    def nid(self) -> int:
        self._next_id += 1
        return self._next_id

    @property
    def tok(self) -> Token:
        return self.toks[self.pos]

    def peek(self, k: int = 1) -> Token:
        return self.toks[min(self.pos + k, len(self.toks) - 1)]

    def advance(self) -> Token:
        tok = self.toks[self.pos]
        if tok.kind is not T.EOF:
            self.pos += 1
        return tok

    def at_op(self, text: str) -> bool:
        return self.tok.kind is T.OP and self.tok.text == text

    def at_kw(self, text: str) -> bool:
        return self.tok.kind is T.KEYWORD and self.tok.text == text

    def fail(self, message: str, tok: Token | None = None, *, label: str = "", help: str = "",
             notes: tuple[str, ...] = ()) -> None:
        tok = tok or self.tok
        # One syntax error per line: a second one on the same line is almost always a consequence.
        if self.diags.source.line_col(tok.span.start)[0] not in self.diags.error_lines:
            self.diags.error(SYNTAX, tok.span, detail=message, label=label, help=help, notes=notes)
        else:
            self.suppressed += 1
        raise _Sync

    def expect_op(self, text: str, context: str = "", opener: Token | None = None) -> Token:
        """The next token, which must be `text`; for a closing delimiter, `opener` is the token
        it closes, and the error's note points there (the error itself lands where parsing
        stopped, often the next line)."""
        if not self.at_op(text):
            where = f" {context}" if context else ""
            notes = ()
            if opener is not None:
                line, col = self.diags.source.line_col(opener.span.start)
                shown = self.diags.source.line_text(line).strip()
                shown = shown if len(shown) <= 60 else shown[:57] + "..."
                notes = (f"the `{opener.text}` at line {line}, column {col} is never closed: `{shown}`",)
            self.fail(f"expected `{text}`{where}, found {self.tok.describe()}", label=f"expected `{text}`",
                      notes=notes)
        return self.advance()

    def expect_name(self, what: str) -> Token:
        if self.tok.kind is not T.NAME:
            extra = " (it is a keyword)" if self.tok.kind is T.KEYWORD else ""
            self.fail(f"expected {what}, found {self.tok.describe()}{extra}", label=f"expected {what}")
        return self.advance()

    def skip_newlines(self) -> None:
        while self.tok.kind is T.NEWLINE:
            self.advance()

    def enter(self, tok: Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.too_deep(tok.span, "expression or block nested", MAX_DEPTH)

    def too_deep(self, span: Span, what: str, limit: int) -> None:
        self.diags.error(TOO_DEEP, span, what=what, limit=f"{limit:,}",
                         help="split it into named intermediate values or functions")
        raise _Abort

    def leave(self) -> None:
        self.depth -= 1

    def sync_statement(self) -> None:
        """Skip to the end of the current statement (a newline or `;` at this brace level)."""
        level = 0
        while self.tok.kind is not T.EOF:
            tok = self.tok
            if tok.kind is T.OP and tok.text == "{":
                level += 1
            elif tok.kind is T.OP and tok.text == "}":
                if level == 0:
                    return
                level -= 1
            elif level == 0 and (tok.kind is T.NEWLINE or tok.is_op(";")):
                self.advance()
                return
            self.advance()

    def sync_decl(self) -> None:
        """Skip to the next token that can start a file-level declaration."""
        while self.tok.kind is not T.EOF:
            tok = self.tok
            if tok.first and tok.col == 0 and (tok.is_kw("def") or tok.is_kw("extern") or tok.is_kw("import")
                                               or tok.kind is T.NAME):
                return
            self.advance()

    def recovering(self, parse, keep, sync) -> None:
        """Parse one item and keep it; after a reported error, skip ahead with `sync` (always
        moving at least one token, so a stuck parser cannot loop)."""
        start = self.pos
        try:
            keep(parse())
        except _Sync:
            if self.pos == start:
                self.advance()
            sync()

    # --- file level -----------------------------------------------------------------------------
    def parse_module(self) -> A.Module:
        module = A.Module(self.nid(), Span(0, self.toks[-1].span.end), [])
        try:
            while True:
                self.skip_newlines()
                if self.tok.kind is T.EOF:
                    break
                self.recovering(self.parse_decl, module.decls.append, self.sync_decl)
        except _Abort:
            return module
        deep = _too_deep(module)
        if deep is not None:
            try:
                self.too_deep(deep.span, "syntax tree (operators, postfixes and nesting together)",
                              MAX_TREE_DEPTH)
            except _Abort:
                pass
        return module

    def parse_decl(self) -> A.Decl:
        tok = self.tok
        if tok.is_kw("def"):
            return self.parse_def()
        if tok.is_kw("import"):
            self.advance()
            parts = [self.expect_name("a module name").text]
            while self.at_op("."):
                self.advance()
                parts.append(self.expect_name("a module name").text)
            end = self.toks[self.pos - 1]
            self.end_statement()
            return A.Import(self.nid(), tok.span.to(end.span), parts)
        if tok.is_kw("extern"):
            self.advance()
            role = None
            # `state` and `counter` are words only here, before a type: `extern state Tensor[...] W`.
            if self.tok.kind is T.NAME and self.tok.text in EXTERN_ROLES and self.peek().kind is T.NAME:
                role = self.advance().text
            ty = self.parse_type()
            name = self.expect_name("a name for the external")
            self.end_statement()
            return A.Extern(self.nid(), tok.span.to(name.span), ty, name.text, role)
        if tok.kind is T.NAME and self.peek().is_op("="):
            self.advance()
            self.advance()
            value = self.parse_expr()
            self.end_statement()
            return A.ConstDecl(self.nid(), tok.span.to(value.span), tok.text, value)
        self.diags.error(BAD_DECL, tok.span, detail=f"expected `def`, `extern` or `NAME = value` at file level, "
                         f"found {tok.describe()}", help="statements belong inside a function such as `def main() { ... }`")
        raise _Sync

    def parse_def(self) -> A.FuncDef:
        start = self.advance()
        name = self.expect_name("a function name")
        open_tok = self.expect_op("(", "after the function name")
        params: list[A.Param] = []
        self.skip_newlines()
        while not self.at_op(")"):
            ty = self.parse_type()
            pname = self.expect_name("a parameter name")
            params.append(A.Param(self.nid(), ty.span.to(pname.span), ty, pname.text))
            if not self.at_op(","):
                break
            self.advance()
        self.expect_op(")", "to close the parameter list", open_tok)
        ret = None
        if self.at_op("->"):
            self.advance()
            ret = self.parse_type()
        if not self.at_op("{"):
            self.fail(f"expected `{{` to start the body of `{name.text}`, found {self.tok.describe()}",
                      label="expected `{`", help="function bodies are blocks: `def f(...) -> T { ... }`")
        before = self.diags.error_count + self.suppressed
        body = self.parse_block()
        return A.FuncDef(self.nid(), start.span.to(body.span), name.text, params, ret, body, name.span,
                         syntax_errors=self.diags.error_count + self.suppressed > before)

    # --- types ----------------------------------------------------------------------------------
    def parse_type(self) -> A.TypeExpr:
        self.enter(self.tok)        # `Result[Result[...]]` and `((...))` nest like expressions
        try:
            return self.parse_type_inner()
        finally:
            self.leave()

    def parse_type_inner(self) -> A.TypeExpr:
        tok = self.tok
        if tok.is_op("("):
            self.advance()
            items = [self.parse_type()]
            while self.at_op(","):
                self.advance()
                if self.at_op(")"):
                    break
                items.append(self.parse_type())
            end = self.expect_op(")", "to close the tuple type", tok)
            return A.TupleTypeExpr(self.nid(), tok.span.to(end.span), items)
        name = self.expect_name("a type")
        if name.text == "Tensor" and self.at_op("["):
            self.advance()
            dtype_tok = self.expect_name("a dtype")
            dtype = A.TypeName(self.nid(), dtype_tok.span, dtype_tok.text)
            dims: list[A.DimExpr] = []
            while self.at_op(","):
                self.advance()
                d = self.tok
                if d.kind is T.INT:
                    dims.append(A.DimExpr(self.nid(), d.span, self.int_value(d)))
                elif d.kind is T.NAME:
                    dims.append(A.DimExpr(self.nid(), d.span, d.text))
                else:
                    self.fail(f"expected a dimension (an integer or a name), found {d.describe()}")
                self.advance()
            end = self.expect_op("]", "to close `Tensor[...]`")
            return A.TensorTypeExpr(self.nid(), name.span.to(end.span), dtype, dims)
        if name.text == "Result" and self.at_op("["):
            self.advance()
            inner = self.parse_type()
            end = self.expect_op("]", "to close `Result[...]`")
            return A.ResultTypeExpr(self.nid(), name.span.to(end.span), inner)
        return A.TypeName(self.nid(), name.span, name.text)

    # --- statements -----------------------------------------------------------------------------
    def parse_block(self) -> A.Block:
        open_tok = self.expect_op("{")
        self.enter(open_tok)
        stmts: list[A.Stmt] = []
        while True:
            self.skip_newlines()
            if self.at_op("}") or self.tok.kind is T.EOF:
                break
            if self.at_op(";"):
                self.advance()
                continue
            self.recovering(self.parse_statement, stmts.append, self.sync_statement)
        if self.tok.kind is T.EOF:
            self.diags.error(SYNTAX, open_tok.span, detail="this `{` is never closed",
                             label="unclosed block")
            self.leave()
            return A.Block(self.nid(), open_tok.span, stmts)
        close = self.advance()
        self.leave()
        return A.Block(self.nid(), open_tok.span.to(close.span), stmts)

    def end_statement(self) -> None:
        tok = self.tok
        if tok.kind in (T.NEWLINE, T.EOF):
            if tok.kind is T.NEWLINE:
                self.advance()
            return
        if tok.is_op(";"):
            self.advance()
            return
        if tok.is_op("}"):
            return
        self.fail(f"expected the end of the statement, found {tok.describe()}",
                  label="unexpected here", help="put each statement on its own line")

    def parse_statement(self) -> A.Stmt:
        tok = self.tok
        if tok.is_kw("return"):
            self.advance()
            value = None
            if not (self.tok.kind in (T.NEWLINE, T.EOF) or self.at_op("}") or self.at_op(";")):
                value = self.parse_expr_list()
            self.end_statement()
            return A.Return(self.nid(), tok.span.to(value.span if value else tok.span), value)
        if tok.is_kw("if"):
            stmt = self.parse_if()
            return stmt
        if tok.is_kw("with"):
            return self.parse_with()
        if tok.is_kw("for"):
            return self.parse_for()
        expr = self.parse_expr_list()
        if self.at_op("="):
            eq = self.advance()
            targets = self.assignment_targets(expr, eq)
            value = self.parse_expr_list()
            self.end_statement()
            return A.Assign(self.nid(), expr.span.to(value.span), targets, value,
                            destructure=isinstance(expr, A.TupleExpr))
        self.end_statement()
        return A.ExprStmt(self.nid(), expr.span, expr)

    def assignment_targets(self, expr: A.Expr, eq: Token) -> list[A.Name]:
        items = expr.items if isinstance(expr, A.TupleExpr) else [expr]
        for item in items:
            if not isinstance(item, A.Name):
                self.diags.error(SYNTAX, item.span, detail="invalid assignment target",
                                 label="only names can be assigned", help="assign to a name: `y = ...`")
                raise _Sync
        return list(items)  # type: ignore[arg-type]

    def parse_if(self) -> A.If:
        start = self.advance()
        cond = self.parse_expr()
        if not self.at_op("{"):
            self.fail(f"expected `{{` after the `if` condition, found {self.tok.describe()}",
                      label="expected `{`", help="write `if cond { ... } else { ... }`")
        then = self.parse_block()
        orelse: A.Block | A.If | None = None
        # `else` may follow the closing brace on the same line or on the next one.
        save = self.pos
        self.skip_newlines()
        if self.at_kw("else"):
            self.advance()
            if self.at_kw("if"):
                # An `else if` chain is an `If` nested in the last one's `else`: as deep a tree
                # (and as deep a recursion here) as it is long.
                self.else_ifs += 1
                if self.else_ifs > MAX_TREE_DEPTH:
                    self.too_deep(self.tok.span, "`else if` chain", MAX_TREE_DEPTH)
                try:
                    orelse = self.parse_if()
                finally:
                    self.else_ifs -= 1
                return A.If(self.nid(), start.span.to(orelse.span), cond, then, orelse)
            if not self.at_op("{"):
                self.fail(f"expected `{{` or `if` after `else`, found {self.tok.describe()}")
            orelse = self.parse_block()
        else:
            self.pos = save
        end = orelse.span if orelse else then.span
        if not (self.at_op("}") or self.tok.kind is T.EOF):
            self.end_statement()
        return A.If(self.nid(), start.span.to(end), cond, then, orelse)

    def parse_for(self) -> A.For:
        """`for NAME in range(stop) { ... }` or `range(start, stop)`; the checker unrolls it."""
        start = self.advance()
        var = self.expect_name("a loop variable")
        if not self.at_kw("in"):
            self.fail(f"expected `in` after the loop variable, found {self.tok.describe()}", label="expected `in`",
                      help=f"write `for {var.text} in range(N) {{ ... }}`")
        self.advance()
        iterable = self.parse_expr()
        if not (isinstance(iterable, A.Call) and isinstance(iterable.func, A.Name) and iterable.func.id == "range"
                and 1 <= len(iterable.args) <= 2 and not iterable.kwargs):
            self.diags.error(BAD_LOOP, iterable.span, detail="a `for` loop runs over `range(stop)` or `range(start, stop)`",
                             label="expected `range(...)`",
                             help=f"loops are unrolled over constant bounds: `for {var.text} in range(L) {{ ... }}`")
            raise _Sync
        if not self.at_op("{"):
            self.fail(f"expected `{{` to start the loop's block, found {self.tok.describe()}", label="expected `{`",
                      help=f"write `for {var.text} in range(N) {{ ... }}`")
        body = self.parse_block()
        return A.For(self.nid(), start.span.to(body.span), var.text, var.span, list(iterable.args), body,
                     iterable.span)

    def parse_with(self) -> A.With:
        start = self.advance()
        shards: list[A.Call] = []
        while True:
            expr = self.parse_expr()
            if not (isinstance(expr, A.Call) and isinstance(expr.func, A.Name) and expr.func.id == "shard"):
                self.diags.error(SYNTAX, expr.span, detail="a `with` block takes `shard(...)` clauses",
                                 label="expected `shard(X, dim=d)`")
                raise _Sync
            shards.append(expr)
            if not self.at_op(","):
                break
            self.advance()
        if self.at_op("{"):
            body = self.parse_block()
        elif self.at_op(":"):
            body = self.parse_indented_block(start)
        else:
            self.fail(f"expected `:` or `{{` after the shard clauses, found {self.tok.describe()}")
        return A.With(self.nid(), start.span.to(body.span), shards, body)

    def parse_indented_block(self, with_tok: Token) -> A.Block:
        colon = self.advance()
        if self.tok.kind is not T.NEWLINE:
            self.fail("the block after `with ...:` starts on the next line, indented", label="expected a new line")
        self.advance()
        first = self.tok
        if first.kind is T.EOF or first.is_op("}") or first.col <= with_tok.col:
            self.diags.error(INDENT, colon.span, detail="expected an indented block after `with ...:`",
                             label="the block should start on the next line, indented")
            return A.Block(self.nid(), colon.span, [])
        self.enter(first)
        block_col = first.col
        stmts: list[A.Stmt] = []
        while self.tok.kind is not T.EOF and not self.at_op("}") and self.tok.col > with_tok.col:
            if self.tok.col != block_col:
                self.diags.error(INDENT, self.tok.span, detail=(
                    "unexpected indent" if self.tok.col > block_col else "unindent does not match the block"),
                    label=f"the block's statements start at column {block_col + 1}")
                self.sync_statement()
                continue
            self.recovering(self.parse_statement, stmts.append, self.sync_statement)
            self.skip_newlines()
        self.leave()
        end = stmts[-1].span if stmts else colon.span
        return A.Block(self.nid(), colon.span.to(end), stmts)

    # --- expressions ----------------------------------------------------------------------------
    def parse_expr_list(self) -> A.Expr:
        """An expression, or several separated by commas (a tuple without parentheses)."""
        first = self.parse_expr()
        if not self.at_op(","):
            return first
        items = [first]
        while self.at_op(","):
            self.advance()
            items.append(self.parse_expr())
        return A.TupleExpr(self.nid(), first.span.to(items[-1].span), items)

    def parse_expr(self, min_bp: int = 0) -> A.Expr:
        tok = self.tok
        self.enter(tok)
        if tok.is_kw("not"):
            self.advance()
            operand = self.parse_expr(_NOT_BP)
            left: A.Expr = A.Unary(self.nid(), tok.span.to(operand.span), "not", operand)
        elif tok.kind is T.OP and tok.text in ("-", "+"):
            self.advance()
            self.negated = tok.text == "-" and self.tok.kind is T.INT
            operand = self.parse_expr(_UNARY_BP)
            left = A.Unary(self.nid(), tok.span.to(operand.span), tok.text, operand)
        else:
            left = self.parse_postfix()
        chain = 0
        while True:
            op = self.tok
            text = op.text if op.kind in (T.OP, T.KEYWORD) else None
            bp = _BINARY.get(text) if text else None
            if bp is None or bp <= min_bp:
                break
            self.advance()
            chain += 1
            if chain > MAX_TREE_DEPTH:
                self.too_deep(op.span, "operator chain", MAX_TREE_DEPTH)
            right = self.parse_expr(bp)
            if bp == _COMPARISON_BP and self.tok.text in _BINARY and _BINARY[self.tok.text] == _COMPARISON_BP \
                    and self.tok.kind is T.OP:
                src = self.diags.source
                first, middle = src.snippet(left.span), src.snippet(right.span)
                after = self.peek()
                last = after.text if after.kind in (T.NAME, T.INT, T.FLOAT) else "..."
                self.fail("comparisons cannot be chained", label="second comparison",
                          help=f"combine them with `and`: `{first} {text} {middle} and {middle} {self.tok.text} "
                               f"{last}`")
            left = A.Binary(self.nid(), left.span.to(right.span), text, left, right, op.span)
        self.leave()
        return left

    def parse_postfix(self) -> A.Expr:
        expr = self.parse_primary()
        chain = 0
        while True:
            tok = self.tok
            chain += 1
            if chain > MAX_TREE_DEPTH:
                self.too_deep(tok.span, "chain of calls, indexes and methods", MAX_TREE_DEPTH)
            if tok.is_op("("):
                self.enter(tok)
                args, kwargs, end = self.parse_args()
                self.leave()
                expr = A.Call(self.nid(), expr.span.to(end.span), expr, args, kwargs)
            elif tok.is_op("["):
                self.enter(tok)
                expr = self.parse_index(expr)
                self.leave()
            elif tok.is_op("."):
                self.advance()
                name = self.expect_name("a method name")
                if not self.at_op("("):
                    self.fail(f"expected `(` after `.{name.text}`: only methods can follow `.`")
                self.enter(name)
                args, kwargs, end = self.parse_args()
                self.leave()
                expr = A.MethodCall(self.nid(), expr.span.to(end.span), expr, name.text, args, kwargs, name.span)
            else:
                return expr

    def parse_args(self) -> tuple[list[A.Expr], list[A.Keyword], Token]:
        open_tok = self.advance()  # (
        args: list[A.Expr] = []
        kwargs: list[A.Keyword] = []
        while not self.at_op(")"):
            tok = self.tok
            if tok.kind is T.NAME and self.peek().is_op("="):
                self.advance()
                self.advance()
                value = self.parse_expr()
                kwargs.append(A.Keyword(self.nid(), tok.span.to(value.span), tok.text, value))
            else:
                if kwargs:
                    self.fail("positional argument after keyword arguments", label="move it before the keywords")
                args.append(self.parse_expr())
            if not self.at_op(","):
                break
            self.advance()
        end = self.expect_op(")", "to close the argument list", open_tok)
        return args, kwargs, end

    def parse_index(self, base: A.Expr) -> A.Expr:
        open_tok = self.advance()  # [
        items: list[A.Expr | A.Slice] = []
        while not self.at_op("]"):
            items.append(self.parse_index_item())
            if not self.at_op(","):
                break
            self.advance()
        end = self.expect_op("]", "to close the index", open_tok)
        if not items:
            self.diags.error(SYNTAX, end.span, detail="empty index `[]`", label="expected an index or a slice")
            raise _Sync
        return A.Index(self.nid(), base.span.to(end.span), base, items)

    def parse_index_item(self) -> A.Expr | A.Slice:
        start = self.tok
        lo = None if self.at_op(":") else self.parse_expr()
        if not self.at_op(":"):
            assert lo is not None
            return lo
        self.advance()
        hi = None if (self.at_op(":") or self.at_op(",") or self.at_op("]")) else self.parse_expr()
        step = None
        if self.at_op(":"):
            self.advance()
            step = None if (self.at_op(",") or self.at_op("]")) else self.parse_expr()
        end = self.toks[self.pos - 1]
        return A.Slice(self.nid(), start.span.to(end.span), lo, hi, step)

    def parse_primary(self) -> A.Expr:
        tok = self.tok
        kind = tok.kind
        if kind is T.INT:
            self.advance()
            return A.IntLit(self.nid(), tok.span, self.int_value(tok), tok.text)
        if kind is T.FLOAT:
            self.advance()
            value = float(tok.text.replace("_", ""))
            if not math.isfinite(value):
                self.diags.error(LITERAL_RANGE, tok.span, literal=tok.describe()[1:-1], dtype="float64",
                                 label="this is larger than any float64",
                                 help="the largest float64 is about 1.8e308; XG has no infinity literal")
                value = 0.0
            return A.FloatLit(self.nid(), tok.span, value, tok.text)
        if kind is T.STRING:
            self.advance()
            return A.StrLit(self.nid(), tok.span, tok.text[1:-1])
        if kind is T.NAME:
            self.advance()
            return A.Name(self.nid(), tok.span, tok.text)
        if tok.is_kw("true") or tok.is_kw("false"):
            self.advance()
            return A.BoolLit(self.nid(), tok.span, tok.text == "true")
        if tok.is_kw("match"):
            return self.parse_match()
        if tok.is_op("("):
            self.advance()
            if self.at_op(")"):
                end = self.advance()
                return A.TupleExpr(self.nid(), tok.span.to(end.span), [])
            first = self.parse_expr()
            if self.at_op(")"):
                self.advance()
                return first
            items = [first]
            while self.at_op(","):
                self.advance()
                if self.at_op(")"):
                    break
                items.append(self.parse_expr())
            end = self.expect_op(")", "to close the parenthesis", tok)
            return A.TupleExpr(self.nid(), tok.span.to(end.span), items)
        if tok.is_op("["):
            self.advance()
            items = []
            while not self.at_op("]"):
                items.append(self.parse_expr())
                if not self.at_op(","):
                    break
                self.advance()
            end = self.expect_op("]", "to close the list", tok)
            return A.ListExpr(self.nid(), tok.span.to(end.span), items)
        self.fail(f"expected an expression, found {tok.describe()}", label="expected an expression")
        raise AssertionError  # unreachable: fail() raises

    def int_value(self, tok: Token) -> int:
        """An integer literal's value; one outside `int64` is an error (and reads as 0). Its digits
        are ASCII: the lexer takes no other digits."""
        negated, self.negated = self.negated, False
        digits = tok.text.replace("_", "").lstrip("0") or "0"
        # Past 19 digits the answer is known; int() of 5,000 digits would even raise (CPython's
        # limit on converting long digit strings).
        value = INT64_MAX + 2 if len(digits) > 19 else int(digits)
        if value > INT64_MAX + (1 if negated else 0):
            self.diags.error(LITERAL_RANGE, tok.span, literal=tok.describe()[1:-1], dtype="int64",
                             label="larger than 9223372036854775807",
                             help="integer literals are `int64`; write a float literal (`1e40`) for a larger value")
            return 0
        return value

    def parse_match(self) -> A.Match:
        start = self.advance()
        scrutinee = self.parse_expr()
        if not self.at_op("{"):
            self.fail(f"expected `{{` after the `match` value, found {self.tok.describe()}")
        self.advance()
        arms: list[A.Arm] = []
        while True:
            self.skip_newlines()
            if self.at_op("}") or self.tok.kind is T.EOF:
                break
            pattern = self.parse_pattern()
            self.expect_op("=>", "after the pattern")
            self.skip_newlines()
            body = self.parse_expr()
            arms.append(A.Arm(self.nid(), pattern.span.to(body.span), pattern, body))
            self.skip_newlines()
            if self.at_op(","):
                self.advance()
            elif not self.at_op("}"):
                self.fail(f"expected `,` or `}}` after the match arm, found {self.tok.describe()}")
        end = self.expect_op("}", "to close the `match`")
        return A.Match(self.nid(), start.span.to(end.span), scrutinee, arms)

    def parse_pattern(self) -> A.Pattern:
        tok = self.expect_name("a pattern such as `Ok(v)` or `Err(e)`")
        if not self.at_op("("):
            return A.Pattern(self.nid(), tok.span, tok.text, None)
        self.advance()
        bind = self.expect_name("a name to bind")
        end = self.expect_op(")", "to close the pattern")
        return A.Pattern(self.nid(), tok.span.to(end.span), tok.text, bind.text, bind.span)


def _too_deep(module: A.Module) -> A.Node | None:
    """The first node deeper than MAX_TREE_DEPTH, found by a walk with its own stack."""
    stack: list[tuple[object, int]] = [(module, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, A.Node):
            if depth > MAX_TREE_DEPTH:
                return node
            stack.extend((getattr(node, name, None), depth + 1) for name in node.__slots__)
        elif isinstance(node, list):
            stack.extend((item, depth) for item in node)
    return None


def parse(tokens: list[Token], diags: Diagnostics, first_id: int = 0) -> A.Module:
    return Parser(tokens, diags, first_id).parse_module()
