"""The command-line tools an admin types, as the tests run them: the Helm 4 CLI and kubectl, built from
their Go modules by `hack/cli-assets.sh` (hack/cli/go.mod: helm.sh/helm/v4 and k8s.io/kubectl of the
control plane's release), run from the repository root with the cluster's kubeconfig in `KUBECONFIG`, so
relative paths (`charts/tessera`, `examples/`) are the ones the docs give.

`TESSERA_CLI_DIR` names a directory holding `helm` and `kubectl` (hack/test.sh sets it); otherwise the
script is run, which answers from its cache under ~/.cache/tessera once built. Without Go or the binaries
the tests skip with the reason, except under CI=true.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .controlplane import ROOT, go_assets

TOOLS = ("helm", "kubectl")


def find_cli() -> Path:
    """The directory holding `helm` and `kubectl`, built on first use; NoBinaries saying what is missing."""
    return go_assets("TESSERA_CLI_DIR", "cli-assets.sh", "Helm CLI", TOOLS)


@dataclass
class AdminCLI:
    """`helm` and `kubectl` against one cluster, each call a process as an admin's shell would run it.

    Helm's own state (config, cache, data) lives under `home`, not the user's ~/.config/helm."""

    bin: Path
    kubeconfig: Path
    home: Path

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }

    def run(
        self, tool: str, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        """One command; with `check`, a non-zero exit raises with what the tool printed."""
        proc = subprocess.run(
            [str(self.bin / tool), *args],
            cwd=ROOT,
            env=self.env(),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{tool} {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def helm(
        self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        return self.run("helm", *args, check=check, stdin=stdin, timeout=timeout)

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        return self.run("kubectl", *args, check=check, stdin=stdin, timeout=timeout)
