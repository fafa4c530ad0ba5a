"""The user commands of `chorus`: say, gen, voices (ls, add, rm), status, resume — thin shells over
`chorus.client.Client`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from chorus.client.errors import ChorusError
from chorus.client.rest import Client


def _client(args: argparse.Namespace) -> Client:
    return Client(args.url, args.api_key)


def _format(args: argparse.Namespace) -> str:
    return args.format or (Path(args.output).suffix.lstrip(".") or "wav")


def say(args: argparse.Namespace) -> int:
    extensions = {"language": args.language, "seed": args.seed, "ref_text": args.ref_text}
    if args.ref_audio:
        import base64

        extensions["ref_audio"] = base64.b64encode(Path(args.ref_audio).read_bytes()).decode()
    with _client(args) as client, open(args.output, "wb") as out:
        args.voice = args.voice or (None if args.ref_audio else client.voices()["voices"][0])
        if not args.stream:
            out.write(client.speech(args.text, voice=args.voice, response_format=_format(args), **extensions))
        else:
            started = time.perf_counter()
            with client.stream_speech(args.text, voice=args.voice, response_format=_format(args), **extensions) as (
                stream,
                pieces,
            ):
                for index, piece in enumerate(pieces):
                    if index == 0:
                        print(f"first audio after {(time.perf_counter() - started) * 1000:.0f} ms", file=sys.stderr)
                    out.write(piece)
            print(f"request {stream.request_id}: {stream.bytes_received} bytes", file=sys.stderr)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def gen(args: argparse.Namespace) -> int:
    def progress(step: int, num_steps: int) -> None:
        filled = int(30 * step / max(num_steps, 1))
        print(f"\r[{'#' * filled}{'.' * (30 - filled)}] {step}/{num_steps}", end="", file=sys.stderr, flush=True)

    fields = {"duration_s": args.duration, "num_steps": args.steps, "seed": args.seed,
              "negative_prompt": args.negative_prompt}  # fmt: skip
    fields = {name: value for name, value in fields.items() if value is not None}
    with _client(args) as client:
        audio = client.generate(args.prompt, on_progress=progress, response_format=_format(args), **fields)
    Path(args.output).write_bytes(audio)
    print(f"\nwrote {args.output}", file=sys.stderr)
    return 0


def voices_ls(args: argparse.Namespace) -> int:
    """Every voice: the built-in speakers, then yours (all pages), with the talker's task types and languages."""
    with _client(args) as client:
        listing = client.voices()
        page = listing
        while page["has_more"]:
            page = client.voices(after=page["last_id"])
            listing["data"] += page["data"]
    listing |= {"has_more": False, "last_id": listing["data"][-1]["id"] if listing["data"] else None}
    print(json.dumps(listing, indent=2))
    return 0


def voices_add(args: argparse.Namespace) -> int:
    if (args.ref_audio is None) == (args.instructions is None):
        print("chorus voices add: give a reference audio file or --instructions (not both)", file=sys.stderr)
        return 2
    audio = Path(args.ref_audio).read_bytes() if args.ref_audio else None
    fields = {"ref_text": args.ref_text, "language": args.language, "x_vector_only": args.x_vector_only,
              "instructions": args.instructions}  # fmt: skip
    with _client(args) as client:
        voice = client.create_voice(args.name, audio, **fields)
    print(json.dumps(voice, indent=2))
    print(f"saved voice {voice['name']!r} ({voice['id']}): use it with --voice", file=sys.stderr)
    return 0


def voices_rm(args: argparse.Namespace) -> int:
    with _client(args) as client:
        deleted = client.delete_voice(args.name)
    print(f"deleted voice {args.name!r} ({deleted['id']})", file=sys.stderr)
    return 0


def status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        print(json.dumps(client.status(args.request_id), indent=2))
    return 0


def resume(args: argparse.Namespace) -> int:
    with _client(args) as client, open(args.output, "ab" if args.offset_bytes else "wb") as out:
        for piece in client.resume(args.request_id, args.offset_bytes):
            out.write(piece)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _guarded(command):
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except ChorusError as error:
            print(f"chorus {args.command}: {error}", file=sys.stderr)
            return 1

    return run


def register(commands: argparse._SubParsersAction) -> None:
    def add(name: str, help: str, handler, parent=commands, default=None) -> argparse.ArgumentParser:
        parser = parent.add_parser(name, help=help)
        parser.add_argument("--url", default=default, help="Gateway REST URL (default: $CHORUS_URL or :8000).")
        parser.add_argument("--api-key", default=default, help="Default: $CHORUS_API_KEY.")
        parser.set_defaults(handler=_guarded(handler))
        return parser

    p = add("say", "Text to speech into a file.", say)
    p.add_argument("text")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--voice", default=None)
    p.add_argument("--format", default=None, help="mp3, opus, aac, flac, wav, pcm (default: from -o's suffix)")
    p.add_argument("--language", default=None)
    p.add_argument("--ref-audio", default=None, help="An audio file to clone the voice of.")
    p.add_argument("--ref-text", default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stream", action="store_true", help="Write audio as it arrives; print time to first audio.")
    p = add("gen", "Text to audio into a file, with a progress bar.", gen)
    p.add_argument("prompt")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--format", default=None)
    p.add_argument("--duration", type=float, default=None, help="Seconds of audio.")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--negative-prompt", default=None)
    voices = add("voices", "List (the default), save and delete voices.", voices_ls)
    actions = voices.add_subparsers(dest="action", metavar="{ls,add,rm}")

    def add_action(name: str, help: str, handler) -> argparse.ArgumentParser:
        # SUPPRESS: an option left out after the action keeps what came before it (`chorus voices --url U ls`).
        return add(name, help, handler, actions, argparse.SUPPRESS)

    add_action("ls", "The built-in speakers and your saved voices, as JSON.", voices_ls)
    p = add_action("add", "Save a voice from a reference recording (or --instructions).", voices_add)
    p.add_argument("name")
    p.add_argument("ref_audio", nargs="?", help="An audio file of the voice (1 to 30 s is plenty).")
    p.add_argument("--ref-text", default=None, help="What the recording says: the voice then clones in context.")
    p.add_argument("--language", default=None, help="Default language of speech in this voice.")
    p.add_argument("--x-vector-only", action="store_true", help="Keep only the speaker embedding.")
    p.add_argument("--instructions", default=None, help="A designed voice: its description, without audio.")
    p = add_action("rm", "Delete one of your saved voices.", voices_rm)
    p.add_argument("name", help="Its name or id.")
    p = add("status", "A request's status, timings and usage.", status)
    p.add_argument("request_id")
    p = add("resume", "The rest of a cut speech stream, into a file.", resume)
    p.add_argument("request_id")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--offset-bytes", type=int, default=0, help="Bytes already received (appends to -o).")
