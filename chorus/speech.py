"""`chorus serve speech`: the talker and the vocoder in one process, one GPU shared without time-slicing.

Two processes on one GPU take turns on it: the driver time-slices their contexts, so a vocoder chunk waits for
the talker's decode step to yield, and neither fills the GPU while the other runs. In one process each engine
runs on a CUDA stream of its own — the vocoder's at a higher priority, because its short decodes are what a
listener waits for — and their kernels interleave. The process serves both gRPC services on one port (point the
gateway's talker and vocoder targets at it); each reads its own settings (`CHORUS_TALKER_*`, `CHORUS_VOCODER_*`),
and only the listening address, metrics port, drain time and logging come from `CHORUS_SPEECH_*`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import grpc

from chorus.runtime.config import ServiceConfig, load_config
from chorus.runtime.host import Service
from chorus.talker.config import TalkerConfig
from chorus.vocoder.config import VocoderConfig

TALKER_STREAM_PRIORITY = 0
VOCODER_STREAM_PRIORITY = -1  # higher: its decodes sit on the time-to-first-audio path


@dataclasses.dataclass(frozen=True, slots=True)
class SpeechConfig(ServiceConfig):
    env_prefix: ClassVar[str] = "CHORUS_SPEECH_"


class SpeechService(Service):
    name = "speech"

    def __init__(self, config: SpeechConfig) -> None:
        # Imported here: every `chorus` command reads SpeechConfig to build its parser, and the services import torch
        # and transformers (seconds, and hundreds of MB in each gateway worker).
        from chorus.talker.service import TalkerService
        from chorus.vocoder.service import VocoderService

        try:
            talker_config, vocoder_config = load_config(TalkerConfig), load_config(VocoderConfig)
        except ValueError as exc:
            raise SystemExit(f"chorus serve speech: {exc}") from None
        self.config = config
        self.grpc_services = (*TalkerService.grpc_services, *VocoderService.grpc_services)
        self.talker = TalkerService(talker_config, stream_priority=TALKER_STREAM_PRIORITY)
        self.vocoder = VocoderService(vocoder_config, stream_priority=VOCODER_STREAM_PRIORITY)

    def register(self, server: grpc.aio.Server) -> None:
        self.talker.register(server)
        self.vocoder.register(server)

    async def start(self) -> None:
        # One after the other: both warm-ups capture CUDA graphs, which must not overlap on one device.
        await self.vocoder.start()
        await self.talker.start()

    async def close(self) -> None:
        await self.talker.close()
        await self.vocoder.close()
