"""Codegen: kernel specs -> Triton source and cubins (schedule, spec, emitter, templates, build)."""
