"""Fixtures for the node agent integration tests: a fake kubelet on short-lived unix sockets."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from .agent_fake_kubelet import FakeKubelet


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # unix socket paths are limited to 108 bytes, so stay out of pytest's long tmp_path
    d = Path(tempfile.mkdtemp(prefix="tsa-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[FakeKubelet]:
    k = FakeKubelet(plugin_dir)
    await k.start()
    yield k
    await k.stop()
