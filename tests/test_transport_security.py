"""MCP transport security (DNS-rebinding protection) on both listeners of a real env server, and
the official MCP conformance suite run against a real instance.

A page on ``evil.example.com`` whose DNS name the attacker re-points at 127.0.0.1 makes the
victim's browser send ``Host: evil.example.com`` and ``Origin: http://evil.example.com``: such a
request gets 421 (Host) or 403 (Origin) from the MCP endpoint and from the control API, and does
nothing. The names a deployment needs (a Service, a pod IP, a browser UI) are accepted.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from awm.fleet import InstanceHandle
from tests import mcp_conformance
from tests.conftest import FIXTURES, require

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "transport-test", "version": "1"}}}
MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}

# The scenarios that apply to a server with only its environment's tools (the others call the
# suite's own fixture tools, prompts and resources). tools-call-simple-text and tools-call-error
# call tools we do not have: the call must come back as an isError result with a text, not a
# protocol error.
SCENARIOS = ["server-initialize", "ping", "logging-set-level", "tools-list", "tools-call-simple-text",
             "tools-call-error", "server-sse-multiple-streams", "resources-list", "prompts-list",
             "dns-rebinding-protection"]


def _post_initialize(url: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(url, json=INITIALIZE, headers={**MCP_HEADERS, **headers}, timeout=10)


def _netloc(url: str) -> str:
    return urlparse(url).netloc


# --------------------------------------------------------------------------- the official suite


@pytest.fixture(scope="module")
def conformance() -> None:
    """Node 22 and the suite, from the cache (.ci/run fills it; installed here if npm is around)."""
    error = ""
    if not mcp_conformance.installed():
        try:
            mcp_conformance.install()
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            error = str(exc)
    require(mcp_conformance.installed(),
            f"the MCP conformance suite is not installed in {mcp_conformance.cache_dir()}: {error}")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_official_conformance_scenario(conformance: None, notes: InstanceHandle, scenario: str,
                                       tmp_path: Path) -> None:
    code, checks, output = mcp_conformance.run_scenario(notes.mcp_url, scenario, tmp_path)
    assert checks, f"{scenario} recorded no checks:\n{output}"
    bad = [c for c in checks if c.get("status") not in ("SUCCESS", "INFO")]
    assert not bad and code == 0, f"{scenario}: {json.dumps(bad, indent=1)}\n{output}"
    assert any(c["status"] == "SUCCESS" for c in checks), output


# --------------------------------------------------------------------------- both listeners


def test_mcp_endpoint_refuses_a_rebound_host_or_origin(notes: InstanceHandle) -> None:
    own = _netloc(notes.mcp_url)
    port = own.rsplit(":", 1)[1]
    evil = _post_initialize(notes.mcp_url, {"Host": "evil.example.com", "Origin": "http://evil.example.com"})
    assert evil.status_code == 421, evil.text
    # The right Host with a foreign page's Origin: a browser on another site.
    assert _post_initialize(notes.mcp_url, {"Origin": "http://evil.example.com"}).status_code == 403
    assert _post_initialize(notes.mcp_url, {"Host": f"evil.example.com:{port}"}).status_code == 421
    # What clients really send: no Origin (not a browser), the same origin, a loopback page.
    assert _post_initialize(notes.mcp_url, {}).status_code == 200
    assert _post_initialize(notes.mcp_url, {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
                            ).status_code == 200
    assert _post_initialize(notes.mcp_url, {"Origin": "http://127.0.0.1:5173"}).status_code == 200


async def test_control_api_refuses_a_rebound_host_or_origin_and_does_nothing(notes: InstanceHandle) -> None:
    base = notes.control_url
    assert httpx.get(f"{base}/info", headers={"Host": "evil.example.com"}, timeout=10).status_code == 421
    async with httpx.AsyncClient(timeout=30) as client:
        episode = (await client.post(f"{base}/reset", json={"task_id": None})).json()["episode_id"]
        for headers in ({"Host": "evil.example.com"}, {"Origin": "http://evil.example.com"},
                        {"Host": "evil.example.com", "Origin": "http://evil.example.com"}):
            r = await client.post(f"{base}/reset", json={"task_id": None}, headers=headers)
            assert r.status_code in (403, 421), (headers, r.status_code, r.text)
            assert r.status_code == (421 if "Host" in headers else 403)
        # The refused resets did nothing: the episode is still the one we started.
        assert (await client.get(f"{base}/diff")).json()["episode_id"] == episode


# --------------------------------------------------------------------------- a served deployment


def _own_address() -> str | None:
    """This machine's address on its default route (no packet is sent), as a pod's IP stands in."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only the routing decision is made
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


