"""Lint the Dockerfile with Docker's own parser (PyPI `dockerfile`) plus the project's rules.

No Docker engine runs in CI, so the build itself is checked by building the wheel from exactly the files
the Dockerfile copies.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import dockerfile
import pytest

ROOT = Path(__file__).resolve().parents[3]
COMMANDS = dockerfile.parse_file(str(ROOT / "Dockerfile"))
# What the image needs to `pip install .`; nothing else of the repository goes into it.
ALLOWED_SOURCES = {"pyproject.toml", "README.md", "operator/", "device-plugin/"}


def _stages() -> list[list[dockerfile.Command]]:
    stages: list[list[dockerfile.Command]] = []
    for cmd in COMMANDS:
        if cmd.cmd == "FROM":
            stages.append([])
        stages[-1].append(cmd)
    return stages


def test_base_images_are_pinned_slim_python() -> None:
    for stage in _stages():
        image = stage[0].value[0]
        name, _, tag = image.partition(":")
        assert tag and tag != "latest", f"line {stage[0].start_line}: pin the base image tag ({image})"
        assert re.match(r"^3\.11\.\d+-slim", tag), (
            f"line {stage[0].start_line}: use python:3.11.x-slim ({image})"
        )
        assert name == "python"


def test_final_stage_runs_as_non_root() -> None:
    final = _stages()[-1]
    users = [c for c in final if c.cmd == "USER"]
    assert users, "the runtime stage must set USER"
    user = users[-1].value[0].split(":")[0]
    assert user not in ("0", "root"), f"line {users[-1].start_line}: run as a non-root user"
    # The USER must come after every RUN of the final stage, or later RUNs run as that user and fail.
    last_run = max((c.start_line for c in final if c.cmd == "RUN"), default=0)
    assert users[-1].start_line > last_run


def test_no_add_and_no_remote_sources() -> None:
    for cmd in COMMANDS:
        assert cmd.cmd != "ADD", f"line {cmd.start_line}: use COPY (ADD fetches URLs and unpacks archives)"
        if cmd.cmd == "COPY":
            assert not any(v.startswith(("http://", "https://")) for v in cmd.value)


def test_copy_only_what_the_build_needs() -> None:
    for cmd in COMMANDS:
        if cmd.cmd != "COPY" or any(f.startswith("--from") for f in cmd.flags):
            continue
        sources = cmd.value[:-1]
        for src in sources:
            assert src in ALLOWED_SOURCES, f"line {cmd.start_line}: COPY {src} is not needed by the image"
            assert (ROOT / src).exists(), f"line {cmd.start_line}: COPY {src} does not exist"


def test_healthcheck_is_declared() -> None:
    checks = [c for c in COMMANDS if c.cmd == "HEALTHCHECK"]
    assert checks, "declare HEALTHCHECK (or HEALTHCHECK NONE with the reason)"
    if checks[-1].value[0] == "NONE":
        lines = (ROOT / "Dockerfile").read_text().splitlines()
        assert lines[checks[-1].start_line - 2].startswith("#"), "say why there is no health check"


def test_cmd_is_exec_form_and_entrypoints_exist() -> None:
    cmds = [c for c in COMMANDS if c.cmd == "CMD"]
    assert cmds and cmds[-1].json, "CMD in exec (JSON) form so signals reach the process"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"tessera", "tessera-agent"} <= set(scripts)
    assert cmds[-1].value[0] in scripts


def test_no_package_manager_caches_or_unpinned_upgrades() -> None:
    for cmd in COMMANDS:
        if cmd.cmd != "RUN":
            continue
        text = " ".join(cmd.value)
        assert "--upgrade pip" not in text, f"line {cmd.start_line}: unpinned pip upgrade"
        if "apt-get install" in text:
            assert "--no-install-recommends" in text and "rm -rf /var/lib/apt/lists" in text
    env = " ".join(" ".join(c.value) for c in COMMANDS if c.cmd == "ENV")
    assert "PIP_NO_CACHE_DIR" in env


def test_dockerignore_admits_exactly_the_copied_paths() -> None:
    lines = [ln for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == "**", "start from an empty context and admit paths one by one"
    admitted = {ln[1:] for ln in lines if ln.startswith("!")}
    assert admitted == ALLOWED_SOURCES


@pytest.mark.slow
def test_package_builds_from_the_copied_files_alone(tmp_path: Path) -> None:
    # The Dockerfile's build stage sees only ALLOWED_SOURCES; build the wheel from such a copy.
    context = tmp_path / "context"
    context.mkdir()
    for src in ALLOWED_SOURCES:
        subprocess.run(["cp", "-r", str(ROOT / src.rstrip("/")), str(context)], check=True)
    subprocess.run(
        ["find", str(context), "-name", "__pycache__", "-prune", "-exec", "rm", "-rf", "{}", "+"], check=True
    )
    out = tmp_path / "wheel"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(context),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("tessera-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "tessera/cli.py" in names and "tessera_agent/cli.py" in names
    assert "tessera/api/metrics_catalog.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "tessera = tessera.cli:main" in text and "tessera-agent = tessera_agent.cli:main" in text
