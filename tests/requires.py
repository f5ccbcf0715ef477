"""What a test needs from the machine: skipped with the reason on a developer's machine that lacks it, a
failure under CI=true, where hack/install-test-deps.sh and ../shared provide everything."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(what: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what}: CI provides it (hack/install-test-deps.sh, ../shared)")
    pytest.skip(what)
