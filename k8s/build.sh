#!/usr/bin/env bash
# Build the binaries of the test control plane from their Go modules (Go module proxy only):
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok, helm
# and of its real node (k8s/node.py): kubelet, kube-proxy, coredns (cluster DNS),
# kube-router (its network-policy controller only: NetworkPolicy enforced with iptables + ipset),
# runsc and containerd-shim-runsc-v1 (gVisor: the sandboxed runtime of RuntimeClass gvisor)
# into ${AWM_K8S_CACHE:-$HOME/.cache/awm/k8s}/<versions-key>/bin (outside the repo).
#
# Versions are pinned in k8s/versions.env. Idempotent: a binary that is already in the cache
# is not rebuilt (binaries are written under a temporary name and renamed when complete).
# The last line printed on stdout is the bin dir.
#
# Usage: k8s/build.sh              build what is missing, print the bin dir
#        k8s/build.sh --print-bin  only print the bin dir (no build)
#        k8s/build.sh --check      exit 0 if every binary is present, 1 otherwise
# Env:   AWM_K8S_CACHE   cache root (default ~/.cache/awm/k8s)
#        AWM_K8S_BUILD_P go build -p (default 2; the machine has 2 cores)
# See docs/k8s-harness.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
ROOT="${AWM_K8S_CACHE:-$HOME/.cache/awm/k8s}/$KEY"
BIN="$ROOT/bin"
SRC="$ROOT/src"
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm kubelet kube-proxy coredns kube-router
          runsc containerd-shim-runsc-v1)

SHIM_STAMP="gvisor $GVISOR_VERSION, oom_score_adj 0"   # what the shim below is built from
STAGES=kwok-stages.yaml   # kwok >= 0.8 has no built-in stages: config written below
# current NAME: $BIN/NAME is there, and for the node's add-ons (coredns, kube-router), reports its
# pinned version. Their pins are not in KEY (a new one would rebuild everything): checking the
# binary's own report instead means changing such a pin rebuilds just that binary.
current() {
  # The version report is read whole, then matched: `... | grep -q` under pipefail fails at random
  # when grep exits at its match and the binary dies of SIGPIPE writing its next line.
  local out
  case "$1" in
    coredns) out="$("$BIN/coredns" -version 2>/dev/null)" && grep -qxF "CoreDNS-${COREDNS_VERSION#v}" <<<"$out" ;;
    kube-router) out="$("$BIN/kube-router" --version 2>&1)" && grep -qF "version $KUBE_ROUTER_VERSION," <<<"$out" ;;
    runsc) out="$("$BIN/runsc" --version 2>/dev/null)" && grep -qxF "runsc version $GVISOR_VERSION" <<<"$out" ;;
    containerd-shim-runsc-v1) [ -x "$BIN/$1" ] && [ "$(cat "$BIN/.$1.stamp" 2>/dev/null)" = "$SHIM_STAMP" ] ;;
    *) [ -x "$BIN/$1" ] ;;
  esac
}
missing() {
  local b; for b in "${BINARIES[@]}"; do current "$b" || echo "$b"; done
  [ -s "$BIN/$STAGES" ] || echo "$STAGES"
}

case "${1:-}" in
  --print-bin) echo "$BIN"; exit 0 ;;
  --check) [ -z "$(missing)" ] && exit 0 || exit 1 ;;
  "") ;;
  *) echo "usage: $0 [--print-bin|--check]" >&2; exit 2 ;;
esac

if [ -z "$(missing)" ]; then
  echo "k8s binaries cached: $BIN" >&2
  echo "$BIN"; exit 0
fi

command -v go >/dev/null || { echo "build.sh: 'go' not on PATH (Go >= 1.26 needed)" >&2; exit 1; }

# No toolchain downloads, static binaries, reproducible paths; keep the user's GOFLAGS extras.
export GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath -buildvcs=false"
P="${AWM_K8S_BUILD_P:-2}"

mkdir -p "$BIN" "$SRC"
exec 9>"$ROOT/.lock"
flock 9   # two builds of the same key wait for each other instead of racing

TIMES="$ROOT/build-times.txt"
step_start=0
begin() { step_start=$(date +%s); echo "==> $1 ($(date -u +%H:%M:%S))" >&2; }
finish() {
  local s=$(( $(date +%s) - step_start ))
  echo "    $1: ${s}s" >&2
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) $1 ${s}s go=$(go env GOVERSION) p=$P" >>"$TIMES"
}
# install_tmp NAME: move $BIN/.NAME.tmp to $BIN/NAME after a smoke test
install_tmp() {
  "$BIN/.$1.tmp" "${@:2}" >/dev/null
  mv -f "$BIN/.$1.tmp" "$BIN/$1"
}

