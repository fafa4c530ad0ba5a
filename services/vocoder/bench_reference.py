"""The official qwen-tts 0.1.1 one-shot decode, timed; run by the reference environment's Python, e.g.
`.venv-ref/bin/python services/vocoder/bench_reference.py DEVICE DECODER_CONFIG_JSON STREAMS FRAMES`.

Builds `Qwen3TTSTokenizerV2Model` with the given decoder config and random weights (compute cost does not
depend on weight values), decodes STREAMS utterances of FRAMES frames per call (the package's own batched
`decode`, 300/25 windows), and prints {"audio_s_per_s": …} as JSON. Imports nothing from Chorus.
"""

import json
import sys
import time

import torch
from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model


def main(device: str, decoder_config: str, num_streams: str, num_frames: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    config = Qwen3TTSTokenizerV2Config(decoder_config=json.loads(decoder_config), attn_implementation="sdpa")
    model = Qwen3TTSTokenizerV2Model(config).to(device).eval()
    codes = torch.randint(0, 2048, (int(num_streams), int(num_frames), 16), device=device)

    def run() -> None:
        with torch.inference_mode():
            wavs = model.decode(codes).audio_values
            [w.cpu() for w in wavs]

    run()
    began = time.perf_counter()
    run()
    elapsed_s = time.perf_counter() - began
    audio_s = int(num_streams) * int(num_frames) * config.decode_upsample_rate / config.output_sample_rate
    print(json.dumps({"audio_s_per_s": audio_s / elapsed_s, "elapsed_s": elapsed_s}))


if __name__ == "__main__":
    main(*sys.argv[1:])
