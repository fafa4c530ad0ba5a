"""Generated documentation stays in step with the code."""

from pathlib import Path

from chorus.cli import config_reference

ROOT = Path(__file__).resolve().parents[1]


def test_configuration_reference_is_current():
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert text.endswith(config_reference()), "docs/configuration.md is stale: run `make docs`"
