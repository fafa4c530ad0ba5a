"""The `chorus` command and the gateway import no torch: building the command's parser reads every service's config
(the speech service's too), and only a model service's own process loads the models' libraries. With them, each
gateway worker and every `chorus say` / `chorus bench` started seconds later and held ~320 MiB more."""

import subprocess
import sys

HEAVY = ("torch", "transformers", "diffusers")


def test_the_command_line_and_the_gateway_import_no_model_library():
    script = (
        "import sys\n"
        "from chorus.cli import build_parser\n"
        "build_parser().parse_args(['serve', 'gateway'])\n"
        "import chorus.gateway.service, chorus.gateway.workers, chorus.bench.cli, chorus.client.commands\n"
        f"print(sorted(name for name in {HEAVY!r} if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_the_speech_service_still_names_both_of_its_grpc_services(monkeypatch):
    from chorus.speech import SpeechConfig, SpeechService

    for backend in ("TALKER", "VOCODER"):
        monkeypatch.setenv(f"CHORUS_{backend}_DEVICE", "cpu")
    service = SpeechService(SpeechConfig())
    assert service.grpc_services == ("chorus.v1.Talker", "chorus.v1.Vocoder")
