"""Suite-wide pytest setup: `slow` tests run only with DEKUBE_SLOW=1; `netlab` tests need root."""
import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("DEKUBE_SLOW") == "1":
        return
    skip_slow = pytest.mark.skip(reason="slow test: set DEKUBE_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
