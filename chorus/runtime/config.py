"""One frozen config dataclass per service; its CLI flags and env vars are derived from its fields.

Each knob is written once, as a dataclass field with a `help` text. `load_config` resolves every
field as: command-line flag > environment variable > default. For a field `max_batch_size` on a
config whose `env_prefix` is "CHORUS_TALKER_", the flag is `--max-batch-size` and the variable is
`CHORUS_TALKER_MAX_BATCH_SIZE`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeVar

C = TypeVar("C")


def option(default: Any, help: str, choices: Sequence[str] | None = None) -> Any:
    """A config field with its help text (and allowed values, for strings)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


@dataclasses.dataclass(frozen=True, slots=True)
class ServiceConfig:
    """Settings every Chorus process shares. Services subclass it and add their own fields."""

    env_prefix: ClassVar[str] = "CHORUS_"

    host: str = option("127.0.0.1", "Address the gRPC server binds to (0.0.0.0 in containers).")
    port: int = option(0, "gRPC port; 0 picks a free one.")
    metrics_port: int = option(0, "Prometheus /metrics HTTP port; 0 picks a free one, -1 disables it.")
    grace_s: float = option(10.0, "On SIGTERM, how long in-flight streams may run before they are cancelled.")
    log_level: str = option("info", "Log level.", choices=("debug", "info", "warning", "error"))
    log_format: str = option("text", "Log line format.", choices=("text", "json"))
    max_message_bytes: int = option(16 * 1024 * 1024, "Largest gRPC message accepted or sent.")


def flag_name(field: dataclasses.Field) -> str:
    return "--" + field.name.replace("_", "-")


def env_name(config_cls: type, field: dataclasses.Field) -> str:
    return config_cls.env_prefix + field.name.upper()


def to_environ(config: ServiceConfig) -> dict[str, str]:
    """The env vars from which `load_config` builds `config` again (for a child process that runs with it)."""

    def text(value: Any) -> str:
        if isinstance(value, tuple):
            return ",".join(value)
        return "none" if value is None else str(value)

    return {env_name(type(config), field): text(getattr(config, field.name)) for field in dataclasses.fields(config)}


def _field_types(config_cls: type) -> dict[str, Any]:
    return typing.get_type_hints(config_cls)


def _parse_value(raw: str, kind: Any, name: str) -> Any:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):  # Optional[X]
        if raw.strip().lower() in ("", "none"):
            return None
        (kind,) = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        origin = typing.get_origin(kind)
    if origin is tuple:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if kind is bool:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name}: expected true/false, got {raw!r}")
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name}: expected {kind.__name__}, got {raw!r}") from None


def add_arguments(parser: argparse.ArgumentParser, config_cls: type) -> None:
    """Adds one flag per config field; unset flags stay None so env vars and defaults can apply."""
    for field in dataclasses.fields(config_cls):
        help_text = f"{field.metadata.get('help', '')} [env {env_name(config_cls, field)}; default {field.default!r}]"
        parser.add_argument(
            flag_name(field),
            dest=field.name,
            default=None,
            metavar=field.name.upper(),
            choices=field.metadata.get("choices"),
            help=help_text.replace("%", "%%"),
        )


def load_config(
    config_cls: type[C], args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> C:
    """Builds the config from parsed flags, then env vars, then defaults; bad values raise ValueError."""
    environ = os.environ if environ is None else environ
    kinds = _field_types(config_cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(config_cls):
        raw = getattr(args, field.name, None) if args is not None else None
        source = flag_name(field)
        if raw is None:
            raw = environ.get(env_name(config_cls, field))
            source = env_name(config_cls, field)
        if raw is None:
            continue
        value = _parse_value(raw, kinds[field.name], source)
        choices = field.metadata.get("choices")
        if choices and value not in choices:
            raise ValueError(f"{source}: {value!r} is not one of {', '.join(choices)}")
        values[field.name] = value
    return config_cls(**values)


def describe(config_cls: type) -> list[dict[str, str]]:
    """Rows for the configuration reference: flag, env var, default, help."""
    return [
        {
            "flag": flag_name(field),
            "env": env_name(config_cls, field),
            "default": repr(field.default),
            "help": field.metadata.get("help", ""),
        }
        for field in dataclasses.fields(config_cls)
    ]
