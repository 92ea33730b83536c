"""``DEKUBE_RPC``: the default of every ``--rpc`` option of the CLI.

``apply_rpc_default(parser, environ)`` walks the whole parser tree once it is built, so a
subcommand added later gets the variable without doing anything: when ``DEKUBE_RPC`` is set, each
``--rpc`` option defaults to it (a flag on the command line still wins) and its help says so.
"""
from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping

RPC_ENV = "DEKUBE_RPC"


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                yield from _parsers(sub)


def rpc_options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """Every ``--rpc`` option in ``parser`` and its subcommands."""
    for sub in _parsers(parser):
        for action in sub._actions:
            if "--rpc" in action.option_strings:
                yield action


def apply_rpc_default(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    url = (environ.get(RPC_ENV) or "").strip()
    for action in rpc_options(parser):
        if url:
            action.default = url
            action.help = f"{(action.help or '').split(' (default')[0]} (default ${RPC_ENV}: {url})"
        elif action.help and RPC_ENV not in action.help:
            action.help = action.help.rstrip(")") + (f"; or set ${RPC_ENV})" if action.help.endswith(")")
                                                     else f" (or set ${RPC_ENV})")
