"""The diffusion process: gRPC glue between `Diffusion.Generate` and the diffusion engine."""

from __future__ import annotations

import grpc

from chorus.diffusion.config import DiffusionConfig
from chorus.runtime.errors import NotImplementedYet
from chorus.runtime.host import Service
from chorus.v1 import common_pb2, diffusion_pb2_grpc


class DiffusionServicer(diffusion_pb2_grpc.DiffusionServicer):
    async def Generate(self, request, context):
        raise NotImplementedYet("text-to-audio is not available: the diffusion engine is not built yet")
        yield  # pragma: no cover - makes this an async generator, as the contract streams

    async def GetLoad(self, request, context):
        return common_pb2.LoadReport()


class DiffusionService(Service):
    name = "diffusion"
    grpc_services = ("chorus.v1.Diffusion",)

    def __init__(self, config: DiffusionConfig) -> None:
        self.config = config

    def register(self, server: grpc.aio.Server) -> None:
        diffusion_pb2_grpc.add_DiffusionServicer_to_server(DiffusionServicer(), server)
