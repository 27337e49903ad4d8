"""The ``meshrl`` command: train | plan | profile | bench | check | generate.

Each subcommand lives in ``meshrl/commands/<name>.py`` with ``add_parser(subparsers)`` and
``run(args) -> int``; they are imported only when chosen, so ``meshrl plan`` never imports torch
distributed code it does not need. Bad input raises UserError: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import UserError

COMMANDS = ("train", "plan", "profile", "bench", "check", "generate")


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="meshrl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"meshrl.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"meshrl.commands.{name}":
                raise
            continue  # a command not built yet is simply absent from --help
        mod.add_parser(sub)
        modules[name] = mod
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(modules[args.command].run(args) or 0)
    except UserError as e:
        print(f"meshrl {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"meshrl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
