"""Serving engine of the vocoder: per-stream decoder states, batched chunk decodes, CUDA graphs."""
