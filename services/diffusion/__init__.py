"""Stable Audio Open text-to-audio service.

Reads top-down: config → service (gRPC glue) → wire (proto ↔ engine) → engine/ (requests, admission,
the worker loop; engine/runner.py is the only tensor code) → sampler, conditioning, dit (+ attention,
graphs) → loader and presets (checkpoints, dtypes, random builds). bench.py compares against diffusers.
"""
