"""The public gRPC API (`chorus.v1.Chorus`)."""

from __future__ import annotations

from chorus.runtime.errors import NotImplementedYet
from chorus.v1 import gateway_pb2_grpc

_NOT_YET = "not available yet: the gateway's orchestration is not built"


class ChorusServicer(gateway_pb2_grpc.ChorusServicer):
    async def Speak(self, request, context):
        raise NotImplementedYet(f"Speak is {_NOT_YET}")
        yield  # pragma: no cover - makes this an async generator, as the contract streams

    async def SpeakStream(self, request_iterator, context):
        raise NotImplementedYet(f"SpeakStream is {_NOT_YET}")
        yield  # pragma: no cover

    async def Resume(self, request, context):
        raise NotImplementedYet(f"Resume is {_NOT_YET}")
        yield  # pragma: no cover

    async def Generate(self, request, context):
        raise NotImplementedYet(f"Generate is {_NOT_YET}")
        yield  # pragma: no cover

    async def GetRequest(self, request, context):
        raise NotImplementedYet(f"GetRequest is {_NOT_YET}")

    async def Cancel(self, request, context):
        raise NotImplementedYet(f"Cancel is {_NOT_YET}")

    async def ListVoices(self, request, context):
        raise NotImplementedYet(f"ListVoices is {_NOT_YET}")
