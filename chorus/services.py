"""The Chorus processes: where each one's config and service class live.

Imported lazily by name so `chorus serve gateway` never imports torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceEntry:
    config: str
    service: str
    grpc_service: str

    def load_config_class(self) -> type:
        return _import(self.config)

    def load_service_class(self) -> type:
        return _import(self.service)


def _import(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


SERVICES = {
    "talker": ServiceEntry(
        "chorus.talker.config:TalkerConfig", "chorus.talker.service:TalkerService", "chorus.v1.Talker"
    ),
    "vocoder": ServiceEntry(
        "chorus.vocoder.config:VocoderConfig", "chorus.vocoder.service:VocoderService", "chorus.v1.Vocoder"
    ),
    "diffusion": ServiceEntry(
        "chorus.diffusion.config:DiffusionConfig", "chorus.diffusion.service:DiffusionService", "chorus.v1.Diffusion"
    ),
    # Talker and vocoder in one process on one GPU (chorus.speech); an alternative to running them apart.
    "speech": ServiceEntry("chorus.speech:SpeechConfig", "chorus.speech:SpeechService", ""),
    "gateway": ServiceEntry(
        "chorus.gateway.config:GatewayConfig", "chorus.gateway.service:GatewayService", "chorus.v1.Chorus"
    ),
}