def _pod_allowed_hosts(namespace: str) -> str:
    """The AWM_ALLOWED_HOSTS the operator gives an env pod in ``namespace``."""
    from awm_operator.config import OperatorConfig
    from awm_operator.crds import EnvFleetSpec
    from awm_operator.pods import pod_manifest

    spec = EnvFleetSpec.model_validate({"environments": ["notes"], "replicas": 1, "catalog": {},
                                        "database": {"secretName": "db"}})
    pod = pod_manifest("f", namespace, "uid", spec, "notes", OperatorConfig(release="r"))
    (server,) = pod["spec"]["containers"]
    return next(e["value"] for e in server["env"] if e["name"] == "AWM_ALLOWED_HOSTS")


def test_served_on_all_interfaces_answers_to_its_names_and_no_other(admin_dsn: str, tmp_path: Path) -> None:
    """`awm serve --host 0.0.0.0` as a pod runs it: reached by its own IP (a pod IP), by its
    hostname, by a Service name from AWM_ALLOWED_HOSTS (the operator's value), by a name given
    with --allowed-host; a browser UI named with --allowed-origin may call it. Nothing else."""
    address = _own_address()
    require(address, "this machine has no non-loopback IPv4 address to stand in for a pod IP")
    env = dict(os.environ, AWM_HOME=str(tmp_path / "home"), AWM_ALLOWED_HOSTS=_pod_allowed_hosts("team-a"))
    proc = subprocess.Popen([sys.executable, "-m", "awm.cli", "serve", "--json", "--host", "0.0.0.0",
                             "--catalog", str(FIXTURES / "notes"), "--database-url", admin_dsn,
                             "--allowed-host", "envs.example.internal", "--allowed-origin", "https://ui.example.com"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        served = json.loads(line)
        mcp_port = urlparse(served["mcp_url"]).port
        control_port = urlparse(served["control_url"]).port
        mcp = f"http://{address}:{mcp_port}/mcp"  # connect by the "pod IP", whatever the Host says
        control = f"http://{address}:{control_port}"
        for host in (address, socket.gethostname(), "notes-0.team-a.svc", "envs.team-a.svc.cluster.local",
                     "envs.example.internal"):
            assert _post_initialize(mcp, {"Host": f"{host}:{mcp_port}"}).status_code == 200, host
            assert httpx.get(f"{control}/info", headers={"Host": f"{host}:{control_port}"},
                             timeout=10).status_code == 200, host
        for host in ("evil.example.com", "envs.team-a.svc.evil.example.com", "envs.team-b.svc",
                     "x.envs.example.internal"):
            assert _post_initialize(mcp, {"Host": host}).status_code == 421, host
            assert httpx.get(f"{control}/info", headers={"Host": host}, timeout=10).status_code == 421, host
        assert _post_initialize(mcp, {"Origin": "https://ui.example.com"}).status_code == 200
        assert _post_initialize(mcp, {"Origin": "http://evil.example.com"}).status_code == 403
        assert httpx.post(f"{control}/reset", json={}, headers={"Origin": "https://ui.example.com"},
                          timeout=30).status_code == 200
        assert httpx.post(f"{control}/reset", json={}, headers={"Origin": "https://evil.example.com"},
                          timeout=30).status_code == 403
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert proc.returncode == 0, proc.stderr.read()
