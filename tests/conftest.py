"""Suite-wide pytest setup: the product's plugins are installed (cli/assembly.py); `slow` tests run only with
DEKUBE_SLOW=1; `netlab` tests need root."""
import os

import pytest

from cli.assembly import install_product

install_product()   # the product's roles, services and config sections, as the CLI installs them (ADR 0201)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("DEKUBE_SLOW") == "1":
        return
    skip_slow = pytest.mark.skip(reason="slow test: set DEKUBE_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
