"""A real Kubernetes control plane for tests, without Docker.

etcd + kube-apiserver + kube-controller-manager + kube-scheduler run as host processes on
127.0.0.1; kwok plays the kubelet for a few fake nodes (pods become Running, nothing is
executed). Binaries come from ``k8s/build.sh`` (built from Go modules into a version-keyed
cache outside the repo). Standard library only.

    from k8s.harness import ControlPlane       # or load this file by path
    cp = ControlPlane()
    kubeconfig = cp.start("/tmp/cp")           # seconds, once the binaries exist
    subprocess.run([cp.bin("kubectl"), "--kubeconfig", kubeconfig, "get", "nodes"])
    cp.stop()                                  # kills every process, removes the workdir

Manual use:  python k8s/harness.py up      (prints the kubeconfig path, Ctrl-C stops)

See docs/k8s-harness.md.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok", "helm")
SERVICE_CIDR = "10.96.0.0/16"
# The API server's NodePort range (its default, given to it and to a real node's policy controller
# explicitly): kube-router lets every pod reach the node's ports in it, for NodePort Services, so
# no server of the harness binds one (free_port).
NODE_PORTS = range(30000, 32768)
POD_CIDR = "10.244.0.0/16"


class ControlPlaneError(RuntimeError):
    pass


# --------------------------------------------------------------------------- binaries


def read_versions(path: Path = HERE / "versions.env") -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip().strip('"').strip("'")
    return out


def default_bin_dir() -> Path:
    """The bin dir k8s/build.sh writes to ($AWM_K8S_BIN overrides). Same key as build.sh."""
    if os.environ.get("AWM_K8S_BIN"):
        return Path(os.environ["AWM_K8S_BIN"])
    v = read_versions()
    key = (
        f"k8s-{v['K8S_VERSION']}_etcd-{v['ETCD_VERSION']}"
        f"_kwok-{v['KWOK_VERSION']}_helm-{v['HELM_VERSION']}"
    )
    root = Path(os.environ.get("AWM_K8S_CACHE") or Path.home() / ".cache/awm/k8s")
    return root / key / "bin"


KWOK_STAGES = "kwok-stages.yaml"  # written by build.sh next to the binaries


def binaries_present(bin_dir: Path | None = None) -> bool:
    d = Path(bin_dir) if bin_dir else default_bin_dir()
    return all(os.access(d / b, os.X_OK) for b in BINARIES) and (d / KWOK_STAGES).is_file()


_handed_out: set[int] = set()
_port_lock = threading.Lock()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now for a server that binds it *later* (seconds later, in another process).

    Not ``bind(0)``: that hands out a port of the kernel's ephemeral range, which every outgoing
    connection draws from too, so between our check and the server's bind a client socket can take
    it ("bind: address already in use", seen for kube-controller-manager in CI). A port below the
    ephemeral range is never given to a client socket; only an explicit bind can take it, and the
    ports handed out here are remembered so two callers in this process never get the same one.

    Never one of the NodePort range: a real node's policy controller lets every pod reach the
    node's ports in that range (kube-router, for NodePort Services), so an API server there was
    open to env pods whatever their NetworkPolicy said (one run in eight, by the dice)."""
    low, _ = _ephemeral_range()
    first = 10000 if low > 12000 else 1024
    rng = random.Random()
    with _port_lock:
        for _ in range(200 if low > first else 0):
            port = rng.randrange(first, low)
            if port in _handed_out or port in NODE_PORTS:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    for _ in range(50):  # a crowded host (or no room below the ephemeral range): the old way
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in NODE_PORTS:
            return port
    raise RuntimeError("no free port outside the NodePort range")


def node_module():
    """k8s/node.py (RealNode), imported on demand: by package when k8s/ is importable, else by
    path (the harness also runs as a script)."""
    try:
        from k8s import node
    except ImportError:  # run as a script: its own folder is first on sys.path
        import node  # type: ignore[no-redef]
    return node


# --------------------------------------------------------------------------- PKI


def _run(cmd: list[str], cwd: Path) -> None:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise ControlPlaneError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")


SERVER_SANS = [
    "IP:127.0.0.1", "DNS:localhost", "IP:10.96.0.1", "DNS:kubernetes", "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local",
]


