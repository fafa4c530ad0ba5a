#!/usr/bin/env bash
# Builds the peers' environments, as the parity tests run qwen-tts in .venv-ref. Two sets, one per peer:
#
#   make_env.sh [VENV]          .venv-peers: faster-qwen3-tts 0.5.4 on qwen-tts-hf 0.1.1.post1 + transformers 5.16.1
#   make_env.sh --hf4 [VENV]    .venv-peers-hf4: faster-qwen3-tts-batch 0.2.0 on faster-qwen3-tts 0.3.2 + the original
#                               qwen-tts 0.1.1 + transformers 4.57.3 (the same stack as .venv-ref)
#
# Why two: faster-qwen3-tts-batch 0.2.0 calls transformers 4's cache API (`StaticLayer.lazy_initialization(key)`;
# every transformers 5.x takes `(key, value)`), so under transformers 5 each batch size fails with "TypeError:
# StaticLayer.lazy_initialization() missing 1 required positional argument: 'value_states'". faster-qwen3-tts 0.3.2
# is the newest release on qwen-tts + transformers 4 (`transformers<5,>=4.57`, `qwen-tts>=0.1.1`; 0.4.0 on moved to
# qwen-tts-hf + transformers>=5.15.1), and has everything the batch engine takes from it (`FasterQwen3TTS`,
# `_prepare_generation`, `_warmup`, `sample_rate`, `max_seq_len`, `device`, `dtype`).
#
# The first set's model code is qwen-tts-hf (a transformers-5 port of qwen-tts that installs the same `qwen_tts`
# module). Its transformers is pinned to 5.16.1, the newest release they load a checkpoint with: from 5.17.0 (the
# GPU image's) RoPE buffer init prefers the global "default" entry, which qwen-tts-hf registers with a function
# that reads `config.rope_theta`, an attribute MimiConfig no longer has; the codec load then fails with
# "AttributeError: 'MimiConfig' object has no attribute 'rope_theta'" (checked up to 5.24.0).
#
# For the GPU machine (no network, torch 2.11 + CUDA 13 already installed), collect the wheels instead:
#   bench/peers/make_env.sh --wheels DIR           # first set + what the image lacks or has at another version
#   bench/peers/make_env.sh --hf4 --wheels DIR     # the batch peer's set, likewise
# and install each with pip's --no-index --no-deps into its own --target (see bench/peers/README.md).
# No torch or CUDA wheel travels: the image's torch, torchaudio, onnxruntime, scipy, numba serve.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
hf4=0
if [[ ${1:-} == --hf4 ]]; then hf4=1; shift; fi
if ((hf4)); then
  peers=(faster-qwen3-tts-batch==0.2.0 faster-qwen3-tts==0.3.2 qwen-tts==0.1.1)
  # transformers 4.57.3 (qwen-tts's pin) checks at import: huggingface-hub<1.0 and tokenizers<=0.23.0 (the image
  # has 1.33.0 and 0.23.2); accelerate is qwen-tts's pin, 1.12.0 (the image has 1.15.0).
  pins=(transformers==4.57.3 huggingface-hub==0.36.2 tokenizers==0.22.2 accelerate==1.12.0)
  venv_only=()
  modules=faster_qwen3_tts_batch,faster_qwen3_tts,qwen_tts
  default_venv=.venv-peers-hf4
else
  peers=(faster-qwen3-tts==0.5.4 qwen-tts-hf==0.1.1.post1)
  # Versions the image has but not as pinned: transformers (see above; 12 MiB of the set) and accelerate, which
  # qwen-tts-hf pins to 1.12.0 (the image has 1.15.0). The image's huggingface-hub is the venv's.
  pins=(transformers==5.16.1 accelerate==1.12.0)
  venv_only=(huggingface-hub==1.33.0)
  modules=faster_qwen3_tts,qwen_tts
  default_venv=.venv-peers
fi
# What the GPU image lacks among the peers' import-time deps (KINDS.md's package list), pinned to what the
# CPU venv resolves; qwen-tts and qwen-tts-hf import the same modules. gradio (demo only) is left out: nothing
# the benchmark imports needs it.
device_extras=(librosa==0.11.0 soundfile==0.13.1 cffi==2.1.1 pycparser==3.12 sox==1.4.1 audioread==3.1.0
               soxr==1.1.0 pooch==1.9.0 platformdirs==4.14.8 decorator==5.3.1)

if [[ ${1:-} == --wheels ]]; then
  dir=${2:?usage: make_env.sh [--hf4] --wheels DIR}
  mkdir -p "$dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" \
    "${peers[@]}" "${pins[@]}" "${device_extras[@]}" 2>&1 | grep -v '^WARNING' || true
  du -sh "$dir"
  exit 0
fi

venv=${1:-$default_venv}
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
# qwen-tts(-hf)'s requirements minus gradio (demo only) and torchaudio (no build for this torch); CPU torch here.
"$venv/bin/pip" install -q torch==2.13.0 "${pins[@]}" "${venv_only[@]}" \
  librosa==0.11.0 soundfile==0.13.1 einops onnxruntime sox==1.4.1 numpy safetensors
"$venv/bin/pip" install -q --no-deps "${peers[@]}"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# The speaker encoder's import chain reaches torchaudio.compliance.kaldi; the parity tests' shim provides it.
cp -r "$here/../../tests/reference/torchaudio_shim/torchaudio" "$site/"
"$venv/bin/python" -c "import $modules"
