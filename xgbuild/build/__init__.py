"""The build: compile -> tune -> link -> package, the one sequence that makes an engine.

`xgc`, `xgc MODEL.onnx`, `xgbuild tune | jobs | tune-shard`, the Bazel actions (through those
commands), `xg.compile_file` and `xg.compile` all build here; they only parse options and print.

    compile.py      an `.xg` source and its sharding plan file to the optimised program
    target.py       the GPU profile of a target, loaded once from the settings' hw directory
    context.py      the XG cache, local measurers and the GPU lease a tuning step runs with
    kernels.py      tune (and compile) a program's kernels into a linked kernel table
    shards.py       the same split into build-system steps: jobs -> shards -> results -> link
    package.py      an engine (`.xge` contents) from an optimised program and its kernel table
    engines.py      the whole sequences: an `.xg` program's engine, an imported model's engine
    interpreted.py  kernels checked under Triton's interpreter against the float64 reference

The runtime never imports this package: it loads, binds and runs what this package wrote.
"""