def make_pki_openssl(d: Path, sans: list[str]) -> None:
    """CA, apiserver serving cert, admin client cert (system:masters), SA key pair. ECDSA P-256:
    key generation is ~100x faster than RSA, and every component accepts it."""
    ossl = shutil.which("openssl")
    days = "3650"

    def key(name: str) -> None:
        _run([ossl, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
              "-out", f"{name}.key"], d)

    key("ca")
    _run([ossl, "req", "-x509", "-new", "-key", "ca.key", "-days", days, "-subj", "/CN=awm-harness-ca",
          "-addext", "basicConstraints=critical,CA:TRUE",
          "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", "-out", "ca.crt"], d)

    def leaf(name: str, subj: str, ext: str) -> None:
        key(name)
        _run([ossl, "req", "-new", "-key", f"{name}.key", "-subj", subj, "-out", f"{name}.csr"], d)
        (d / f"{name}.ext").write_text(ext)
        _run([ossl, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
              "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", days,
              "-extfile", f"{name}.ext", "-out", f"{name}.crt"], d)

    leaf("apiserver", "/CN=kube-apiserver",
         f"subjectAltName={','.join(sans)}\nextendedKeyUsage=serverAuth\n"
         "keyUsage=critical,digitalSignature\n")
    leaf("admin", "/O=system:masters/CN=awm-harness-admin",
         "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n")
    key("sa")
    _run([ossl, "pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub"], d)


def make_pki_cryptography(d: Path, sans_spec: list[str]) -> None:
    """Same files as make_pki_openssl, with the `cryptography` package (no openssl CLI)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def key(name: str):
        k = ec.generate_private_key(ec.SECP256R1())
        (d / f"{name}.key").write_bytes(k.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        return k

    def name(cn: str, o: str | None = None) -> x509.Name:
        attrs = ([x509.NameAttribute(NameOID.ORGANIZATION_NAME, o)] if o else [])
        return x509.Name(attrs + [x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def builder(subject, issuer, pub):
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(pub)
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=3650)))

    ca_key = key("ca")
    ca_name = name("awm-harness-ca")
    ca = (builder(ca_name, ca_name, ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    (d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    leaf_usage = x509.KeyUsage(True, False, False, False, False, False, False, False, False)

    srv_key = key("apiserver")
    sans = []
    for s in sans_spec:
        kind, val = s.split(":", 1)
        sans.append(x509.IPAddress(ipaddress.ip_address(val)) if kind == "IP" else x509.DNSName(val))
    srv = (builder(name("kube-apiserver"), ca_name, srv_key.public_key())
           .add_extension(x509.SubjectAlternativeName(sans), critical=False)
           .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
           .add_extension(leaf_usage, critical=True)
           .sign(ca_key, hashes.SHA256()))
    (d / "apiserver.crt").write_bytes(srv.public_bytes(serialization.Encoding.PEM))

    adm_key = key("admin")
    adm = (builder(name("awm-harness-admin", "system:masters"), ca_name, adm_key.public_key())
           .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
           .add_extension(leaf_usage, critical=True)
           .sign(ca_key, hashes.SHA256()))
    (d / "admin.crt").write_bytes(adm.public_bytes(serialization.Encoding.PEM))

    sa_key = key("sa")
    (d / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def make_pki(d: Path, extra_ips: tuple[str, ...] = ()) -> None:
    """extra_ips: more addresses the API server is reached at (a real node's address)."""
    d.mkdir(parents=True, exist_ok=True)
    sans = SERVER_SANS + [f"IP:{ip}" for ip in extra_ips]
    if shutil.which("openssl"):
        make_pki_openssl(d, sans)
    else:
        make_pki_cryptography(d, sans)


def write_kubeconfig(path: Path, server: str, pki: Path) -> None:
    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    # JSON is valid YAML; embedded data keeps the file usable from any working directory.
    cfg = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "awm-harness", "cluster": {
            "server": server, "certificate-authority-data": b64("ca.crt")}}],
        "users": [{"name": "awm-harness-admin", "user": {
            "client-certificate-data": b64("admin.crt"), "client-key-data": b64("admin.key")}}],
        "contexts": [{"name": "awm-harness", "context": {
            "cluster": "awm-harness", "user": "awm-harness-admin"}}],
        "current-context": "awm-harness",
    }
    path.write_text(json.dumps(cfg, indent=1))
    path.chmod(0o600)


# --------------------------------------------------------------------------- processes


