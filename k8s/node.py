"""A real node for the test control plane: kubelet + containerd + runc + CNI bridge on this host.

kwok's nodes run nothing; this one runs real containers. It joins a harness ``ControlPlane``
started with ``real_node=True`` (which advertises the API server on the node's address and lets
kwok leave it alone), next to any fake nodes:

    cp = ControlPlane(nodes=0, real_node=True)
    cp.start()                                  # also starts cp.node (a RealNode)
    cp.node.load_images(["~/.cache/awm/images/envserver-<key>.tar"])   # pods never pull
    ...
    cp.stop()                                   # the node first; nothing is left on the host

What runs, as host processes: containerd (Debian's package: a private root, state and socket, runc
with cgroupfs), kubelet and kube-proxy (iptables mode, from k8s/build.sh), CoreDNS (cluster DNS for
Service names), and kube-router's network-policy controller (k8s/build.sh): the bridge CNI has no
policy engine, so kube-router enforces NetworkPolicy with iptables and ipset in the same iptables
backend as kube-proxy (both run the host's ``iptables``). The node's address is 10.86.<N>.1 on the
loopback interface (label lo:awm<N>), so nothing depends on the host's own addresses; pods get
10.85.<N>.0/24 on a CNI bridge (``awmbr<N>``).

The host is changed (cgroups, a bridge, an address on lo, iptables chains, ipsets, mounts, network
namespaces, net.ipv4.ip_forward, bridge netfilter): ``stop`` undoes all of it, and ``leftovers()``
says what is still there (the tests assert it is empty). kube-router's chains and ipsets have
host-wide names and each kube-router deletes the others' as stale, so only one node per host
enforces NetworkPolicy: a node that finds another's running starts without it and says so
(``network_policy`` False, ``network_policy_off`` the reason).

A harness killed before its ``stop`` (SIGKILL, a CI timeout, the machine's session ending) leaves
all of that behind, and its node processes run on in their own sessions. Each node keeps a record
of what it changed (``/run/awm-nodes/awm-node-<N>.json``: its harness's pid and start time, run
dir, sysctls, whether it ran kube-router), and ``reclaim_abandoned()``, called by the harness under
``host_lock()`` before it makes a node, tears down every node whose harness is gone, so one killed
run does not leave the host unable to enforce NetworkPolicy for every run after it. Needs root, cgroups, and the
Debian packages containerd, runc, containernetworking-plugins, iptables and ipset. Measured recipe
and pitfalls: docs/k8s-harness.md "A real node".
"""

from __future__ import annotations

import base64
import collections
import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol


class ControlPlane(Protocol):
    """What a node uses of the harness's ``ControlPlane`` (k8s/harness.py). The harness imports
    this module, never the other way round: the node gets everything through the instance."""

    bin_dir: Path
    workdir: Path
    kubeconfig: str
    ports: dict[str, int]
    service_cidr: str
    node_ports: range

    def api(self, method: str, path: str, body: dict | None = None, timeout: float = 10.0) -> dict: ...

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> Any: ...

    def versions(self) -> dict[str, str]: ...

    def free_port(self) -> int: ...

log = logging.getLogger(__name__)

NODE_BINARIES = ("kubelet", "kube-proxy", "coredns", "kube-router")
HOST_TOOLS = {"containerd": "containerd", "runc": "runc", "ctr": "containerd",
              "iptables": "iptables", "ip": "iproute2", "openssl": "openssl", "conntrack": "conntrack",
              "ipset": "ipset"}
