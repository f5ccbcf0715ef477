"""A real Prometheus server for tests: free loopback port, generated scrape config, query API client.

The binary comes from Debian's `prometheus` package (hack/install-test-deps.sh).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.ports import free_port

log = logging.getLogger(__name__)


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def promtool_binary() -> str | None:
    return shutil.which("promtool")


class PrometheusError(RuntimeError):
    pass


class PrometheusServer:
    """One Prometheus process scraping `targets` (job name -> ["host:port", ...]) every `scrape_interval`."""

    def __init__(
        self,
        binary: str,
        workdir: Path,
        targets: Mapping[str, Sequence[str]],
        *,
        scrape_interval: str = "1s",
        storage_path: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        """`storage_path`: serve an existing TSDB (e.g. one backfilled by promtool) instead of a fresh one;
        `extra_args`: more flags, such as `--storage.tsdb.retention.time` or `--query.lookback-delta`."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets = {job: list(hosts) for job, hosts in targets.items()}
        config = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "scrape_configs": [
                # honor_labels as the chart's ServiceMonitors set: the exporters' namespace/pod labels win.
                {"job_name": job, "honor_labels": True, "static_configs": [{"targets": hosts}]}
                for job, hosts in self.targets.items()
            ],
        }
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={storage_path or workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
                *extra_args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PrometheusError(
                    f"prometheus exited with {self.process.returncode}: {self.log_path.read_text()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.1)
        raise PrometheusError(f"prometheus not ready after {timeout_s}s: {self.log_path.read_text()}")

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query (at Unix time `at`, default now); returns the `result` list (vector samples, or one
        scalar wrapped as a sample)."""
        params = urllib.parse.urlencode(
            {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        )
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query?{params}", timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as err:
            body = json.load(err)
            raise PrometheusError(
                f"query failed ({body.get('errorType')}): {body.get('error')}: {expr}"
            ) from err
        data = body["data"]
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str) -> list[str]:
        """Every value Prometheus has stored for `label` (`__name__`: every series name scraped)."""
        with urllib.request.urlopen(f"{self.url}/api/v1/label/{label}/values", timeout=10) as resp:
            values: list[str] = json.load(resp)["data"]
        return values

    def wait_for(self, expr: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Poll `expr` until it returns data."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result:
                return result
            time.sleep(0.25)
        raise PrometheusError(f"no data for {expr!r} after {timeout_s}s; targets: {self.query('up')}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
