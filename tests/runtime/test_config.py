import argparse
import dataclasses
from typing import ClassVar

import pytest

from chorus.runtime.config import ServiceConfig, add_arguments, describe, load_config, option, to_environ


@dataclasses.dataclass(frozen=True, slots=True)
class ExampleConfig(ServiceConfig):
    env_prefix: ClassVar[str] = "CHORUS_EXAMPLE_"

    max_batch_size: int = option(8, "Most requests in one batch.")
    is_eager: bool = option(False, "Skip CUDA graphs.")
    targets: tuple[str, ...] = option(("a:1",), "Replicas.")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, ExampleConfig)
    return parser.parse_args(argv)


def test_defaults_when_nothing_is_set():
    config = load_config(ExampleConfig, parse([]), environ={})
    assert config == ExampleConfig()
    assert config.max_batch_size == 8 and config.grace_s == 10.0


def test_flag_beats_env_beats_default():
    environ = {"CHORUS_EXAMPLE_MAX_BATCH_SIZE": "16", "CHORUS_EXAMPLE_IS_EAGER": "yes"}
    from_env = load_config(ExampleConfig, parse([]), environ=environ)
    assert from_env.max_batch_size == 16 and from_env.is_eager is True
    from_flag = load_config(ExampleConfig, parse(["--max-batch-size", "32"]), environ=environ)
    assert from_flag.max_batch_size == 32


def test_tuples_split_on_commas():
    config = load_config(ExampleConfig, parse(["--targets", "h1:1, h2:2"]), environ={})
    assert config.targets == ("h1:1", "h2:2")


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"CHORUS_EXAMPLE_MAX_BATCH_SIZE": "many"}, "CHORUS_EXAMPLE_MAX_BATCH_SIZE: expected int"),
        ({"CHORUS_EXAMPLE_IS_EAGER": "perhaps"}, "CHORUS_EXAMPLE_IS_EAGER: expected true/false"),
        ({"CHORUS_EXAMPLE_LOG_LEVEL": "loud"}, "CHORUS_EXAMPLE_LOG_LEVEL: 'loud' is not one of"),
    ],
)
def test_bad_values_name_their_source(environ, message):
    with pytest.raises(ValueError, match=message):
        load_config(ExampleConfig, parse([]), environ=environ)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ExampleConfig().port = 1


def test_describe_lists_every_field_with_its_env_var():
    rows = {row["flag"]: row for row in describe(ExampleConfig)}
    assert rows["--max-batch-size"]["env"] == "CHORUS_EXAMPLE_MAX_BATCH_SIZE"
    assert set(rows) == {"--" + f.name.replace("_", "-") for f in dataclasses.fields(ExampleConfig)}


def test_to_environ_reads_back_as_the_same_config():
    """What a supervisor hands its child processes (gateway workers) is the config it resolved, whatever its source."""
    config = load_config(ExampleConfig, parse(["--targets", "h1:1,h2:2", "--is-eager", "true", "--port", "7"]), {})
    assert load_config(ExampleConfig, environ=to_environ(config)) == config
    assert load_config(ExampleConfig, environ=to_environ(ExampleConfig(targets=()))) == ExampleConfig(targets=())
