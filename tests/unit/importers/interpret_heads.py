"""transformers models whose attention output is merged back into [B, T, H * D]
(`o.transpose(1, 2).reshape(...)`): the attention kernel writes the merged layout itself
(placement.merged_heads), run under Triton's interpreter against the float64 CPU reference. Prints,
as JSON, per model: the attention kernels that write a view of their output, all attention
kernels, and the outputs' largest relative error, at the predicted configs and with v's head split
over two programs. A script, not a test: TRITON_INTERPRET must be
set before Triton is imported, so the test runs it in a fresh process.

    python tests/unit/importers/interpret_heads.py
"""

from __future__ import annotations

import json


def _models():
    import torch
    import transformers as T
    torch.manual_seed(0)
    ids = torch.randint(0, 500, (2, 24))
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[0, 16:] = 0
    llama = T.LlamaModel(T.LlamaConfig(vocab_size=500, hidden_size=128, intermediate_size=96, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    gpt2 = T.GPT2Model(T.GPT2Config(vocab_size=500, n_embd=64, n_layer=1, n_head=4, n_positions=64))
    for name, model, dtype in (("llama_gqa_bf16", llama, torch.bfloat16), ("gpt2_f32", gpt2, torch.float32)):
        model.config.use_cache = False
        yield name, model.eval().to(dtype), {"input_ids": ids, "attention_mask": mask}


def main() -> None:
    from xgbuild.runtime import interpret
    interpret.enable()
    from xgbuild.build.interpreted import check_graph
    from xgbuild.compiler.codegen.schedule import schedule
    from xgbuild.compiler.codegen.templates import template
    from xgbuild.compiler.importers.torch_export import import_torch
    report = {}
    for name, model, kwargs in _models():
        imported = import_torch(model, (), example_kwargs=kwargs)
        graph = imported.optimized.main
        sched = schedule(graph)
        specs = [template("attention").spec(sched, k)[0] for k in sched.kernels if k.kind == "attention"]
        values = dict(zip(imported.inputs, kwargs.values()))
        values.update(imported.weights)
        out = check_graph(graph, values, {})

        def split_v(job, config):
            """v's head in two blocks of columns (two programs store each row's merged head)."""
            return {**config, "BLOCK_DV": 16, "BLOCK_M": 16} if job.spec.kind == "attention" else config
        out += check_graph(graph, values, {}, choose=split_v)
        report[name] = {"strided": sum(s.strided_out for s in specs), "attention": len(specs),
                        "rel_err": max(o["rel_err"] for o in out)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
