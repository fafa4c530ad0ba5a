"""`chorus bench`: end-to-end benchmarks against a running stack (text-to-speech and text-to-audio)."""
