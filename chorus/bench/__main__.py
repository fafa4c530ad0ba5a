"""`python -m chorus.bench tts …` (the same as `chorus bench tts …`)."""

import argparse
import sys

from chorus.bench.cli import register

parser = argparse.ArgumentParser(prog="python -m chorus.bench")
register(parser.add_subparsers(dest="command", required=True))
arguments = parser.parse_args()
sys.exit(arguments.handler(arguments))
