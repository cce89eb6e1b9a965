"""A real Prometheus server scrapes an instance's /metrics and answers queries about it.

CI installs Prometheus from Debian's packages (.ci/run); elsewhere the test is skipped when the
binary is missing, except under CI=true where a missing Prometheus is a failure."""

import asyncio
import shutil
import socket
import subprocess
from urllib.parse import urlparse

import httpx
import pytest

from awm.client import ControlClient, McpSession
from tests.conftest import require

PROMETHEUS = shutil.which("prometheus")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def prometheus_bin():
    require(PROMETHEUS is not None, "prometheus is not installed (.ci/run installs it from Debian's packages)")
    return PROMETHEUS


def start_prometheus(prometheus_bin: str, control_url: str, tmp_path) -> tuple[subprocess.Popen, int]:
    """A Prometheus scraping one instance's /metrics every second (job "awm"); its port."""
    target = urlparse(control_url).netloc
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: awm\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n")
    port = _free_port()
    proc = subprocess.Popen([prometheus_bin, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


async def test_prometheus_scrapes_an_instance(prometheus_bin, notes, tmp_path):
    proc, port = start_prometheus(prometheus_bin, notes.control_url, tmp_path)
    control = ControlClient(notes.control_url)
    try:
        await control.reset("add_note")
        async with McpSession(notes.mcp_url) as mcp:
            for _ in range(3):
                await mcp.call_tool("list_notes", {})
        await control.verify(None)
        query = 'sum(awm_tool_calls_total{job="awm",tool="list_notes",outcome="ok"})'
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as api:
            value = None
            for _ in range(120):
                await asyncio.sleep(0.25)
                try:
                    data = (await api.get("/api/v1/query", params={"query": query})).json()
                except httpx.HTTPError:
                    continue
                if data.get("status") == "success" and data["data"]["result"]:
                    value = float(data["data"]["result"][0]["value"][1])
                    break
            assert value is not None and value >= 3
            up = (await api.get("/api/v1/query", params={"query": 'up{job="awm"}'})).json()
            assert up["data"]["result"][0]["value"][1] == "1"
            resets = (await api.get("/api/v1/query",
                                    params={"query": 'awm_reset_seconds_count{job="awm"}'})).json()
            assert resets["data"]["result"]
    finally:
        await control.close()
        proc.terminate()
        proc.wait(10)
