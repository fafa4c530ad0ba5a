#!/usr/bin/env bash
# Builds .venv-ref: the official qwen-tts 0.1.1 reference, which pins transformers 4.57.3 and
# cannot share the project's environment (transformers 5.x). Parity tests run it as a subprocess.
set -euo pipefail
venv=${1:-.venv-ref}
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
# qwen-tts's own requirements minus gradio (demo only) and torchaudio (no build for this torch).
"$venv/bin/pip" install -q torch==2.13.0 transformers==4.57.3 accelerate==1.12.0 \
  librosa soundfile einops onnxruntime sox numpy safetensors
"$venv/bin/pip" install -q --no-deps qwen-tts==0.1.1
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp -r "$(dirname "$0")/torchaudio_shim/torchaudio" "$site/"
"$venv/bin/python" -c 'import qwen_tts'
