"""Stand-in for torchaudio inside the reference environment only.

qwen-tts imports `torchaudio.compliance.kaldi` at import time for its 25 Hz tokenizer, which the
12 Hz models we compare against never call. No torchaudio build matches the CPU torch pinned
here, so this package satisfies the import and fails loudly if anything actually uses it.
"""
