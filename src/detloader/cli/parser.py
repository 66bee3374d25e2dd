"""The ``detloader`` parser: one sub-parser per command module, and ``main`` (exit status)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from detloader import __version__

__all__ = ["COMMANDS", "build_parser", "main"]

#: Sub-command modules, in the order ``--help`` lists them.
COMMANDS = ("demo", "synth", "index", "validate", "convert", "show", "tune", "stats", "train", "evaluate", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="detloader",
        description="Detection + landmark + classification data pipeline for PyTorch.",
    )
    parser.add_argument("--version", action="version", version=f"detloader {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"detloader.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, KeyError) as err:
        # bad input or arguments: one clear line, no traceback
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"detloader {args.command}: error: {message}", file=sys.stderr)
        return 2