def _pdeathsig() -> None:  # runs in the child: die with the parent (Linux), no orphans
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok on 127.0.0.1.

    nodes: fake kwok nodes named kwok-node-0..N-1, each with node_cpu/node_memory/node_pods
    capacity (the defaults fit 1,024 small pods on 4 nodes). fast_clients raises the client QPS
    of kube-controller-manager and kube-scheduler (defaults 20 and 50) to 500 so bulk pod
    creation is not throttled (kwok's client is never rate-limited). verbosity: klog --v of the
    Kubernetes components. Logs: <workdir>/logs/<component>.log.
    """

    service_cidr = SERVICE_CIDR  # what a real node (k8s/node.py) reads from its control plane
    node_ports = NODE_PORTS

    def __init__(self, bin_dir: str | os.PathLike | None = None, *, nodes: int = 4,
                 node_cpu: str = "256", node_memory: str = "1Ti", node_pods: int = 512,
                 fast_clients: bool = True, verbosity: int = 1,
                 extra_apiserver_args: tuple[str, ...] = (), timeout: float = 90.0,
                 real_node: bool = False):
        self.bin_dir = Path(bin_dir) if bin_dir else default_bin_dir()
        self.nodes, self.node_cpu, self.node_memory, self.node_pods = nodes, node_cpu, node_memory, node_pods
        self.fast_clients, self.verbosity = fast_clients, verbosity
        self.extra_apiserver_args = tuple(extra_apiserver_args)
        self.timeout = timeout
        self.real_node = real_node
        self.node = None  # a k8s.node.RealNode when real_node
        self.reclaimed: list[str] = []  # abandoned real nodes torn down before this one (k8s/node.py)
        self.workdir: Path | None = None
        self.kubeconfig: str | None = None
        self.server: str | None = None
        self.ports: dict[str, int] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.timings: dict[str, float] = {}
        self._ssl: ssl.SSLContext | None = None
        self._logfiles: list = []

    # ---- public helpers
    @staticmethod
    def free_port() -> int:
        """A port for a server of this control plane or its node (see the module's free_port)."""
        return free_port()

    def bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    def env(self) -> dict[str, str]:
        """os.environ with KUBECONFIG set and the bin dir first on PATH (kubectl, helm)."""
        e = dict(os.environ)
        e["KUBECONFIG"] = self.kubeconfig or ""
        e["PATH"] = f"{self.bin_dir}{os.pathsep}{e.get('PATH', '')}"
        return e

    @staticmethod
    def versions() -> dict[str, str]:
        """The pinned component versions (k8s/versions.env), for a real node's own downloads."""
        return read_versions()

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([self.bin("kubectl"), "--kubeconfig", self.kubeconfig, *args],
                              capture_output=True, text=True, check=check, input=input)

    def api(self, method: str, path: str, body: dict | None = None, timeout: float = 10.0) -> dict:
        """Minimal authenticated JSON call to the apiserver as the admin user."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        with urllib.request.urlopen(req, context=self._ssl, timeout=timeout) as r:
            return json.loads(r.read() or b"{}")

    def __enter__(self) -> "ControlPlane":
        if self.kubeconfig is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- lifecycle
    def start(self, workdir: str | os.PathLike | None = None) -> str:
        """Start everything; return the admin kubeconfig path. Raises ControlPlaneError (after
        stopping what was started) if anything fails or times out."""
        if self.procs:
            raise ControlPlaneError("already started")
        missing = [b for b in BINARIES if not os.access(self.bin_dir / b, os.X_OK)]
        missing += [] if (self.bin_dir / KWOK_STAGES).is_file() else [KWOK_STAGES]
        if missing:
            raise ControlPlaneError(
                f"missing binaries in {self.bin_dir}: {', '.join(missing)}; run k8s/build.sh")
        if self.real_node:
            lacking = node_module().missing_prerequisites(self.bin_dir)
            if lacking:
                raise ControlPlaneError(f"a real node needs: {'; '.join(lacking)}")
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="awm-k8s-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        try:
            self._start(t0)
        except Exception as exc:
            logs = self._log_tails()
            self.stop(remove_workdir=False)  # keep the logs for inspection
            raise ControlPlaneError(
                f"control plane failed to start: {exc} (workdir {self.workdir} kept)\n{logs}") from exc
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        return self.kubeconfig

    def _start(self, t0: float) -> None:
        w = self.workdir
        pki, logs = w / "pki", w / "logs"
        logs.mkdir(exist_ok=True)
        if self.real_node:
            # a node whose harness was killed before its stop holds an address and, if it ran
            # kube-router, the host's policy chains: torn down first (and said so in the log)
            nodes = node_module()
            with nodes.host_lock():
                self.reclaimed = nodes.reclaim_abandoned()
                self.node = nodes.RealNode(self)
                self.node.prepare_network()
        make_pki(pki, (self.node.ip,) if self.node else ())
        self.timings["pki"] = time.monotonic() - t0
        for name in ("etcd", "etcd_peer", "apiserver", "kcm", "scheduler", "kwok"):
            self.ports[name] = free_port()
        p = self.ports
        self.server = f"https://127.0.0.1:{p['apiserver']}"
        self.kubeconfig = str(w / "kubeconfig")
        write_kubeconfig(Path(self.kubeconfig), self.server, pki)
        self._ssl = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self._ssl.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        v = f"--v={self.verbosity}"

        etcd_url = f"http://127.0.0.1:{p['etcd']}"
        peer_url = f"http://127.0.0.1:{p['etcd_peer']}"
        self._spawn("etcd", [
            "--name=harness", f"--data-dir={w / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=harness={peer_url}",
            "--unsafe-no-fsync=true", f"--quota-backend-bytes={2 << 30}",
            "--auto-compaction-retention=1", "--log-level=warn"])
        self._wait("etcd", lambda: self._http_ok(f"{etcd_url}/health"))
        self.timings["etcd"] = time.monotonic() - t0

        self._spawn("kube-apiserver", [
            f"--etcd-servers={etcd_url}",
            *(self.node.apiserver_args(pki) if self.node else
              ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"]),
            f"--secure-port={p['apiserver']}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--service-node-port-range={NODE_PORTS.start}-{NODE_PORTS.stop - 1}",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true", "--profiling=false", v,
            *self.extra_apiserver_args])
        self._wait("kube-apiserver", lambda: self._http_ok(f"{self.server}/readyz"))
        self.timings["apiserver"] = time.monotonic() - t0

        kc = f"--kubeconfig={self.kubeconfig}"
        common = [kc, f"--authentication-kubeconfig={self.kubeconfig}",
                  f"--authorization-kubeconfig={self.kubeconfig}", "--bind-address=127.0.0.1",
                  "--leader-elect=false", "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics", v]
        qps = ["--kube-api-qps=500", "--kube-api-burst=1000"] if self.fast_clients else []
        self._spawn("kube-controller-manager", [
            *common, f"--secure-port={p['kcm']}",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            *qps])
        self._spawn("kube-scheduler", [*common, f"--secure-port={p['scheduler']}", *qps])
        self._spawn("kwok", [
            # only the fake nodes (annotated below): never a real kubelet's node
            kc, f"--config={self.bin_dir / KWOK_STAGES}", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--cidr={POD_CIDR}", "--node-ip=10.244.0.1",
            "--node-lease-duration-seconds=40", f"--server-address=127.0.0.1:{p['kwok']}"],
            # kwok reads $KWOK_WORKDIR/kwok.yaml (default ~/.kwok) if it exists: isolate it.
            env={"KWOK_WORKDIR": str(w / "kwok")})

        for i in range(self.nodes):
            self.api("POST", "/api/v1/nodes", self._node(i))
        self._wait("fake nodes Ready", self._nodes_ready)
        self.timings["nodes_ready"] = time.monotonic() - t0
        # Pods are rejected until kcm has made the namespace's default ServiceAccount.
        self._wait("default ServiceAccount", lambda: self._exists("/api/v1/namespaces/default/serviceaccounts/default"))
        self.timings["default_sa"] = time.monotonic() - t0
        if self.node:
            self.node.start()
            self.timings["real_node_ready"] = time.monotonic() - t0

    def _node(self, i: int) -> dict:
        cap = {"cpu": self.node_cpu, "memory": self.node_memory, "pods": str(self.node_pods)}
        name = f"kwok-node-{i}"
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64", "type": "kwok"},
            },
            "spec": {"podCIDR": f"10.244.{4 * i}.0/22", "podCIDRs": [f"10.244.{4 * i}.0/22"]},
            "status": {"allocatable": cap, "capacity": cap},
        }

    def stop(self, remove_workdir: bool = True) -> None:
        """Stop every process and remove the workdir. Safe to call twice.

        Clients first (kwok, scheduler, kcm), then kube-apiserver, then etcd: SIGTERM to the
        process group, SIGKILL after 5 s. (Terminating all at once makes kube-apiserver's
        graceful shutdown hang on the dead etcd until the kill: ~10 s instead of ~1 s.)"""
        if self.node is not None:
            try:
                self.node.stop()  # while the API server is up: its pods are deleted through it
            finally:
                self.node = None
        names = list(self.procs)
        groups = [[n for n in names if n not in ("kube-apiserver", "etcd")],
                  [n for n in names if n == "kube-apiserver"], [n for n in names if n == "etcd"]]
        for group in groups:
            procs = [self.procs[n] for n in group]
            for proc in procs:
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + 5
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait()
        for f in self._logfiles:
            f.close()
        self.procs.clear()
        self._logfiles = []
        if remove_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    # ---- internals
    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.workdir / "logs" / f"{name}.log", "wb")
        self._logfiles.append(log)
        main_thread = threading.current_thread() is threading.main_thread()
        # PDEATHSIG fires when the *thread* that forked exits, so only use it from the main thread.
        self.procs[name] = subprocess.Popen(
            [self.bin(name), *args], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=self.workdir, env={**os.environ, **(env or {})}, start_new_session=True, preexec_fn=_pdeathsig if main_thread else None)

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited with code {proc.returncode}")

    def _wait(self, what: str, ok, interval: float = 0.1) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if ok():
                    return
            except (OSError, urllib.error.URLError, ssl.SSLError, ValueError, KeyError):
                pass
            time.sleep(interval)
        raise ControlPlaneError(f"timed out after {self.timeout:.0f}s waiting for {what}")

    def _http_ok(self, url: str) -> bool:
        try:
            with urllib.request.urlopen(url, context=self._ssl if url.startswith("https") else None,
                                        timeout=2) as r:
                return r.status == 200
        except urllib.error.HTTPError:
            return False

    def _exists(self, path: str) -> bool:
        try:
            self.api("GET", path)
            return True
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return False
            raise

    def _nodes_ready(self) -> bool:
        items = self.api("GET", "/api/v1/nodes")["items"]
        ready = [n for n in items if any(c["type"] == "Ready" and c["status"] == "True"
                                         for c in n.get("status", {}).get("conditions", []))]
        return len(ready) >= self.nodes

    def _log_tails(self, lines: int = 15) -> str:
        if self.workdir is None or not (self.workdir / "logs").is_dir():
            return ""
        out = []
        for f in sorted((self.workdir / "logs").glob("*.log")):
            tail = f.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {f.name} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(out)


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="harness.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a control plane, print the kubeconfig path, wait for Ctrl-C")
    up.add_argument("--workdir", help="default: a new temp dir (removed on exit)")
    up.add_argument("--nodes", type=int, default=4)
    up.add_argument("--bin-dir", help="default: the dir k8s/build.sh builds into")
    up.add_argument("--real-node", action="store_true", help="also a real kubelet node (k8s/node.py; root)")
    up.add_argument("--load", nargs="*", default=[], metavar="ARCHIVE",
                    help="image archives to import into the real node (images/build.py writes them)")
    sub.add_parser("bin-dir", help="print the bin dir the harness uses")
    a = ap.parse_args(argv)
    if a.cmd == "bin-dir":
        print(default_bin_dir())
        return 0
    cp = ControlPlane(a.bin_dir, nodes=a.nodes, real_node=a.real_node)
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    try:
        kubeconfig = cp.start(a.workdir)
        if cp.node and a.load:
            cp.node.load_images(a.load)
        print(kubeconfig, flush=True)
        print(f"# up in {cp.timings['total']:.1f}s; workdir {cp.workdir}\n"
              f"# export KUBECONFIG={kubeconfig} PATH={cp.bin_dir}:$PATH\n# Ctrl-C to stop",
              file=sys.stderr, flush=True)
        if cp.node and not cp.node.network_policy:
            print(f"# NetworkPolicy is NOT enforced on this node: {cp.node.network_policy_off}", file=sys.stderr, flush=True)
        while not stop.wait(1):
            for name, proc in cp.procs.items():
                if proc.poll() is not None:
                    print(f"# {name} exited with {proc.returncode}; stopping", file=sys.stderr)
                    stop.set()
    finally:
        cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
