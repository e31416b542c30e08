"""Frontend: lexer, parser, AST, types, checker and diagnostics for `.xg` sources."""
