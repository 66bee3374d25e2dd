"""The ``detloader`` parser: one sub-parser per command module, and ``main`` (exit status)."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence

from detloader import __version__
from detloader.cli import cache, data, demo, speed, stats, train
from detloader.errors import LoaderWorkerError, NonFiniteError, RankLostError

#: Sub-commands in the order ``--help`` lists them, each added to the parser by its module's
#: ``add_<command>``.
_ADDERS = (
    demo.add_demo, data.add_synth, data.add_index, data.add_validate, data.add_split, data.add_convert,
    data.add_pack,
    data.add_show, speed.add_tune, stats.add_stats, train.add_train, train.add_evaluate, speed.add_bench,
    cache.add_cache,
)
COMMANDS = tuple(add.__name__.removeprefix("add_") for add in _ADDERS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="detloader", description="Detection + landmark + classification data pipeline for PyTorch."
    )
    parser.add_argument("--version", action="version", version=f"detloader {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in _ADDERS:
        add(sub)
    return parser


#: Exit status when the reader of stdout went away (``detloader validate DS | head -1``):
#: 128 + SIGPIPE, what a shell reports for a program that a closed pipe ended.
EXIT_CLOSED_PIPE = 141
#: Exit status when training stopped at a NaN or infinite loss or weights
#: (:class:`~detloader.errors.NonFiniteError`); the last checkpoint saved stays good.
EXIT_NON_FINITE = 3
#: Exit status when a loader worker died (:class:`~detloader.errors.LoaderWorkerError`: killed by
#: the out-of-memory killer, by SIGBUS for want of shared memory, ...); every worker is ended and
#: the last checkpoint saved is left as it was.
EXIT_WORKER_DIED = 4


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names; its exit status (README.md, "Exit status and problems").
    A reader of stdout that left early (``| head``) ends it with :data:`EXIT_CLOSED_PIPE`, no
    traceback."""
    try:
        try:
            return _run(build_parser().parse_args(argv))
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not in a message at exit
    except BrokenPipeError:
        # Python flushes stdout again at exit and would fail again: point it at devnull,
        # as the signal module's documentation advises
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # a stdout without a file descriptor
            pass
        return EXIT_CLOSED_PIPE


def _run(args: argparse.Namespace) -> int:
    previous = warnings.formatwarning  # one line per warning, without the library's source line
    warnings.formatwarning = lambda message, category, *_: f"detloader {args.command}: {category.__name__}: {message}\n"
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise
    except NonFiniteError as err:  # training diverged: its own status, one message, no traceback
        print(f"detloader {args.command}: error: {err}", file=sys.stderr)
        return EXIT_NON_FINITE
    except (LoaderWorkerError, RankLostError) as err:  # a worker or a rank died: its own status, one line
        print(f"detloader {args.command}: error: {err}", file=sys.stderr)
        return EXIT_WORKER_DIED
    except (ValueError, OSError, KeyError) as err:
        # bad input or arguments, a file that cannot be read or written: one clear line, no traceback
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"detloader {args.command}: error: {message}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = previous
