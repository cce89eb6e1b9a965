"""The few Kubernetes API calls the operator makes itself (kopf does the watching).

A thin layer over ``kubernetes_asyncio``'s ``ApiClient`` (its authentication, TLS and token
refresh) that sends and returns plain dicts: the generated model classes cost more CPU than the
whole allocation on a 1,024-pod fleet, and the operator only ever needs a few fields.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from awm_operator.crds import GROUP, VERSION, ObjectStatus

MERGE = "application/merge-patch+json"
LIST_PAGE = 500  # items per page of a LIST (the API server's own clients use 500)
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"  # a LIST of metadata only


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        try:
            message = json.loads(body).get("message", body)
        except ValueError:
            message = body
        super().__init__(f"HTTP {status}: {message}")
        self.status = status

    @property
    def lost_race(self) -> bool:
        """A precondition failed (JSON-patch ``test``, resourceVersion) or the object is gone."""
        return self.status in (404, 409, 422)


async def load_configuration(kubeconfig: str | None = None) -> k8s.Configuration:
    """The service account in a pod; else ``kubeconfig``, $KUBECONFIG or ~/.kube/config."""
    configuration = k8s.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s_config.load_incluster_config(client_configuration=configuration)
    else:
        path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        await k8s_config.load_kube_config(config_file=path, client_configuration=configuration,
                                          persist_config=False)
    return configuration


PROXY_VARIABLES = ("https_proxy", "http_proxy", "all_proxy", "ws_proxy", "wss_proxy")


def skip_env_lookups(api: k8s.ApiClient, environ: Mapping[str, str]) -> bool:
    """kubernetes_asyncio's HTTP session trusts the environment, so aiohttp hands every request
    twice to a thread (a ~/.netrc lookup, then the proxy variables): at a few hundred API requests
    a second that was a fifth of the operator's CPU (py-spy, bench/fleet.py at 4,096 instances).
    Where neither exists, nothing is lost by not looking; True if the lookups were turned off."""
    names = {k.lower() for k, v in environ.items() if v}
    netrc = Path(environ.get("NETRC") or Path(environ.get("HOME") or "~").expanduser() / ".netrc")
    if names & set(PROXY_VARIABLES) or netrc.exists():
        return False
    api.rest_client.pool_manager._trust_env = False  # noqa: SLF001 - aiohttp has no setter
    return True


class Kube:
    def __init__(self, api: k8s.ApiClient) -> None:
        self.api = api

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> "Kube":
        configuration = await load_configuration(kubeconfig)
        configuration.connection_pool_maxsize = 256
        api = k8s.ApiClient(configuration)
        skip_env_lookups(api, os.environ)
        return cls(api)

    async def close(self) -> None:
        await self.api.close()

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                      query: list[tuple[str, str]] | None = None, timeout: float = 30.0,
                      accept: str = "application/json") -> dict[str, Any]:
        response = await self.api.call_api(
            path, method, query_params=query or [], body=body,
            header_params={"Accept": accept, "Content-Type": content_type},
            auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout)
        try:
            data = await response.read()
        finally:
            response.release()
        if not 200 <= response.status < 300:
            raise ApiError(response.status, data.decode(errors="replace"))
        return json.loads(data) if data else {}

    # ---- pods
    async def create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)

    async def delete_pod(self, namespace: str, name: str, resource_version: int | None = None) -> bool:
        """False if it was already gone; HTTP 409 if ``resource_version`` is not the current one."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if resource_version:
            body["preconditions"] = {"resourceVersion": str(resource_version)}
        try:
            await self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body)
            return True
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise

    async def list_pages(self, path: str, query: list[tuple[str, str]], limit: int = LIST_PAGE,
                         timeout: float = 60.0, accept: str = "application/json") -> AsyncIterator[dict[str, Any]]:
        """A LIST in pages of ``limit`` items (``limit``/``continue``): at 4,096 pods one answer is
        ~45 MB of JSON (an env pod is 10.9 KB, half of it managedFields), which the API server would build whole and the operator decode whole (its
        peak memory); pages keep both to one page at a time. Every page is from the same snapshot;
        the first page's ``metadata.resourceVersion`` is where a watch resumes."""
        token = ""
        while True:
            page = await self.request("GET", path, query=[*query, ("limit", str(limit))]
                                      + ([("continue", token)] if token else []), timeout=timeout, accept=accept)
            yield page
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return

    async def list_pod_metadata(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The pods' metadata only (``PartialObjectMetadataList``: names, owners, deletion marks):
        deleting a fleet polls its pods until they are gone, and their specs and statuses (about
        half of a pod; managedFields, in the metadata, is most of the rest) were decoded for
        nothing - at 1,024 pods every half second, a burst of ~200k objects that the garbage
        collector walked again and again."""
        pods: list[dict[str, Any]] = []
        async for page in self.list_pages(f"/api/v1/namespaces/{namespace}/pods", [("labelSelector", label_selector)],
                                          accept=METADATA_LIST):
            pods += page.get("items") or []
        return pods

    async def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        """A Secret's data, decoded."""
        data = await self.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        return {k: base64.b64decode(v).decode() for k, v in (data.get("data") or {}).items()}

    # ---- our resources
    def _path(self, plural: str, namespace: str, name: str) -> str:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}/{name}"

    async def patch_status(self, plural: str, namespace: str, name: str, status: ObjectStatus) -> dict[str, Any]:
        """Merge the fields set in ``status`` (a kind's typed status) into the object's status."""
        return await self.request("PATCH", self._path(plural, namespace, name) + "/status",
                                  {"status": status.patch()}, MERGE)

    async def patch_spec(self, plural: str, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return await self.request("PATCH", self._path(plural, namespace, name), {"spec": spec}, MERGE)

    async def get_object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", self._path(plural, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
