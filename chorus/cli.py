"""The `chorus` command."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from chorus.services import SERVICES


def _cmd_serve(args: argparse.Namespace) -> int:
    from chorus.runtime.config import load_config
    from chorus.runtime.host import run
    from chorus.runtime.logs import configure_logging

    entry = SERVICES[args.service]
    if args.service == "gateway" and "REDIS_URL" in os.environ:
        os.environ.setdefault("CHORUS_GATEWAY_REDIS_URL", os.environ["REDIS_URL"])
    try:
        config = load_config(entry.load_config_class(), args)
    except ValueError as exc:
        print(f"chorus serve {args.service}: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.service, config.log_level, config.log_format)
    if args.service == "gateway" and config.workers > 1:
        from chorus.gateway.workers import run_workers

        return run_workers(config)
    run(config, entry.load_service_class())
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    from chorus.stack import LocalStack, StackPorts
    from chorus.supervisor import RestartPolicy, describe_exit

    try:
        stack = LocalStack(
            StackPorts.choose(args.rest_port, args.grpc_port_base),
            redis_url=os.environ.get("REDIS_URL"),
            redis_dir=Path(args.redis_dir).expanduser(),
            log_format=args.log_format,
            grace_s=args.grace_s,
            speech_in_one_process=args.speech_in_one_process,
            restart_policy=RestartPolicy() if args.restart == "always" else None,
        )
    except ValueError as exc:
        print(f"chorus up: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    print("chorus up: starting redis, talker, vocoder, diffusion and gateway (tiny models by default)…", flush=True)
    try:
        stack.start()
        stack.wait_ready(
            args.timeout_s,
            on_ready=lambda name, s: print(f"  {name:<9} healthy after {s:.1f} s", flush=True),
            on_waiting=lambda pending, s: print(f"  waiting for {', '.join(pending)} ({s:.0f} s)", flush=True),
        )
    except (TimeoutError, RuntimeError) as exc:
        print(f"chorus up: {exc}; stopping", file=sys.stderr, flush=True)
        stack.stop()
        return 1
    ports = stack.ports
    redis_note = f"embedded, data in {stack.redis_dir}" if stack.redis else "from REDIS_URL"
    print(
        "\nChorus is up.\n"
        f"  REST API   http://127.0.0.1:{ports.rest}   (GET /ready, /health, /docs)\n"
        f"  gRPC API   127.0.0.1:{ports.grpc['gateway']}   (chorus.v1.Chorus; reflection on)\n"
        f"  talker     127.0.0.1:{stack.backend_port('talker')}\n"
        f"  vocoder    127.0.0.1:{stack.backend_port('vocoder')}\n"
        f"  diffusion  127.0.0.1:{ports.grpc['diffusion']}\n"
        f"  redis      {stack.redis_url}   ({redis_note})\n"
        "Press Ctrl-C to stop.",
        flush=True,
    )
    exited = None
    while not stop.wait(0.25):
        exited = stack.watch()
        if exited:
            print(f"chorus up: {exited[0]} {describe_exit(exited[1])}; stopping the stack", file=sys.stderr)
            break
    print("chorus up: stopping…", flush=True)
    codes = stack.stop()
    print("chorus up: stopped (" + ", ".join(f"{name} {code}" for name, code in codes.items()) + ")", flush=True)
    return 1 if exited else 0


def config_reference() -> str:
    """Markdown tables of every setting of every process, generated from the config dataclasses."""
    from chorus.runtime.config import describe

    sections = []
    for name, entry in SERVICES.items():
        rows = ["| flag | env var | default | meaning |", "|---|---|---|---|"]
        rows += [
            f"| `{row['flag']}` | `{row['env']}` | `{row['default']}` | {row['help']} |"
            for row in describe(entry.load_config_class())
        ]
        sections.append(f"#### `chorus serve {name}`\n\n" + "\n".join(rows))
    return "\n\n".join(sections) + "\n"


def _cmd_config(args: argparse.Namespace) -> int:
    print(config_reference(), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from chorus.supervisor import RestartPolicy

    parser = argparse.ArgumentParser(prog="chorus", description="Serve text-to-speech and text-to-audio models.")
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser("up", help="Start the whole stack locally (Redis, services, gateway).")
    up.add_argument("--rest-port", type=int, default=8000, help="REST API port (0 picks a free one).")
    up.add_argument(
        "--grpc-port-base",
        type=int,
        default=50050,
        help="gateway gRPC port; talker, vocoder, diffusion take the next three (0: free ports).",
    )
    up.add_argument(
        "--timeout-s",
        type=float,
        default=900.0,
        help="How long to wait for every service to be healthy (on a GPU the released models compile and capture "
        "their CUDA graphs first: 4.5–5.5 min on an H200). A service that exits fails the start at once.",
    )
    up.add_argument("--grace-s", type=float, default=10.0, help="Drain time for in-flight requests on stop.")
    up.add_argument(
        "--redis-dir",
        default=str(Path(os.environ.get("XDG_DATA_HOME") or "~/.local/share") / "chorus" / "redis"),
        help="Where the embedded Redis (used without REDIS_URL) keeps its append-only file: saved voices outlive a "
        "restart of the stack. Default: %(default)s.",
    )
    up.add_argument("--log-format", choices=("text", "json"), default="text")
    policy = RestartPolicy()
    up.add_argument(
        "--restart",
        choices=("always", "never"),
        default="always",
        help=f"Once the stack is up, restart a process that dies (Redis too), after {policy.initial_delay_s:g} s "
        f"doubling to {policy.max_delay_s:g} s (back to {policy.initial_delay_s:g} s after {policy.reset_after_s:g} s "
        "up); never: stop the whole stack instead.",
    )
    up.add_argument(
        "--speech-in-one-process",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Run talker and vocoder as one process (`chorus serve speech`), where their kernels interleave on one "
        "GPU; by default where the stack sees exactly one GPU and no CHORUS_<SERVICE>_GPU is set.",
    )
    up.set_defaults(handler=_cmd_up)

    config = commands.add_parser("config", help="Print the configuration reference (every flag and env var).")
    config.set_defaults(handler=_cmd_config)

    from chorus.bench.cli import register as register_bench
    from chorus.client.commands import register as register_user_commands

    register_bench(commands)
    register_user_commands(commands)

    serve = commands.add_parser("serve", help="Run one service (what a container runs).")
    services = serve.add_subparsers(dest="service", required=True)
    from chorus.runtime.config import add_arguments

    for name, entry in SERVICES.items():
        service_parser = services.add_parser(name, help=f"Run the {name}.")
        add_arguments(service_parser, entry.load_config_class())
    serve.set_defaults(handler=_cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
