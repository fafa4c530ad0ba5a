#!/usr/bin/env python3
"""Container healthcheck: asks a gRPC server's grpc.health.v1 service whether it is SERVING.

Docker has no native gRPC healthcheck, so the images carry this script as `chorus-health-probe`.
It needs only grpcio and grpcio-health-checking (no torch, no chorus import), so a probe costs a
fraction of a second even while the model is warming up next to it.

    chorus-health-probe --address 127.0.0.1:50051 --service chorus.v1.Talker

Exit status: 0 SERVING, 1 anything else (NOT_SERVING, unknown service, unreachable, timeout),
2 bad arguments. Defaults come from CHORUS_PROBE_ADDRESS / CHORUS_PROBE_SERVICE so an image
can bake a HEALTHCHECK and each container only sets those two variables.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

EXIT_SERVING = 0
EXIT_UNHEALTHY = 1


def check(address: str, service: str, timeout_s: float) -> tuple[int, str]:
    """One Health.Check call; returns (exit status, one-line reason)."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError as exc:
            return EXIT_UNHEALTHY, f"{exc.code().name}: {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    is_serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    return (EXIT_SERVING if is_serving else EXIT_UNHEALTHY), status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chorus-health-probe", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--address",
        default=os.environ.get("CHORUS_PROBE_ADDRESS", "127.0.0.1:50050"),
        help="host:port of the gRPC server [env CHORUS_PROBE_ADDRESS; default %(default)s]",
    )
    parser.add_argument(
        "--service",
        default=os.environ.get("CHORUS_PROBE_SERVICE", ""),
        help="service name to ask about, '' for the whole server [env CHORUS_PROBE_SERVICE]",
    )
    parser.add_argument("--timeout-s", type=float, default=3.0, help="deadline of the call in seconds")
    args = parser.parse_args(argv)
    if args.timeout_s <= 0:
        parser.error("--timeout-s must be positive")
    code, reason = check(args.address, args.service, args.timeout_s)
    label = args.service or "<server>"
    print(f"{args.address} {label}: {reason}", file=sys.stdout if code == EXIT_SERVING else sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
