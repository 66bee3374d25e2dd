"""The ``detloader`` command: one sub-command per module in this package.

Each sub-command module defines ``register(subparsers)``, which adds its parser and sets
``func`` (``func(args) -> int`` exit status). Library code stays quiet; the CLI prints.
"""

from detloader.cli.parser import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]