# ---------------------------------------------------------------- etcd
# go.etcd.io/etcd/server/v3 has replace directives, so `go install ...@v` refuses it: build it
# from a wrapper module that requires it (its tagged requires already pin the sibling modules).
if [ ! -x "$BIN/etcd" ]; then
  begin "etcd $ETCD_VERSION"
  d="$SRC/etcd"; mkdir -p "$d"
  emod="$(go mod download -json "go.etcd.io/etcd/server/v3@$ETCD_VERSION" |
          python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  egoline="$(awk '$1=="go"{print; exit}' "$emod")"
  cat >"$d/go.mod" <<EOF
module awm.local/k8s/etcd

$egoline

tool go.etcd.io/etcd/server/v3

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
  (cd "$d" && go mod tidy &&
   go build -p "$P" -ldflags "-s -w" -o "$BIN/.etcd.tmp" go.etcd.io/etcd/server/v3)
  install_tmp etcd --version
  finish etcd
fi

# ---------------------------------------------------------------- kubernetes
# k8s.io/kubernetes requires its staging modules at v0.0.0 with replaces to ./staging: a wrapper
# module replaces each of them with its published tag v0.<minor>.<patch>. The list is derived
# from upstream's go.mod, so it follows new versions.
K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
need_k8s=0; for b in "${K8S_BINS[@]}"; do [ -x "$BIN/$b" ] || need_k8s=1; done
if [ "$need_k8s" = 1 ]; then
  begin "kubernetes $K8S_VERSION: module graph"
  d="$SRC/kubernetes"; mkdir -p "$d"
  kmod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
          python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  staging="v0.${K8S_VERSION#v1.}"          # v1.36.3 -> v0.36.3
  {
    echo "module awm.local/k8s/kubernetes"; echo
    awk '$1=="go"{print; exit}' "$kmod"     # same go line and godebug defaults as upstream
    awk '$1=="godebug"{print}' "$kmod"; echo
    echo "tool ("
    for b in "${K8S_BINS[@]}"; do printf '\tk8s.io/kubernetes/cmd/%s\n' "$b"; done
    echo ")"; echo
    echo "require k8s.io/kubernetes $K8S_VERSION"; echo
    echo "replace ("
    { awk '$1 ~ /^k8s\.io\// && $2=="v0.0.0" {print $1}' "$kmod"
      awk '$2=="=>" && $3 ~ /^\.\/staging\// {print $1}' "$kmod"; } | sort -u |
      while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$staging"; done
    echo ")"
  } >"$d/go.mod"
  (cd "$d" && go mod tidy)
  finish "kubernetes-modules"

  minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
  LDF="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDF="$LDF -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    LDF="$LDF -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  for b in "${K8S_BINS[@]}"; do
    [ -x "$BIN/$b" ] && continue
    begin "$b $K8S_VERSION"
    (cd "$d" && go build -p "$P" -tags=notest -ldflags "$LDF" -o "$BIN/.$b.tmp" "k8s.io/kubernetes/cmd/$b")
    if [ "$b" = kubectl ]; then install_tmp "$b" version --client; else install_tmp "$b" --version; fi
    finish "$b"
  done
fi

# ---------------------------------------------------------------- kwok (no replaces: go install)
if [ ! -x "$BIN/kwok" ]; then
  begin "kwok $KWOK_VERSION"
  t="$SRC/kwok-gobin"; rm -rf "$t"; mkdir -p "$t"
  GOBIN="$t" go install -p "$P" -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  mv -f "$t/kwok" "$BIN/.kwok.tmp"; rm -rf "$t"
  install_tmp kwok --version
  finish kwok
fi

# kwok v0.8.0 exits with "no stages found" unless its config holds Stage objects (kwokctl writes
# them into the config it generates). Take the same defaults kwokctl uses (node-initialize,
# node-heartbeat-with-lease, pod-ready/complete/delete) from the pinned kwok module.
if [ ! -s "$BIN/$STAGES" ]; then
  kdir="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" |
          python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  {
    echo "# Default kwok stages from sigs.k8s.io/kwok@$KWOK_VERSION kustomize/stage (written by k8s/build.sh)"
    first=1
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
             pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
      [ "$first" = 1 ] || echo "---"; first=0
      cat "$kdir/kustomize/stage/$f"
    done
  } >"$BIN/.$STAGES.tmp"
  mv -f "$BIN/.$STAGES.tmp" "$BIN/$STAGES"
fi

# ---------------------------------------------------------------- helm (no replaces: go install)
if [ ! -x "$BIN/helm" ]; then
  begin "helm $HELM_VERSION"
  hmaj="${HELM_VERSION%%.*}"               # v3
  hmod="helm.sh/helm/$hmaj"
  # What helm's Makefile injects: the version, and the k8s version of its client-go (else
  # `helm template`/`helm lint` default to Kubernetes 1.20 capabilities).
  cgo="$(go mod download -json "$hmod@$HELM_VERSION" |
         python3 -c 'import json,sys,re; t=open(json.load(sys.stdin)["GoMod"]).read(); print(re.search(r"k8s.io/client-go v0\.(\d+)\.", t).group(1))')"
  LDF="-s -w -X $hmod/internal/version.version=$HELM_VERSION -X $hmod/internal/version.gitTreeState=clean"
  for p in pkg/chartutil pkg/lint/rules; do
    LDF="$LDF -X $hmod/$p.k8sVersionMajor=1 -X $hmod/$p.k8sVersionMinor=$cgo"
  done
  t="$SRC/helm-gobin"; rm -rf "$t"; mkdir -p "$t"
  GOBIN="$t" go install -p "$P" -ldflags "$LDF" "$hmod/cmd/helm@$HELM_VERSION"
  mv -f "$t/helm" "$BIN/.helm.tmp"; rm -rf "$t"
  install_tmp helm version
  finish helm
