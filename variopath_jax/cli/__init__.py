"""The ``variopath`` command line. Every command takes ``--json`` and then prints exactly one JSON
document on stdout (human-readable tables otherwise); errors go to stderr with exit status 2.
Long work reports its progress on stderr (``--progress`` / ``--no-progress``; by default when
stderr is a terminal and ``--json`` is off).

Each command group is a module that registers its own subcommands: ``topo``, ``catalog``,
``run`` (run, plan, simulate), ``demo``, ``gap``, ``profile``, ``info`` here and ``bench`` in
:mod:`variopath_jax.bench.command`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from variopath_jax import progress
from variopath_jax.bench.command import add_bench_parser
from variopath_jax.cli import catalog, demo, gap, info, profile, run, topo
from variopath_jax.cli.common import command, parse_size
from variopath_jax.cli.limits import check_sizes
from variopath_jax.errors import VarioPathError

__all__ = ["build_parser", "main", "parse_size"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command, in the order ``variopath --help`` lists them."""
    parser = argparse.ArgumentParser(prog="variopath", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    topo.register(sub)
    catalog.register(sub)
    run.register(sub)
    demo.register(sub)
    gap.register(sub)
    add_bench_parser(sub, command)
    profile.register(sub)
    info.register(sub)
    return parser


def wants_progress(args: argparse.Namespace) -> bool:
    """``--progress`` / ``--no-progress`` when given, else: stderr is a terminal and no
    ``--json``."""
    if args.progress is not None:
        return args.progress
    return not args.json and sys.stderr.isatty()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    progress.configure(wants_progress(args))
    try:
        check_sizes(args)  # what the options alone rule out, before any command starts
        out = args.handler(args)
    except VarioPathError as err:
        if args.json:
            print(json.dumps({"error": str(err)}))
        print(f"variopath: error: {err}", file=sys.stderr)
        return 2
    finally:
        progress.configure(False)
    try:
        if args.json:
            json.dump(out, sys.stdout)
            sys.stdout.write("\n")
        elif args.human is not None:
            args.human(out)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
