"""The `iqgraph` command line."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the `iqgraph` command."""
    parser = argparse.ArgumentParser(prog="iqgraph", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run the demo: broker, generator, one node, GraphiQL")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the process exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        print("iqgraph demo: the streaming and GraphQL layers are not built yet; nothing to run.")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
