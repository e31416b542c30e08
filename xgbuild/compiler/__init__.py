"""The XG compiler: frontend (source -> typed AST), ir, passes, codegen, in pipeline order."""
