"""The vocoder process: gRPC glue between `Vocoder.Decode`/`Encode` and the codec engine."""

from __future__ import annotations

import grpc

from chorus.runtime.errors import NotImplementedYet
from chorus.runtime.host import Service
from chorus.v1 import common_pb2, vocoder_pb2_grpc
from chorus.vocoder.config import VocoderConfig


class VocoderServicer(vocoder_pb2_grpc.VocoderServicer):
    async def Decode(self, request_iterator, context):
        raise NotImplementedYet("decoding is not available: the codec decoder is not built yet")
        yield  # pragma: no cover - makes this an async generator, as the contract streams

    async def Encode(self, request, context):
        raise NotImplementedYet("encoding is not available: the codec encoder is not built yet")

    async def GetLoad(self, request, context):
        return common_pb2.LoadReport()


class VocoderService(Service):
    name = "vocoder"
    grpc_services = ("chorus.v1.Vocoder",)

    def __init__(self, config: VocoderConfig) -> None:
        self.config = config

    def register(self, server: grpc.aio.Server) -> None:
        vocoder_pb2_grpc.add_VocoderServicer_to_server(VocoderServicer(), server)
