"""Import-only stand-in: any use means the reference took a path parity tests do not cover."""


def __getattr__(name: str):
    raise NotImplementedError(f"torchaudio.compliance.kaldi.{name} is not available in the reference environment")
