"""The talker process: gRPC glue between `Talker.Synthesize` and the talker engine."""

from __future__ import annotations

import grpc

from chorus.runtime.errors import NotImplementedYet
from chorus.runtime.host import Service
from chorus.talker.config import TalkerConfig
from chorus.v1 import common_pb2, talker_pb2_grpc


class TalkerServicer(talker_pb2_grpc.TalkerServicer):
    async def Synthesize(self, request_iterator, context):
        raise NotImplementedYet("speech synthesis is not available: the talker engine is not built yet")
        yield  # pragma: no cover - makes this an async generator, as the contract streams

    async def GetLoad(self, request, context):
        return common_pb2.LoadReport()

    async def ListVoices(self, request, context):
        raise NotImplementedYet("voices are not available: the talker engine is not built yet")


class TalkerService(Service):
    name = "talker"
    grpc_services = ("chorus.v1.Talker",)

    def __init__(self, config: TalkerConfig) -> None:
        self.config = config

    def register(self, server: grpc.aio.Server) -> None:
        talker_pb2_grpc.add_TalkerServicer_to_server(TalkerServicer(), server)
