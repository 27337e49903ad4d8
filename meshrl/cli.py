"""The meshrl command: train | plan | profile | bench | check | generate.

Each subcommand lives in meshrl/commands/<name>.py with add_parser(subparsers) and run(args) -> int;
they are imported only when chosen, so meshrl plan never imports torch distributed code it does not
need. Bad input raises UserError: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from . import __version__, interrupt
from .errors import UserError
from .cores import quiet_waits
from .host_memory import keep_freed_memory

COMMANDS = ("train", "plan", "profile", "bench", "check", "generate")


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="meshrl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"meshrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help="what to do (meshrl COMMAND --help)")
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
    for p in all_parsers(parser):
        plain_help(p)
    return parser, modules


def all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and every subcommand's parser below it."""
    out = [parser]
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for p in dict.fromkeys(a.choices.values()):  # a parser with aliases appears once
                out += all_parsers(p)
    return out


def plain(text: str | None) -> str | None:
    """Help text as a terminal shows it: docstrings' ``code`` and `code` marks dropped."""
    return None if text is None else re.sub(r"`{1,2}([^`]*)`{1,2}", r"\1", text)


def plain_help(p: argparse.ArgumentParser) -> None:
    """Strip the docstrings' reST marks from a parser's description, epilog and every help."""
    p.description, p.epilog = plain(p.description), plain(p.epilog)
    for a in p._actions:
        if a.help not in (None, argparse.SUPPRESS):
            a.help = plain(a.help)
        if isinstance(a, argparse._SubParsersAction):
            for c in a._choices_actions:
                c.help = plain(c.help)


def subcommand_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The deepest subcommand parser that ``argv`` names (for an error in its own usage)."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for i, word in enumerate(argv):
                if word in a.choices:
                    return subcommand_parser(a.choices[word], argv[i + 1:])
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)

    quiet_waits()  # before anything loads torch's OpenMP runtime (meshrl/cores.py)
    keep_freed_memory()  # activations reuse freed pages instead of faulting in new ones (meshrl/host_memory.py)
    parser, modules = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # reported in the usage of the subcommand they were given to, not the top level
        subcommand_parser(parser, argv).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help()
        return 2
    previous = interrupt.install()  # one Ctrl-C stops a run even where Python would drop it
    try:
        return int(modules[args.command].run(args) or 0)
    except UserError as e:
        print(f"meshrl {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"meshrl {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        interrupt.restore(previous)


if __name__ == "__main__":
    sys.exit(main())
