"""An EnvFleet's ``environmentSelector``, resolved against its catalog's index.

The index is ``index.json`` as ``awm catalog export`` writes it next to the bundles
(``{"environments": [{"name": ...}, ...]}``): served at ``<catalog.url>/index.json``, or, for an
image catalog (whose files the operator cannot read), held in the ConfigMap
``catalog.indexConfigMap`` under the key ``index.json``. The operator re-reads it every
``REFRESH_S`` seconds, so a catalog that grows shows up in selector fleets without an edit.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from awm_operator.crds import CatalogSource
from awm_operator.kube import Kube

INDEX_FILE = "index.json"
REFRESH_S = 300.0
RETRY_S = 10.0  # after a failed read
MAX_INDEX_BYTES = 8 << 20  # about 50,000 environments; a larger answer is not an index
TIMEOUT_S = 30.0


def index_names(index: Any) -> list[str]:
    """Environment names of an index document (a clear error for anything else)."""
    entries = index.get("environments") if isinstance(index, dict) else None
    if not isinstance(entries, list):
        raise ValueError('not a catalog index: expected {"environments": [{"name": ...}, ...]}')
    names = [e.get("name") if isinstance(e, dict) else e for e in entries]
    if not all(isinstance(n, str) and n for n in names):
        raise ValueError("not a catalog index: every environment needs a name")
    return names


async def read_index(kube: Kube, http: aiohttp.ClientSession, namespace: str, catalog: CatalogSource) -> list[str]:
    """The catalog's environment names, from its URL or its index ConfigMap."""
    if catalog.url:
        url = f"{catalog.url.rstrip('/')}/{INDEX_FILE}"
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as r:
            if r.status != 200:
                raise ValueError(f"GET {url}: HTTP {r.status}")
            body = bytearray()
            while len(body) <= MAX_INDEX_BYTES and (chunk := await r.content.read(MAX_INDEX_BYTES + 1 - len(body))):
                body += chunk
            if len(body) > MAX_INDEX_BYTES:
                raise ValueError(f"GET {url}: the index is larger than {MAX_INDEX_BYTES >> 20} MiB")
            return index_names(json.loads(body))
    name = catalog.index_config_map
    if not name:
        raise ValueError("the catalog has no index (catalog.url or catalog.indexConfigMap)")
    cm = await kube.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
    text = (cm.get("data") or {}).get(INDEX_FILE)
    if text is None:
        raise ValueError(f"ConfigMap {name} has no key {INDEX_FILE}")
    return index_names(json.loads(text))
