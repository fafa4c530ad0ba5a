"""Talker serving engine: request state → scheduler (pure policy) → runner (the only device code) → engine loop."""