fi

# ---------------------------------------------------------------- coredns (no replaces: go install)
# The real node's cluster DNS (the chart's pods reach Postgres and the operator by Service name).
if ! current coredns; then
  begin "coredns $COREDNS_VERSION"
  t="$SRC/coredns-gobin"; rm -rf "$t"; mkdir -p "$t"
  GOBIN="$t" go install -p "$P" -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
  mv -f "$t/coredns" "$BIN/.coredns.tmp"; rm -rf "$t"
  install_tmp coredns -version
  finish coredns
fi

# ---------------------------------------------------------------- kube-router (no replaces: go install)
# The real node's NetworkPolicy enforcement (k8s/node.py runs only its firewall controller). The
# version and a fixed build date go in the way its Makefile injects them (`kube-router --version`).
if ! current kube-router; then
  begin "kube-router $KUBE_ROUTER_VERSION"
  kmod="github.com/cloudnativelabs/kube-router/${KUBE_ROUTER_VERSION%%.*}"   # .../v2
  LDF="-s -w -X $kmod/pkg/version.Version=$KUBE_ROUTER_VERSION -X $kmod/pkg/version.BuildDate=1970-01-01T00:00:00Z"
  t="$SRC/kube-router-gobin"; rm -rf "$t"; mkdir -p "$t"
  GOBIN="$t" go install -p "$P" -ldflags "$LDF" "$kmod/cmd/kube-router@$KUBE_ROUTER_VERSION"
  mv -f "$t/kube-router" "$BIN/.kube-router.tmp"; rm -rf "$t"
  install_tmp kube-router --version
  finish kube-router
fi

# ---------------------------------------------------------------- gVisor (no tags: a pseudo-version)
# runsc and the containerd shim that drives it (containerd finds `containerd-shim-runsc-v1` on its
# PATH for runtime_type io.containerd.runsc.v1). Pure Go (CGO_ENABLED=0 above): a cgo build
# re-executes its gofer through /proc/self/exe inside a new PID namespace, which fails.
if ! current runsc || ! current containerd-shim-runsc-v1; then
  begin "gvisor $GVISOR_VERSION"
  t="$SRC/gvisor-gobin"; rm -rf "$t"; mkdir -p "$t"
  GOBIN="$t" go install -p "$P" -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$GVISOR_VERSION" \
    "gvisor.dev/gvisor/runsc@$GVISOR_VERSION"
  mv -f "$t/runsc" "$BIN/.runsc.tmp"; rm -rf "$t"
  install_tmp runsc --version
  # The shim asks the kernel to protect itself from the OOM killer (oom_score_adj -999), which
  # needs CAP_SYS_RESOURCE; VMs without it in their bounding set (this harness's: containerd runs
  # with restrict_oom_score_adj for the same reason) refuse every sandbox ("failed to set OOM
  # Score on shim: permission denied"). Built from a copy of the module that asks for 0 (what it
  # inherits from containerd) instead; nothing else changes.
  gdir="$(go mod download -json "gvisor.dev/gvisor@$GVISOR_VERSION" |
          python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  d="$SRC/gvisor"; rm -rf "$d"; cp -r "$gdir" "$d"; chmod -R u+w "$d"
  sed -i -E 's|^(\s*oomScoreMax[A-Za-z]* = )-999$|\10 // k8s/build.sh: -999 needs CAP_SYS_RESOURCE|' "$d"/pkg/shim/v1/*.go
  grep -qE 'oomScoreMax[A-Za-z]* = 0 ' "$d"/pkg/shim/v1/*.go || { echo "build.sh: the shim's OOM score line moved" >&2; exit 1; }
  (cd "$d" && go build -p "$P" -ldflags "-s -w" -o "$BIN/.containerd-shim-runsc-v1.tmp" ./shim)
  mv -f "$BIN/.containerd-shim-runsc-v1.tmp" "$BIN/containerd-shim-runsc-v1"
  echo "$SHIM_STAMP" >"$BIN/.containerd-shim-runsc-v1.stamp"
  rm -rf "$d"
  finish gvisor
fi

m="$(missing)"
if [ -n "$m" ]; then echo "build.sh: still missing: $m" >&2; exit 1; fi
cp "$HERE/versions.env" "$ROOT/versions.env"
echo "k8s binaries built: $BIN" >&2
echo "$BIN"
