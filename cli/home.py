"""The node home directory: where it is (--home, $DEKUBE_HOME, ~/.dekube) and what lives in it."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from node.config import CONFIG_FILE_NAME
from node.keystore import KEY_FILE_NAME

HOME_ENV = "DEKUBE_HOME"


def default_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".dekube")


def add_home_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", type=Path, default=None,
                        help=f"node home directory (default: ${HOME_ENV} or ~/.dekube)")


def resolve_home(args: argparse.Namespace) -> Path:
    return (args.home or default_home()).expanduser()


def config_path(home: Path) -> Path:
    return home / CONFIG_FILE_NAME


def key_path(home: Path) -> Path:
    return home / KEY_FILE_NAME