# Host settings the node changes (the bridge plugin turns on forwarding, kube-proxy route_localnet):
# read before start, written back by stop.
SYSCTLS = ("net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet")
# Pods on one bridge talk at layer 2: only with this on do their packets cross iptables, where
# kube-router's policy chains are (turned on, and back, by the node that runs kube-router).
BRIDGE_NF = "net/bridge/bridge-nf-call-iptables"
# The RuntimeClass of the node's gVisor runtime (handler runsc), when k8s/build.sh built it.
GVISOR_RUNTIME_CLASS = "gvisor"
# What kube-router's network-policy controller makes (v2 pkg/controllers/netpol): filter-table
# chains and ipsets, named by these prefixes whichever node made them.
KUBE_ROUTER_CHAINS = ("KUBE-ROUTER-", "KUBE-NWPLCY-", "KUBE-POD-FW-")
KUBE_ROUTER_IPSETS = ("KUBE-SRC-", "KUBE-DST-")
# What kube-router reads through the API server (its informers start for all of these).
KUBE_ROUTER_RBAC = [
    {"apiGroups": [""], "resources": ["namespaces", "pods", "nodes", "services", "endpoints"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
]
CNI_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
LABEL = "awm.dev/node-kind"   # real | (kwok nodes carry type=kwok)
CLUSTER_DOMAIN = "cluster.local"
# cgroup v1 controllers the kubelet's QoS hierarchy uses (each needs the private root made first).
CGROUP_V1 = ("cpu", "cpuacct", "cpuset", "memory", "pids", "blkio", "devices", "freezer", "hugetlb",
             "net_cls", "net_prio", "perf_event", "systemd")


def run_base() -> str:
    """Where node directories go: ``$AWM_NODE_DIR``, else the system temp dir."""
    return os.environ.get("AWM_NODE_DIR") or tempfile.gettempdir()


class NodeError(RuntimeError):
    pass


def cni_bin_dir() -> str | None:
    return next((d for d in CNI_DIRS if all(os.access(Path(d) / p, os.X_OK) for p in CNI_PLUGINS)), None)


def missing_prerequisites(bin_dir: Path) -> list[str]:
    """What this machine lacks to run a real node (empty: it can). Each entry says how to get it."""
    out = []
    if os.geteuid() != 0:
        out.append("root (containerd, kubelet and CNI change the host's network and cgroups)")
    for b in NODE_BINARIES:
        if not os.access(bin_dir / b, os.X_OK):
            out.append(f"{b} in {bin_dir} (run k8s/build.sh)")
    for tool, pkg in HOST_TOOLS.items():
        if not shutil.which(tool):
            out.append(f"{tool} (Debian package {pkg})")
    if not cni_bin_dir():
        out.append(f"CNI plugins {', '.join(CNI_PLUGINS)} (Debian package containernetworking-plugins)")
    if not Path("/sys/fs/cgroup").is_dir():
        out.append("a cgroup filesystem at /sys/fs/cgroup")
    if not (Path("/proc/sys") / BRIDGE_NF).exists():
        out.append("bridge netfilter (kernel CONFIG_BRIDGE_NETFILTER; `modprobe br_netfilter`): "
                   "NetworkPolicy between pods on one bridge")
    if not shutil.which("gcc"):
        out.append("gcc (the pod sandbox image is Kubernetes' pause.c, compiled static)")
    elif not Path(_run("gcc", "-print-file-name=libc.a", check=False).stdout.strip()).is_absolute():
        out.append("libc.a for gcc -static (Debian package libc6-dev): the pod sandbox image's pause.c")
    return out


def _run(*cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise NodeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    return r


def _cgroup_v1_roots() -> dict[str, Path]:
    """controller -> its v1 mount point (only controllers mounted on their own or co-mounted)."""
    out: dict[str, Path] = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        dev, mnt, fstype, opts, *_ = line.split()
        if fstype != "cgroup":
            continue
        for o in opts.split(","):
            name = o.removeprefix("name=")
            if name in CGROUP_V1:
                out[name] = Path(mnt)
    return out


def _cgroup_v2_roots() -> dict[str, Path]:
    """The cgroup v2 (unified) mount, if any, as ``{"unified": path}``: on a hybrid host runc
    makes the node's cgroups there too, beside the v1 hierarchies."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        dev, mnt, fstype, *_ = line.split()
        if fstype == "cgroup2":
            return {"unified": Path(mnt)}
    return {}


def _table_chains(save: str, table: str, prefixes: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """One table of ``save`` (iptables-save, ip6tables-save): its dump's lines, and the chains
    in it named with ``prefixes``."""
    dump = _run(save, "-t", table, check=False).stdout.splitlines()
    return dump, [ln[1:].split()[0] for ln in dump if ln.startswith(":") and ln[1:].startswith(prefixes)]


def _chains(save: str, prefixes: tuple[str, ...]) -> list[str]:
    """Chains named with ``prefixes`` in any table of ``save`` (iptables-save, ip6tables-save)."""
    if not shutil.which(save):
        return []
    return [f"{table}/{chain}" for table in ("nat", "filter", "mangle")
            for chain in _table_chains(save, table, prefixes)[1]]


def kube_router_chains() -> list[str]:
    """kube-router's filter-table chains on this host, in the iptables backend the node uses."""
    return _table_chains("iptables-save", "filter", KUBE_ROUTER_CHAINS)[1]


def kube_router_ipsets() -> list[str]:
    """kube-router's ipsets on this host (none when the ipset tool is missing: nothing made any)."""
    if not shutil.which("ipset"):
        return []
    return [n for n in _run("ipset", "list", "-n", check=False).stdout.split() if n.startswith(KUBE_ROUTER_IPSETS)]


# Records of the nodes on this host, and the lock their harnesses take while they pick an index,
# reclaim abandoned nodes and claim the address: in /run (a node does not outlive a boot), the
# same for every harness whatever its AWM_NODE_DIR.
RECORDS = Path("/run/awm-nodes")


def _record_path(index: int) -> Path:
    """Where node ``index`` records what reclaim_abandoned() needs to tear it down."""
    return RECORDS / f"awm-node-{index}.json"


def _kind(item: str) -> str:
    """What a leftovers() entry is ("veth", "iptables chain", ...), to count them by kind."""
    words = item.split()
    return " ".join(words[:2]) if words[0] in ("iptables", "ip6tables") else words[0]


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    """Held from reclaiming abandoned nodes to a new node's address: two harnesses starting
    together must not both reclaim one node (one would tear down the node the other just made
    in its place) nor both take one index."""
    RECORDS.mkdir(mode=0o700, exist_ok=True)
    with open(RECORDS / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _process_start(pid: int) -> str | None:
    """A running process's start time in clock ticks since boot (with the pid: one process,
    whatever reuses the pid later); None when there is no such process or it has exited (a
    zombie, not reaped yet)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]  # state is field 3, start time field 22


def _processes() -> Iterator[tuple[int, str, str]]:
    """(pid, cwd, command line) of every process this one can read."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        yield int(pid), cwd, cmd


def _kube_router_running() -> bool:
    """Whether any kube-router runs on this host (it keeps its chains and ipsets in sync); a
    killed one not reaped yet does not."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "kube-router" and _process_start(int(pid)):
                return True
        except OSError:
            continue
    return False


def _lo_indexes() -> set[int]:
    """Indexes of the nodes whose address is on lo (label lo:awm<N>)."""
    lo = _run("ip", "-4", "-o", "addr", "show", "dev", "lo", check=False).stdout
    return {int(n) for n in re.findall(r" lo:awm(\d+)", lo)}


def _node_indexes() -> set[int]:
    """Indexes of the nodes made on this host and not torn down: their address on lo (label
    lo:awm<N>, the first change a node makes and the last one its teardown undoes) or their record."""
    found = _lo_indexes()
    found |= {int(m.group(1)) for p in RECORDS.glob("awm-node-*.json")
              if (m := re.fullmatch(r"awm-node-(\d+)\.json", p.name))}
    return found


def _read_record(index: int) -> dict | None:
    """Node ``index``'s record, or None (none, or not one this module wrote: treated as none)."""
    try:
        record = json.loads(_record_path(index).read_text())
    except (OSError, ValueError):
        return None
    types = {"pid": int, "start": str, "run": (str, type(None)), "network_policy": bool, "sysctls": dict}
    ok = isinstance(record, dict) and all(k in record and isinstance(record[k], t) for k, t in types.items())
    return record if ok else None


def _owned(index: int, record: dict | None) -> bool:
    """Whether node ``index`` still has its harness. Without a record (made before records
    existed): while a kubelet of the node runs whose parent is not init, i.e. not orphaned."""
    if record is not None:
        return _process_start(record["pid"]) == record["start"]
    for pid, _, cmd in _processes():
        if f"--hostname-override=awm-real-{index} " in cmd + " " and "kubelet" in cmd.split(" ", 1)[0]:
            try:
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid != 1:
                return True
    return False


def reclaim_abandoned() -> list[str]:
    """Tear down every node on this host whose harness process is gone (killed before its
    ``stop``). -> what was found of each (empty: none). Call it holding :func:`host_lock`. A node
    that cannot be torn down is logged and left (its index stays taken; a new node takes another)."""
    found = []
    for index in sorted(_node_indexes()):
        record = _read_record(index)
        if _owned(index, record):
            continue
        try:
            found.append(RealNode._abandoned(index, record)._reclaim(record))
        except Exception:  # noqa: BLE001 - one stuck node must not stop every later harness
            log.exception("could not reclaim the abandoned real node %d", index)
            continue
        log.warning("reclaimed an abandoned real node: %s", found[-1])
    return found


def _pki_leaf(pki: Path, name: str, cn: str, org: str | None, server_ips: list[str] = ()) -> None:
    """A client (or serving) certificate signed by the harness CA, with openssl."""
    subj = (f"/O={org}" if org else "") + f"/CN={cn}"
    _run("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(pki / f"{name}.key"))
    _run("openssl", "req", "-new", "-key", str(pki / f"{name}.key"), "-subj", subj, "-out", str(pki / f"{name}.csr"))
    ext = "keyUsage=critical,digitalSignature\n"
    if server_ips:
        ext += "extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=" + ",".join(f"IP:{ip}" for ip in server_ips) + "\n"
    else:
        ext += "extendedKeyUsage=clientAuth\n"
    (pki / f"{name}.ext").write_text(ext)
    _run("openssl", "x509", "-req", "-in", str(pki / f"{name}.csr"), "-CA", str(pki / "ca.crt"),
         "-CAkey", str(pki / "ca.key"), "-set_serial", str(int.from_bytes(os.urandom(8), "big")),
         "-days", "3650", "-extfile", str(pki / f"{name}.ext"), "-out", str(pki / f"{name}.crt"))


class RealNode:
    """One real node of a harness ControlPlane (see the module docstring).

    index: picks the node's addresses and names (two harnesses on one host use different
    indexes; ``index=None`` takes the first free one). max_pods: the kubelet's pod limit.
    """

    def __init__(self, cp: "ControlPlane", *, index: int | None = None, max_pods: int = 250):
        self.cp = cp
        self.index = self._free_index() if index is None else index
        n = self.index
        self.name = f"awm-real-{n}"
        self.ip = f"10.86.{n}.1"                     # the node's address (on lo)
        self.pod_cidr = f"10.85.{n}.0/24"
        self.label, self.bridge = f"lo:awm{n}", f"awmbr{n}"
        self.cgroup_root = f"/awm-node-{n}"
        self.max_pods = max_pods
        self.run: Path | None = None                # short paths: unix sockets are limited to 108 bytes
        self.procs: dict[str, subprocess.Popen] = {}
        self.timings: dict[str, float] = {}
        self._logfiles: list = []
        self._sysctls: dict[str, str] = {}
        self._netns_before: set[str] = set()
        self._claimed = False                       # the host is ours to change (and to clean)
        self.network_policy = False                 # this node's kube-router enforces NetworkPolicy
        self.network_policy_off = ""                # why not, when it does not
        self.images: dict[str, str] = {}            # ref -> archive loaded

    @staticmethod
    def _free_index() -> int:
        used = _run("ip", "-4", "-o", "addr", "show", "dev", "lo").stdout
        return next(i for i in range(200) if f"10.86.{i}.1/" not in used)

    def _has_address(self) -> bool:
        return f" {self.ip}/" in _run("ip", "-4", "-o", "addr", "show", "dev", "lo", check=False).stdout

    # ---- what the control plane needs before it starts
    def apiserver_args(self, pki: Path) -> list[str]:
        """Flags the API server needs for a real kubelet: reachable on the node address (pods
        talk to it through the `kubernetes` Service), and a client cert for logs/exec/port-forward."""
        return [f"--advertise-address={self.ip}", "--bind-address=0.0.0.0",
                f"--kubelet-client-certificate={pki / 'admin.crt'}",
                f"--kubelet-client-key={pki / 'admin.key'}",
                "--kubelet-preferred-address-types=InternalIP"]

    def prepare_network(self) -> None:
        """The node's address, on the loopback interface (kernels without the dummy link type are
        common in VMs; pods reach a host-local address through their gateway all the same).
        Before the API server starts: it binds and advertises that address."""
        if self._has_address():
            raise NodeError(f"{self.ip} is already on this host: another harness uses node index {self.index}")
        self._claim_network_policy()
        self._claimed = True
        self._write_record()  # before the first change to the host: a kill from here on is reclaimed
        _run("ip", "addr", "add", f"{self.ip}/32", "dev", "lo", "label", self.label)

    def _claim_network_policy(self) -> None:
        """Enforce NetworkPolicy unless another kube-router's chains or ipsets are on the host: two
        would delete each other's as stale, and this node's teardown would delete the other's."""
        theirs = kube_router_chains() + kube_router_ipsets()
        self.network_policy = not theirs
        if theirs:
            self.network_policy_off = (
                "kube-router's chains or ipsets are already on this host (another real node enforces "
                f"NetworkPolicy here, or one was not torn down): {', '.join(theirs[:6])}. Stop that node, or "
                f"remove them: iptables -F and -X the {', '.join(p + '*' for p in KUBE_ROUTER_CHAINS)} chains, "
                f"then ipset destroy the {', '.join(p + '*' for p in KUBE_ROUTER_IPSETS)} sets")

    # ---- lifecycle
    def start(self) -> None:
        t0 = time.monotonic()
        # short paths (unix sockets are limited to 108 bytes): $AWM_NODE_DIR or the temp dir
        self.run = Path(tempfile.mkdtemp(prefix=f"awmn{self.index}-", dir=run_base()))
        (self.run / "logs").mkdir()
        self._sysctls = {k: (Path("/proc/sys") / k).read_text().strip() for k in SYSCTLS
                         if (Path("/proc/sys") / k).exists()}
        if self.network_policy:
            self._sysctls[BRIDGE_NF] = (Path("/proc/sys") / BRIDGE_NF).read_text().strip()
        self._write_record()  # the run dir and the settings to restore, before they change
        if self.network_policy:
            (Path("/proc/sys") / BRIDGE_NF).write_text("1")
        self._netns_before = self._netns()
        self._cgroups_make()
        self._containerd()
        self.timings["containerd"] = time.monotonic() - t0
        self._pause_image()
        self.timings["pause_image"] = time.monotonic() - t0
        self._coredns()
        self._kubelet()
        self._kube_proxy()
        self._wait("node Ready", self._ready, timeout=90)
        self.timings["ready"] = time.monotonic() - t0
        if self.gvisor:
            self._runtime_class()
        if self.network_policy:
            self._kube_router()  # after the Node exists: its address says which pods are this node's
            self._wait("kube-router's policy chains", self._kube_router_ready, timeout=60)
            self.timings["network_policy"] = time.monotonic() - t0

    def stop(self) -> None:
        """Delete the node's pods, stop every process, and undo every change to the host."""
        if not self._claimed:  # prepare_network refused: the address is another harness's
            return
        if self.run is None and not self.procs:
            self._host_cleanup()
            return
        if "kubelet" in self.procs and self.procs["kubelet"].poll() is None:
            self._drain()
        for name in ("kube-router", "kube-proxy", "kubelet", "coredns"):
            self._kill(name)
        self._stop_containers()
        self._kill("containerd")
        for f in self._logfiles:
            f.close()
        self._logfiles = []
        if shutil.which("kube-proxy") or (self.cp.bin_dir / "kube-proxy").exists():
            _run(str(self.cp.bin_dir / "kube-proxy"), "--cleanup", check=False)
        if self.run is not None:
            self._umount_under(self.run)
            shutil.rmtree(self.run, ignore_errors=True)
            self.run = None
        self._host_cleanup()  # the address last: until it is gone, reclaim_abandoned() finds the node

    # ---- images
    def load_images(self, archives: list[str | os.PathLike]) -> dict[str, float]:
        """Import image archives (docker-archive or OCI tars) into the node's containerd, in the
        namespace the kubelet uses; pods then start them without pulling. -> seconds per archive.
        Refuses up front when the node's filesystem cannot hold them (containerd keeps a layer's
        blob and its unpacked snapshot: ~1.5 times the archives measured, plus the pods' own
        files), instead of failing halfway with ENOSPC."""
        need = 3 * sum(Path(a).stat().st_size for a in archives) // 2 + (512 << 20)
        free = shutil.disk_usage(self.run).free
        if free < need:
            raise NodeError(f"not enough disk for the node's images: {need / 2**30:.1f} GiB needed on the "
                            f"filesystem of {self.run}, {free / 2**30:.1f} GiB free")
        out = {}
        for a in archives:
            t0 = time.monotonic()
            r = self.ctr("images", "import", str(a), timeout=600)
            out[str(a)] = time.monotonic() - t0
            for line in r.stdout.splitlines():
                if line.startswith("unpacking "):
                    self.images[line.split()[1]] = str(a)
        return out

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return _run("ctr", "--address", str(self.run / "containerd.sock"), "-n", "k8s.io", *args, timeout=timeout)

    # ---- checks
    def leftovers(self) -> list[str]:
        """What of this node is still on the host (empty after a clean stop)."""
        out = []
        if Path(f"/sys/class/net/{self.bridge}").exists():
            out.append(f"interface {self.bridge}")
        if self._has_address():
            out.append(f"address {self.ip} on lo")
        veths = [d for d in os.listdir("/sys/class/net")
                 if d.startswith("veth") and (Path(f"/sys/class/net/{d}/master").resolve().name == self.bridge)]
        out += [f"veth {v}" for v in veths]
        for ctrl, root in {**_cgroup_v1_roots(), **_cgroup_v2_roots()}.items():
            if (root / self.cgroup_root.lstrip("/")).exists():
                out.append(f"cgroup {ctrl}:{self.cgroup_root}")
        mounts = Path("/proc/self/mounts").read_text()
        marker = f"{run_base()}/awmn{self.index}-"
        out += [f"mount {ln.split()[1]}" for ln in mounts.splitlines() if marker in ln.split()[1]]
        for line in _run("iptables-save", check=False).stdout.splitlines():
            if self.pod_cidr.split("/")[0].rsplit(".", 1)[0] in line and line.startswith("-A"):
                out.append(f"iptables rule {line.strip()[:120]}")
        # the kubelet's and kube-proxy's IPv6 chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY...): the
        # node is IPv4-only, so any is this node's
        out += [f"ip6tables chain {c}" for c in _chains("ip6tables-save", ("KUBE-", "CNI-"))]
        if self.network_policy:  # else they are another node's
            out += [f"iptables chain {c}" for c in kube_router_chains()]
            out += [f"ipset {name}" for name in kube_router_ipsets()]
        out += [f"netns {ns}" for ns in sorted(self._netns() - self._netns_before)]
        for name, p in self.procs.items():
            if p.poll() is None:
                out.append(f"process {name} ({p.pid})")
        return out

    # ---- internals: host setup
    def _cgroups_make(self) -> None:
        for ctrl, root in _cgroup_v1_roots().items():
            d = root / self.cgroup_root.lstrip("/")
            d.mkdir(exist_ok=True)
            if ctrl == "cpuset":  # a new cpuset cgroup has no cpus or mems until given its parent's
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (d / f).write_text((root / f).read_text())

    def _cgroups_remove(self) -> None:
        for root in {**_cgroup_v1_roots(), **_cgroup_v2_roots()}.values():
            top = root / self.cgroup_root.lstrip("/")
            if not top.exists():
                continue
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                self._rmdir_cgroup(d)
            self._rmdir_cgroup(top)

    @staticmethod
    def _rmdir_cgroup(d: Path) -> None:
        for _ in range(50):
            try:
                d.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # busy for a moment after its last task exits
                try:
                    for pid in (d / "cgroup.procs").read_text().split():
                        os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
                time.sleep(0.1)

    def _host_cleanup(self) -> None:
        if Path(f"/sys/class/net/{self.bridge}").exists():
            _run("ip", "link", "delete", self.bridge, check=False)
        self._cgroups_remove()
        self._iptables_cleanup()
        if self.network_policy:
            self._ipset_cleanup()
        for key, value in self._sysctls.items():
            (Path("/proc/sys") / key).write_text(value)
        if self._has_address():
            _run("ip", "addr", "del", f"{self.ip}/32", "dev", "lo", check=False)
        _record_path(self.index).unlink(missing_ok=True)

    # ---- internals: a node whose harness was killed
    def _write_record(self) -> None:
        """What reclaim_abandoned() needs to tear this node down if its harness dies first."""
        pid = os.getpid()
        record = {"pid": pid, "start": _process_start(pid), "run": str(self.run) if self.run else None,
                  "network_policy": self.network_policy, "sysctls": self._sysctls}
        RECORDS.mkdir(mode=0o700, exist_ok=True)
        tmp = _record_path(self.index).with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(_record_path(self.index))

    @classmethod
    def _abandoned(cls, index: int, record: dict | None) -> "RealNode":
        """The node ``index`` of a harness that is gone, as far as its record (or, without one,
        the host) tells: its run dirs, whether kube-router's chains are its to remove."""
        node = cls(None, index=index)  # type: ignore[arg-type]  # no control plane: nothing is asked of one
        node._claimed = True
        if record:
            node.run = Path(record["run"]) if record["run"] else None
            node.network_policy = record["network_policy"]
            node._sysctls = record["sysctls"]
        else:  # decided in _reclaim, once the node's own kube-router is gone
            node.network_policy = False
        node._netns_before = node._netns() - node._pod_netns()
        return node

    def _reclaim(self, record: dict | None) -> str:
        """Tear down an abandoned node: its processes (they outlive the harness in their own
        sessions; its pods' in its cgroups), its pods' network namespaces and mounts, then the
        host changes as stop() does. -> what was found, counted by kind."""
        runs = [self.run] if record else self._run_dirs()
        marks = [str(r) for r in runs if r is not None]
        kinds = collections.Counter(_kind(item) for item in self.leftovers())
        killed = self._kill_processes(marks)
        if killed:
            kinds["process"] = killed
        if record is None:  # its own kube-router is gone now: any chains left are nobody's
            self.network_policy = not _kube_router_running()
        for name in self._pod_netns():
            ns = Path("/var/run/netns") / name
            _run("umount", "-l", str(ns), check=False)
            ns.unlink(missing_ok=True)
        for run in runs:
            if run is not None:
                self._umount_under(run)
                shutil.rmtree(run, ignore_errors=True)
        self.run = None
        if self._other_nodes():  # a live node's forwarding and kube-proxy chains stay as they are
            self._sysctls = {}
        self._host_cleanup()
        owner = f"harness pid {record['pid']}" if record else "no record of its harness"
        return f"node {self.index} ({owner}): " + ", ".join(f"{n} {k}" for k, n in kinds.items())

    def _run_dirs(self) -> list[Path]:
        """Every run dir of this node's index (without a record: each is a dead harness's)."""
        return sorted(Path(run_base()).glob(f"awmn{self.index}-*"))

    def _kill_processes(self, marks: list[str]) -> int:
        """SIGKILL what runs in the node's run dirs or names them (containerd, kubelet,
        kube-proxy, CoreDNS, kube-router, shims, runsc) and what runs in its cgroups (its pods',
        whose working directory is in their own mount namespace); wait until they are gone
        (at most 10 s). -> how many there were."""
        pids = {pid for pid, cwd, cmd in _processes()
                if any(cwd == m or cwd.startswith(m + "/") or m in cmd for m in marks)}
        for root in {**_cgroup_v1_roots(), **_cgroup_v2_roots()}.values():
            top = root / self.cgroup_root.lstrip("/")
            for procs in (top.rglob("cgroup.procs") if top.is_dir() else ()):
                try:
                    pids |= {int(p) for p in procs.read_text().split()}
                except (OSError, ValueError):
                    continue
        pids.discard(os.getpid())
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_process_start(pid) for pid in pids):
            time.sleep(0.05)
        return len(pids)

    def _other_nodes(self) -> bool:
        """Whether another node's address is on lo (its harness may be running)."""
        return bool(_lo_indexes() - {self.index})

    def _pod_netns(self) -> set[str]:
        """The CNI network namespaces with an address in this node's pod subnet."""
        subnet = ipaddress.ip_network(self.pod_cidr)
        out = set()
        for name in self._netns():
            addrs = _run("ip", "-n", name, "-4", "-o", "addr", "show", check=False).stdout
            if any(ipaddress.ip_address(a) in subnet for a in re.findall(r"inet (\S+)/", addrs)):
                out.add(name)
        return out

    def _iptables_cleanup(self) -> None:
        """Rules the CNI bridge (ipMasq) and portmap plugins leave for this node's subnet, the
        chains kube-proxy --cleanup leaves (KUBE-FIREWALL, KUBE-KUBELET-CANARY...), and all of
        kube-router's when this node ran it (KUBE-ROUTER-*, KUBE-NWPLCY-*, KUBE-POD-FW-*: it leaves
        them in place when it stops, so that policies hold across its restarts; another node's are
        left alone). Not `kube-router --cleanup-config`: that also flushes every IPVS service on
        the host and its routing controller's state."""
        prefix = self.pod_cidr.split("/")[0].rsplit(".", 1)[0] + "."
        for table in ("nat", "filter", "mangle"):
            dump = _run("iptables-save", "-t", table, check=False).stdout.splitlines()
            for line in dump:
                if line.startswith("-A") and prefix in line:
                    _run("iptables", "-t", table, *shlex.split(line.replace("-A", "-D", 1)), check=False)
            chains = [ln[1:].split()[0] for ln in dump if ln.startswith(":")]
            chains = [c for c in chains if c.startswith(("KUBE-", "CNI-"))
                      and (self.network_policy or not c.startswith(KUBE_ROUTER_CHAINS))]
            for chain in chains:
                for line in _run("iptables-save", "-t", table, check=False).stdout.splitlines():
                    if line.startswith("-A") and f"-j {chain}" in line:
                        _run("iptables", "-t", table, *shlex.split(line.replace("-A", "-D", 1)), check=False)
                _run("iptables", "-t", table, "-F", chain, check=False)
            for chain in chains:
                _run("iptables", "-t", table, "-X", chain, check=False)
        self._ip6tables_cleanup()

    @staticmethod
    def _ip6tables_cleanup() -> None:
        """The IPv6 chains the kubelet and kube-proxy make (KUBE-FIREWALL, KUBE-KUBELET-CANARY,
        KUBE-PROXY-*...) although the node serves IPv4 only: the rules that jump to them first."""
        for table in ("nat", "filter", "mangle"):
            dump, chains = _table_chains("ip6tables-save", table, ("KUBE-", "CNI-"))
            for line in dump:
                jump = re.search(r" -j (\S+)", line)
                if line.startswith("-A") and jump and jump.group(1) in chains:
                    _run("ip6tables", "-t", table, *shlex.split(line.replace("-A", "-D", 1)), check=False)
            for chain in chains:
                _run("ip6tables", "-t", table, "-F", chain, check=False)
            for chain in chains:
                _run("ip6tables", "-t", table, "-X", chain, check=False)

    @staticmethod
    def _ipset_cleanup() -> None:
        """kube-router's ipsets, once no iptables rule refers to them (destroy fails while one does)."""
        for name in kube_router_ipsets():
            _run("ipset", "destroy", name, check=False)

    @staticmethod
    def _umount_under(path: Path) -> None:
        mounts = [ln.split()[1] for ln in Path("/proc/self/mounts").read_text().splitlines()]
        for m in sorted((m for m in mounts if m.startswith(str(path))), key=len, reverse=True):
            _run("umount", "-l", m, check=False)

    # ---- internals: processes
    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        logfile = open(self.run / "logs" / f"{name}.log", "wb")
        self._logfiles.append(logfile)
        self.procs[name] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logfile, stderr=subprocess.STDOUT,
                                            cwd=self.run, env={**os.environ, **(env or {})}, start_new_session=True)

    def _kill(self, name: str, grace: float = 10) -> None:
        p = self.procs.get(name)
        if p is None or p.poll() is not None:
            return
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def _wait(self, what: str, ok, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise NodeError(f"{name} exited ({p.returncode}) while waiting for {what}:\n{self.log_tail(name)}")
            try:
                if ok():
                    return
            except Exception:
                pass
            time.sleep(0.2)
        raise NodeError(f"timed out after {timeout:.0f}s waiting for {what}:\n"
                        + "\n".join(self.log_tail(n) for n in self.procs))

    def log_tail(self, name: str, lines: int = 20) -> str:
        f = (self.run / "logs" / f"{name}.log") if self.run else None
        if not f or not f.exists():
            return ""
        return f"--- {name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-lines:])

    # ---- containerd
    def _containerd(self) -> None:
        r = self.run
        cni_conf = r / "cni"
        cni_conf.mkdir()
        (cni_conf / "10-awm.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": f"awm{self.index}",
            "plugins": [
                {"type": "bridge", "bridge": self.bridge, "isGateway": True, "ipMasq": True,
                 "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": self.pod_cidr}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(r / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ]}, indent=1))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        (r / "containerd.toml").write_text(f"""version = 2
root = "{r / 'containerd-root'}"
state = "{r / 'containerd-state'}"
[grpc]
  address = "{r / 'containerd.sock'}"
[ttrpc]
  address = "{r / 'containerd.sock.ttrpc'}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{r / 'opt'}"
[{cri}]
  sandbox_image = "{self._pause_ref}"
  # The VM lacks CAP_SYS_RESOURCE in its bounding set: runc cannot set a negative oom_score_adj.
  restrict_oom_score_adj = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
{self._runsc_runtime(cri)}
  [{cri}.cni]
    bin_dir = "{cni_bin_dir()}"
    conf_dir = "{cni_conf}"
""")
        # containerd finds a runtime's shim (containerd-shim-runsc-v1) on its PATH
        self._spawn("containerd", ["containerd", "--config", str(r / "containerd.toml")],
                    env={"PATH": f"{self.cp.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"})
        self._wait("containerd", lambda: _run("ctr", "--address", str(r / "containerd.sock"), "version",
                                              check=False).returncode == 0)

    @property
    def gvisor(self) -> bool:
        """Whether this node offers the gVisor runtime (handler ``runsc``, RuntimeClass ``gvisor``):
        runsc and its shim are in the control plane's bin dir (k8s/build.sh builds them)."""
        return all(os.access(self.cp.bin_dir / b, os.X_OK) for b in ("runsc", "containerd-shim-runsc-v1"))

    def _runsc_runtime(self, cri: str) -> str:
        """containerd's runtime entry for gVisor, and the shim's own config (runsc's flags): its
        state under this node's run dir; cgroups are left to the kubelet's (the pod's cgroup is
        set up by containerd before runsc starts)."""
        if not self.gvisor:
            return ""
        r = self.run
        (r / "runsc.toml").write_text(f"""binary_name = "{self.cp.bin_dir / 'runsc'}"
root = "{r / 'runsc-root'}"
log_path = "{r / 'logs'}/runsc-shim-%ID%.log"
[runsc_config]
  platform = "systrap"
""")
        return f"""    [{cri}.containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      [{cri}.containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "{r / 'runsc.toml'}"
"""

    @property
    def _pause_ref(self) -> str:
        return "localhost/awm-pause:3.10"

    def _pause_image(self) -> None:
        """The pod sandbox image: Kubernetes' own pause.c (from the k8s.io/kubernetes module the
        control plane is built from), compiled static, in a one-file image imported here."""
        src = self._pause_source()
        d = self.run / "pause"
        (d / "rootfs").mkdir(parents=True)
        _run("gcc", "-Os", "-static", "-Wall", "-o", str(d / "rootfs/pause"), str(src),
             f"-DVERSION={self._pause_ref.rsplit(':', 1)[1]}")
        _run("strip", str(d / "rootfs/pause"), check=False)
        layer = d / "layer.tar"
        _run("tar", "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner",
             "-C", str(d / "rootfs"), "-cf", str(layer), "pause")
        import hashlib
        diff_id = "sha256:" + hashlib.sha256(layer.read_bytes()).hexdigest()
        config = {"architecture": "amd64", "os": "linux",
                  "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
                  "rootfs": {"type": "layers", "diff_ids": [diff_id]}}
        cfg = json.dumps(config, sort_keys=True).encode()
        cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
        (d / cfg_name).write_bytes(cfg)
        (d / "manifest.json").write_text(json.dumps([{"Config": cfg_name, "RepoTags": [self._pause_ref],
                                                       "Layers": ["layer.tar"]}]))
        archive = d / "pause.tar"
        _run("tar", "-C", str(d), "-cf", str(archive), "manifest.json", cfg_name, "layer.tar")
        self.load_images([archive])

    def _pause_source(self) -> Path:
        v = self.cp.versions()["K8S_VERSION"]  # the harness's pins
        r = _run("go", "mod", "download", "-json", f"k8s.io/kubernetes@{v}", timeout=300,
                 check=False)
        try:
            d = Path(json.loads(r.stdout)["Dir"])
        except (ValueError, KeyError) as exc:
            raise NodeError(f"cannot find the k8s.io/kubernetes@{v} module source for pause.c: {r.stderr.strip()}") from exc
        return d / "build/pause/linux/pause.c"

    # ---- DNS
    def _coredns(self) -> None:
        kc = self.cp.kubeconfig
        (self.run / "Corefile").write_text(f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{
    bind {self.ip}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {kc} awm-harness
        pods insecure
    }}
    cache 5
    errors
}}
.:53 {{
    bind {self.ip}
    forward . /etc/resolv.conf
    cache 30
    errors
}}
""")
        self._spawn("coredns", [str(self.cp.bin_dir / "coredns"), "-conf", str(self.run / "Corefile")])

    # ---- kubelet
    def _kubelet(self) -> None:
        r, pki = self.run, self.cp.workdir / "pki"
        _pki_leaf(pki, f"kubelet-{self.index}", f"system:node:{self.name}", "system:nodes")
        _pki_leaf(pki, f"kubelet-serving-{self.index}", self.name, None, server_ips=[self.ip])
        kubeconfig = self._kubeconfig("kubelet", f"kubelet-{self.index}")
        self.kubelet_port = self.cp.free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.ip, "port": self.kubelet_port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.cp.free_port(),
            "tlsCertFile": str(pki / f"kubelet-serving-{self.index}.crt"),
            "tlsPrivateKeyFile": str(pki / f"kubelet-serving-{self.index}.key"),
            "authentication": {"x509": {"clientCAFile": str(pki / "ca.crt")},
                               "webhook": {"enabled": True}, "anonymous": {"enabled": False}},
            "authorization": {"mode": "Webhook"},
            # cgroup v1 here (kubelet 1.36 refuses it unless told), cgroupfs (no systemd), a
            # private root so teardown removes exactly what the node made.
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{r / 'containerd.sock'}",
            "clusterDNS": [self.ip], "clusterDomain": CLUSTER_DOMAIN,
            "podLogsDir": str(r / "pod-logs"),
            "maxPods": self.max_pods, "serializeImagePulls": False,
            # A test host's disk is often fuller than a production node's: evict only when critical,
            # and never garbage-collect the imported images (they cannot be pulled again).
            # (absolute sizes: 1% of a large shared disk is gigabytes)
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "256Mi",
                             "imagefs.available": "256Mi", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "kubeAPIQPS": 100, "kubeAPIBurst": 200,
            "syncFrequency": "10s", "nodeStatusReportFrequency": "10s",
            "resolvConf": "/etc/resolv.conf",
        }
        (r / "kubelet.yaml").write_text(json.dumps(config, indent=1))
        self._spawn("kubelet", [
            str(self.cp.bin_dir / "kubelet"), f"--config={r / 'kubelet.yaml'}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={r / 'kubelet'}", f"--cert-dir={r / 'kubelet-pki'}",
            f"--hostname-override={self.name}", f"--node-ip={self.ip}",
            f"--node-labels={LABEL}=real", "--v=1"])

    def _kubeconfig(self, name: str, cert: str) -> Path:
        """A kubeconfig for a node agent: the API server on the node address, the client cert
        ``cert`` (signed by the harness CA), embedded so the file stands alone."""
        pki = self.cp.workdir / "pki"

        def b64(file: str) -> str:
            return base64.b64encode((pki / file).read_bytes()).decode()

        path = self.run / f"{name}.kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": f"https://{self.ip}:{self.cp.ports['apiserver']}",
                                                   "certificate-authority-data": b64("ca.crt")}}],
            "users": [{"name": "u", "user": {"client-certificate-data": b64(f"{cert}.crt"),
                                             "client-key-data": b64(f"{cert}.key")}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "current-context": "c"}))
        return path

    def _kube_proxy(self) -> None:
        """iptables mode; masquerade-all (chosen when the node ran without bridge netfilter: a pod
        reaching a pod on its bridge through a Service needed the reply to come back through the
        host). It does not hide the client from NetworkPolicy: kube-router's filter chains see the
        pod's own address, masquerading happens after them (POSTROUTING)."""
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": self.cp.kubeconfig},
            "hostnameOverride": self.name, "mode": "iptables", "clusterCIDR": str(ipaddress.ip_network(self.pod_cidr)),
            "iptables": {"masqueradeAll": True, "syncPeriod": "10s", "minSyncPeriod": "0s"},
            "conntrack": {"maxPerCore": 0},
            "metricsBindAddress": f"127.0.0.1:{self.cp.free_port()}", "healthzBindAddress": f"127.0.0.1:{self.cp.free_port()}",
        }
        (self.run / "kube-proxy.yaml").write_text(json.dumps(config, indent=1))
        self._spawn("kube-proxy", [str(self.cp.bin_dir / "kube-proxy"), f"--config={self.run / 'kube-proxy.yaml'}", "--v=1"])

    # ---- NetworkPolicy
    def _kube_router(self) -> None:
        """kube-router's network-policy controller alone (no BGP routing, no service proxy: the
        bridge and kube-proxy do those). Its own identity, allowed only to read what it watches."""
        user = "system:kube-router"
        _pki_leaf(self.cp.workdir / "pki", f"kube-router-{self.index}", user, None)
        self._grant("awm:kube-router", user, KUBE_ROUTER_RBAC)
        self._spawn("kube-router", [
            str(self.cp.bin_dir / "kube-router"),
            f"--kubeconfig={self._kubeconfig('kube-router', f'kube-router-{self.index}')}",
            f"--hostname-override={self.name}",
            "--run-firewall=true", "--run-router=false", "--run-service-proxy=false", "--run-loadbalancer=false",
            f"--service-cluster-ip-range={self.cp.service_cidr}",
            f"--service-node-port-range={self.cp.node_ports.start}-{self.cp.node_ports.stop - 1}",
            # a full resync every 10 s, like kube-proxy's here (default 5 min): if something else on
            # the host removes its rules, they are back within that
            "--iptables-sync-period=10s",
            "--health-port=0", "--metrics-port=0", "--v=1"])

    def _runtime_class(self) -> None:
        """RuntimeClass ``gvisor`` (handler ``runsc``): what a pod names to run under gVisor, as on
        GKE Sandbox or a cluster with gVisor installed (the chart's ``envserver.runtimeClassName``)."""
        body = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": GVISOR_RUNTIME_CLASS},
                "handler": "runsc"}
        try:
            self.cp.api("POST", "/apis/node.k8s.io/v1/runtimeclasses", body)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise

    def _grant(self, name: str, user: str, rules: list[dict]) -> None:
        """A ClusterRole with ``rules`` bound to ``user`` (already there: left as it is)."""
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        objects = [
            ("clusterroles", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                              "metadata": {"name": name}, "rules": rules}),
            ("clusterrolebindings", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                                     "metadata": {"name": name},
                                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                 "name": name},
                                     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                                   "name": user}]}),
        ]
        for kind, body in objects:
            try:
                self.cp.api("POST", f"{rbac}/{kind}", body)
            except urllib.error.HTTPError as exc:
                if exc.code != 409:
                    raise

    @staticmethod
    def _kube_router_ready() -> bool:
        """Its chains are in place and hooked into the built-in ones (in the backend the node's
        own iptables uses: kube-router runs that same binary) and its first sync made the default
        policy chain."""
        rules = _run("iptables", "-t", "filter", "-S", check=False).stdout.splitlines()
        hooked = {c for c in ("INPUT", "FORWARD", "OUTPUT") if any(
            r.startswith(f"-A {c} ") and r.endswith(f"-j KUBE-ROUTER-{c}") for r in rules)}
        return len(hooked) == 3 and "-N KUBE-NWPLCY-DEFAULT" in rules

    def _ready(self) -> bool:
        node = self.cp.api("GET", f"/api/v1/nodes/{self.name}")
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))

    # ---- teardown
    def _pods_here(self) -> list[dict]:
        items = self.cp.api("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.name}")["items"]
        return items

    def _drain(self) -> None:
        """Delete the node's pods through the API and wait for the kubelet to tear them down
        (killing the kubelet first would leave their volume mounts and sandboxes behind)."""
        try:
            # cordoned first: the controllers' replacements must not land here again
            self.cp.kubectl("cordon", self.name, check=False)
            for p in self._pods_here():
                m = p["metadata"]
                try:
                    self.cp.api("DELETE", f"/api/v1/namespaces/{m['namespace']}/pods/{m['name']}",
                                {"gracePeriodSeconds": 0})
                except Exception:
                    pass
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self._pods_here():
                time.sleep(0.5)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self._sandboxes():
                time.sleep(0.5)
        except Exception:
            pass

    def _sandboxes(self) -> list[str]:
        r = _run("ctr", "--address", str(self.run / "containerd.sock"), "-n", "k8s.io", "tasks", "ls", "-q", check=False)
        return r.stdout.split()

    def _stop_containers(self) -> None:
        """Kill whatever tasks are left and their shims (a shim outlives containerd otherwise)."""
        if self.run is None or "containerd" not in self.procs or self.procs["containerd"].poll() is not None:
            pass
        else:
            for task in self._sandboxes():
                _run("ctr", "--address", str(self.run / "containerd.sock"), "-n", "k8s.io",
                     "tasks", "kill", "-s", "SIGKILL", task, check=False)
        sock = str(self.run / "containerd.sock") if self.run else None
        if sock is None:
            return
        # This node's shims (those of its containerd socket), and gVisor's sandbox and gofer
        # processes, which outlive a killed shim (every process of this node's runsc root).
        shims = (b"containerd-shim-runc-v2", b"containerd-shim-runsc-v1")
        runsc_root = f"--root={self.run / 'runsc-root'}".encode()
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (cmd and cmd[0].endswith(shims) and sock.encode() in b" ".join(cmd)) or runsc_root in cmd:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        # network namespaces the CNI made for this node's sandboxes (containerd leaves them when
        # its sandboxes are killed rather than stopped)
        for name in self._netns() - self._netns_before:
            ns = Path("/var/run/netns") / name
            _run("umount", "-l", str(ns), check=False)
            try:
                ns.unlink()
            except OSError:
                pass

    @staticmethod
    def _netns() -> set[str]:
        d = Path("/var/run/netns")
        return {p.name for p in d.glob("cni-*")} if d.is_dir() else set()
