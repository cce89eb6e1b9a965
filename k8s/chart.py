"""Install charts/awm on a harness cluster with locally built images (images/build.py).

Shared by the real-node tests (tests/test_realnode.py) and benchmark (bench/realnode.py) so both
install the chart the same way: the images as built (pullPolicy Never: they were imported into
the node's containerd), Postgres without a volume (the harness has no storage provisioner), small
resource requests (a test node has two cores), and the NetworkPolicies on, with the node's DNS as
their DNS peer (the node enforces them: k8s/node.py runs kube-router's policy controller).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

CHART = Path(__file__).resolve().parent.parent / "charts" / "awm"
COMPONENTS = ("operator", "envserver", "catalog", "postgres")  # chart value key == image name
# Campaign Jobs' images, set when built (images/build.py name -> chart value key).
JOB_IMAGES = {"trainer": "trainer.image", "trainer-eval": "trainer.evalImage"}
SMALL = ("postgres.persistence.enabled=false",
         "postgres.resources.requests.cpu=100m", "postgres.resources.requests.memory=128Mi",
         "operator.resources.requests.cpu=50m", "operator.resources.requests.memory=128Mi",
         "envserver.resources.requests.cpu=10m", "envserver.resources.requests.memory=64Mi")


def image_sets(refs: dict[str, str]) -> list[str]:
    """--set values pointing the chart's components at image refs (``name -> repo:tag``), and
    the Campaign Jobs' images among them."""
    keys = {c: f"{c}.image" for c in COMPONENTS} | {n: k for n, k in JOB_IMAGES.items() if n in refs}
    out = []
    for name, key in keys.items():
        repo, tag = refs[name].rsplit(":", 1)
        out += [f"{key}.repository={repo}", f"{key}.tag={tag}", f"{key}.pullPolicy=Never"]
    return out


def network_policy_sets(node_ip: str) -> list[str]:
    """--set values for the NetworkPolicies on a harness real node. Its cluster DNS is CoreDNS as
    a host process on the node address (the kubelet's clusterDNS), not a kube-dns pod the chart's
    default DNS peer selects: the env pods' DNS egress goes to that address instead."""
    return ["networkPolicy.enabled=true",
            "networkPolicy.dns.namespaceSelector=null", "networkPolicy.dns.podSelector=null",
            f"networkPolicy.dns.ipBlock.cidr={node_ip}/32"]


def helm_install(cp: Any, refs: dict[str, str], *, release: str = "awm", namespace: str = "awm",
                 sets: tuple[str, ...] = (), timeout: str = "5m", upgrade: bool = False) -> subprocess.CompletedProcess:
    """`helm install --wait` of the chart on a harness with a real node (``cp.node``), or with
    ``upgrade`` a `helm upgrade --wait` of the installed release to the same values plus ``sets``
    (not --reuse-values: the nulls that remove the DNS peer's selectors would be kept as nulls,
    which the schema refuses); the result (check returncode: the caller reports)."""
    args = [*SMALL, *image_sets(refs), *network_policy_sets(cp.node.ip), *sets]
    verb = ["upgrade"] if upgrade else ["install", "--create-namespace"]
    return subprocess.run([cp.bin("helm"), *verb, release, str(CHART), "--namespace", namespace,
                           "--wait", "--timeout", timeout, *[a for s in args for a in ("--set", s)]],
                          capture_output=True, text=True, env=cp.env())
