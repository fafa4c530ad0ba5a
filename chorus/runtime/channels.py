"""gRPC options shared by every server and client: bounded messages and keepalive on both sides."""

from __future__ import annotations

import grpc

KEEPALIVE_OPTIONS = (
    # Ping idle connections so a vanished peer (a killed pod, a dropped NAT entry) is noticed in
    # seconds rather than at the next write, which frees its streams and GPU slots.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
)


def grpc_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        *KEEPALIVE_OPTIONS,
    ]


# Servers close each connection after a few minutes (in-flight streams keep up to an hour to finish
# on it), so clients re-resolve DNS and spread over replicas added by a scale-up.
SERVER_CONNECTION_OPTIONS = (
    ("grpc.max_connection_age_ms", 5 * 60_000),
    ("grpc.max_connection_age_grace_ms", 60 * 60_000),
)


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [*grpc_options(max_message_bytes), *SERVER_CONNECTION_OPTIONS]


# gRPC's reconnect backoff grows to 120 s while a peer is down, so a backend back after a long outage (a crash,
# a model reload, a restarted pod) would wait up to two minutes for the next connection attempt. Capped at 1 s,
# the gateway's health check sees it serve again within about a second, for one refused connect a second meanwhile.
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def open_channel(target: str, max_message_bytes: int = 16 * 1024 * 1024) -> grpc.aio.Channel:
    """An insecure channel to another Chorus process (traffic stays inside the deployment)."""
    return grpc.aio.insecure_channel(target, options=[*grpc_options(max_message_bytes), *RECONNECT_OPTIONS])
