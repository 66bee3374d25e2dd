"""The ``detloader`` command. ``parser`` holds the entry point; the sub-commands live by
concern: ``data`` (synth, index, validate, split, convert, show), ``stats``, ``speed`` (tune,
bench), ``train`` (train, evaluate), ``demo``, ``cache`` (cache list, cache clear); ``_common``
is what they share (dataset options, progress bars, tables on a terminal or in a pipe, JSON),
``_class_rows`` the class tables, ``_store`` ``validate --store``. Each
``add_<command>(subparsers)`` adds its parser with ``func(args) -> int`` (the exit status).
Library code stays quiet; the CLI prints.
"""

from detloader.cli.parser import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]
