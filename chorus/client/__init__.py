"""Python client for a Chorus gateway: `Client` / `AsyncClient` (REST) and `GrpcClient` / `AsyncGrpcClient`."""

from chorus.client.errors import APIError, ChorusError, GatewayUnreachable
from chorus.client.grpc_client import AsyncGrpcClient, GrpcClient
from chorus.client.rest import AsyncClient, Client

__all__ = ["APIError", "AsyncClient", "AsyncGrpcClient", "ChorusError", "Client", "GatewayUnreachable", "GrpcClient"]
