"""Pure model modules of the Qwen3-TTS 12 Hz codec (no serving code)."""
