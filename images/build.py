#!/usr/bin/env python3
"""Build the chart's images without a Docker engine, cached by content.

The Dockerfiles in images/<name>/ stay the one description of each image (users with Docker build
from them as they are). This script builds the same Dockerfiles with buildah (chroot isolation, no
daemon) on top of a base built here from Debian packages (mmdebstrap), so a machine that reaches
only package registries (PyPI, Debian) still gets every image:

    base      Debian bookworm minbase + images/base/packages.txt  (stands in for python:3.11-slim-bookworm)
    busybox   Debian's busybox-static on an empty root            (stands in for busybox:1.37.0)
    wheel     images/wheel/Dockerfile: the awm package's wheel, the one build of it that every
              image running awm installs (passed to them as WHEEL; built first, when one needs it)
    envserver, operator, catalog, trainer, postgres   images/<name>/Dockerfile with BASE/BUSYBOX/WHEEL set
    trainer-eval   images/trainer/Dockerfile with EXTRAS=eval: `awm eval` of an endpoint, no torch

Every image is written as a docker-archive tar (loadable by `docker load`, `ctr images import`,
`kind load image-archive`) into the cache, ``$AWM_IMAGE_CACHE`` or ``~/.cache/awm/images``, under a
key hashed from everything that goes into it: the Dockerfile, the files its COPY lines name, the
build arguments, among them the tags (so the keys) of the base and of the wheel it installs: a
change to the package's sources or to how it is built makes a new wheel and rebuilds every image
on it. An image whose key is cached is not rebuilt; its tag is
``localhost/awm-<name>:<key>``, so a changed image can never hide behind an old tag on a node.

Reproducibility: layer timestamps are clamped (``--timestamp 0``; mmdebstrap with
``SOURCE_DATE_EPOCH``); Debian packages come from the archive (not a snapshot: the same day gives the
same versions); Python packages are pinned by pyproject.toml's ranges. See docs/kubernetes.md "Images without Docker".

    python3 images/build.py                    # base, busybox, wheel, envserver, operator, catalog, postgres
    python3 images/build.py envserver trainer  # just these (and what they build on: base, wheel)
    python3 images/build.py trainer-eval       # the evaluation image (no torch)
    python3 images/build.py --json             # one JSON record per image on stdout

Needs root (mmdebstrap and buildah in chroot mode), buildah and mmdebstrap (Debian packages).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
SUITE = "bookworm"
# Images of the chart; `trainer` (torch with its CUDA wheels from PyPI: several GB) and
# `trainer-eval` (evaluation Campaigns against an endpoint) only on request.
DEFAULT = ["envserver", "operator", "catalog", "postgres"]
KEEP = 2  # builds kept per image name: the current one and the one before
# Images built from another image's Dockerfile with build arguments of their own: name ->
# (Dockerfile directory, build arguments). The Dockerfile stays the one description.
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {"trainer-eval": ("trainer", {"EXTRAS": "eval"})}
# Images that others build on, by the build argument that names them: each is built (once) before
# the images whose Dockerfile uses that argument, and passed to them as its content-keyed tag.
# WHEEL: the awm package, built only in images/wheel/Dockerfile.
SHARED: dict[str, str] = {"WHEEL": "wheel"}
ALL = [*DEFAULT, "trainer", *VARIANTS, *SHARED.values()]
EPOCH = "0"  # the clamped timestamp of every layer


class BuildError(RuntimeError):
    pass


@dataclass
class Built:
    """One image in the cache."""
    name: str
    ref: str           # localhost/awm-<name>:<key>
    key: str
    archive: str       # docker-archive tar
    image_id: str      # buildah's image id (sha256 of the config)
    size_bytes: int    # of the archive
    build_seconds: float
    cached: bool = False


def cache_dir() -> Path:
    return Path(os.environ.get("AWM_IMAGE_CACHE") or Path.home() / ".cache/awm/images")


def _sha(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


# --------------------------------------------------------------------------- content keys


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    for pat in patterns:
        bare = pat[3:] if pat.startswith("**/") else pat
        if fnmatch.fnmatch(rel, pat) or any(fnmatch.fnmatch(p, bare) for p in parts):
            return True
    return False


def _dockerignore() -> list[str]:
    f = ROOT / ".dockerignore"
    if not f.is_file():
        return []
    return [ln.strip() for ln in f.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def recipe(name: str) -> tuple[Path, dict[str, str]]:
    """The Dockerfile an image is built from and the build arguments its name adds (a variant's)."""
    directory, args = VARIANTS.get(name, (name, {}))
    return IMAGES / directory / "Dockerfile", dict(args)


def copy_sources(dockerfile: Path) -> list[str]:
    """The context paths a Dockerfile's COPY lines name (not --from=stage copies), ARG defaults
    substituted: what the image's content depends on besides the Dockerfile itself."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    args = dict(re.findall(r"^\s*ARG\s+(\w+)=(\S+)", text, re.M))
    out = []
    for line in re.findall(r"^\s*COPY\s+(.+)$", text, re.M):
        words = [w for w in line.split() if not w.startswith("--")]
        if "--from" in line:
            continue
        for src in words[:-1]:
            out.append(re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), src))
    return out


def context_digest(paths: list[str]) -> str:
    """sha256 over the relative names and contents of every file under ``paths`` (.dockerignore
    honoured), in a stable order."""
    patterns = _dockerignore()
    h = hashlib.sha256()
    for p in sorted(set(paths)):
        top = ROOT / p
        files = [top] if top.is_file() else sorted(f for f in top.rglob("*") if f.is_file())
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            if _ignored(rel, patterns):
                continue
            h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


# --------------------------------------------------------------------------- buildah


class Buildah:
    """buildah with its own storage in the cache (never the machine's default storage)."""

    def __init__(self, cache: Path):
        self.root, self.runroot = cache / "storage", cache / "run"
        self.exe = shutil.which("buildah")
        if not self.exe:
            raise BuildError("buildah not found (Debian package `buildah`)")

    def __call__(self, *args: str, capture: bool = True, log: Path | None = None) -> str:
        cmd = [self.exe, "--root", str(self.root), "--runroot", str(self.runroot),
               "--storage-driver", os.environ.get("AWM_BUILDAH_DRIVER", "overlay"), *args]
        if log is not None:
            with open(log, "ab") as f:
                r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            if r.returncode != 0:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                raise BuildError(f"buildah {args[0]} failed (exit {r.returncode}); log {log}:\n{tail}")
            return ""
        r = subprocess.run(cmd, capture_output=capture, text=True, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise BuildError(f"buildah {' '.join(args[:2])} failed: {r.stderr.strip()}")
        return (r.stdout or "").strip()

    def image_id(self, ref: str) -> str | None:
        try:
            return self("inspect", "--type", "image", "--format", "{{.FromImageID}}", ref) or None
        except BuildError:
            return None


def _trust_mounts(tmp: Path) -> list[str]:
    """RUN steps reach PyPI and Debian through this machine's TLS trust (a proxy's CA, if any):
    the host's CA bundle and a pip.conf naming it are mounted for the build only, never stored in
    a layer."""
    bundle = next((p for p in (os.environ.get("SSL_CERT_FILE"), os.environ.get("PIP_CERT"),
                               "/etc/ssl/certs/ca-certificates.crt") if p and Path(p).is_file()), None)
    if bundle is None:
        return []
    conf = tmp / "pip.conf"
    lines = ["[global]", "cert = /etc/ssl/certs/ca-certificates.crt"]
    index = os.environ.get("PIP_INDEX_URL")
    if index:
        lines.append(f"index-url = {index}")
    conf.write_text("\n".join(lines) + "\n")
    return ["-v", f"{bundle}:/etc/ssl/certs/ca-certificates.crt:ro", "-v", f"{conf}:/etc/pip.conf:ro"]


# --------------------------------------------------------------------------- the builds


class Builder:
    def __init__(self, cache: Path | None = None, *, quiet: bool = False):
        self.cache = cache or cache_dir()
        self.cache.mkdir(parents=True, exist_ok=True)
        self.logs = self.cache / "logs"
        self.logs.mkdir(exist_ok=True)
        self.buildah = Buildah(self.cache)
        self.quiet = quiet
        self._tmp = Path(tempfile.mkdtemp(prefix="awm-images-"))

    def say(self, msg: str) -> None:
        if not self.quiet:
            print(msg, file=sys.stderr, flush=True)

    def _record(self, name: str, key: str) -> Path:
        return self.cache / f"{name}-{key}.json"

    def _cached(self, name: str, key: str) -> Built | None:
        rec = self._record(name, key)
        if not rec.is_file():
            return None
        b = Built(**json.loads(rec.read_text()))
        if not Path(b.archive).is_file():
            return None
        # the archive is what a node loads; buildah's storage only speeds up rebuilds on top of it
        if self.buildah.image_id(b.ref) is None:
            self.buildah("pull", "--quiet", f"docker-archive:{b.archive}")
        b.cached = True
        return b

    def _save(self, name: str, key: str, ref: str, seconds: float) -> Built:
        archive = self.cache / f"{name}-{key}.tar"
        part = archive.with_suffix(".tar.part")
        part.unlink(missing_ok=True)
        self.buildah("push", "--quiet", ref, f"docker-archive:{part}:{ref}")
        part.rename(archive)
        b = Built(name=name, ref=ref, key=key, archive=str(archive), image_id=self.buildah.image_id(ref) or "",
                  size_bytes=archive.stat().st_size, build_seconds=round(seconds, 1))
        self._record(name, key).write_text(json.dumps(asdict(b), indent=1))
        return b

    # ---- base images (no Dockerfile: made from Debian packages)
    def base(self) -> Built:
        pkgs = [ln.strip() for ln in (IMAGES / "base/packages.txt").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
        key = _sha("base", SUITE, *pkgs)[:16]
        if (b := self._cached("base", key)):
            return b
        if not shutil.which("mmdebstrap"):
            raise BuildError("mmdebstrap not found (Debian package `mmdebstrap`)")
        t0 = time.monotonic()
        self.say(f"==> base: mmdebstrap {SUITE} minbase + {', '.join(pkgs)}")
        tar = self._tmp / "base.tar"
        log = self.logs / f"base-{key}.log"
        with open(log, "wb") as f:
            r = subprocess.run(["mmdebstrap", "--variant=minbase", "--mode=root",
                                f"--include={','.join(pkgs)}", SUITE, str(tar)],
                               stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "SOURCE_DATE_EPOCH": EPOCH})
        if r.returncode != 0:
            raise BuildError(f"mmdebstrap failed (exit {r.returncode}); log {log}")
        ref = f"localhost/awm-base:{key}"
        self._from_tar(tar, ref, env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                      "LANG": "C.UTF-8"}, cmd=["python3"])
        tar.unlink()
        return self._save("base", key, ref, time.monotonic() - t0)

    def busybox(self) -> Built:
        """Debian's static busybox with its applets linked in /bin: the catalog image's runtime
        stage (it only copies files) and a small utility image."""
        def candidate() -> re.Match | None:
            out = subprocess.run(["apt-cache", "policy", "busybox-static"], capture_output=True, text=True).stdout
            m = re.search(r"Candidate:\s*(\S+)", out)
            return m if m and m.group(1) != "(none)" else None

        m = candidate()
        if m is None:  # a fresh machine may have no package lists yet
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
            m = candidate()
        if m is None:
            raise BuildError("busybox-static is not available from the machine's Debian sources")
        key = _sha("busybox", SUITE, m.group(1))[:16]
        if (b := self._cached("busybox", key)):
            return b
        t0 = time.monotonic()
        self.say(f"==> busybox: busybox-static {m.group(1)}")
        d = self._tmp / "busybox"
        d.mkdir()
        subprocess.run(["apt-get", "download", f"busybox-static={m.group(1)}"], cwd=d, check=True,
                       capture_output=True)
        deb = next(d.glob("*.deb"))
        rootfs = d / "root"
        subprocess.run(["dpkg-deb", "-x", str(deb), str(rootfs)], check=True)
        exe = rootfs / "bin/busybox"
        applets = subprocess.run([str(exe), "--list"], capture_output=True, text=True, check=True).stdout.split()
        for a in applets:
            link = rootfs / "bin" / a
            if not link.exists():
                link.symlink_to("busybox")
        for sub in ("tmp", "etc"):
            (rootfs / sub).mkdir(exist_ok=True)
        (rootfs / "tmp").chmod(0o1777)
        (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
        (rootfs / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
        shutil.rmtree(rootfs / "usr/share", ignore_errors=True)
        tar = d / "rootfs.tar"
        subprocess.run(["tar", "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner",
                        "-C", str(rootfs), "-cf", str(tar), "."], check=True)
        ref = f"localhost/awm-busybox:{key}"
        self._from_tar(tar, ref, env={"PATH": "/bin"}, cmd=["sh"])
        shutil.rmtree(d)
        return self._save("busybox", key, ref, time.monotonic() - t0)

    def _from_tar(self, tar: Path, ref: str, *, env: dict[str, str], cmd: list[str]) -> None:
        c = self.buildah("from", "scratch")
        try:
            self.buildah("add", c, str(tar), "/")
            cfg = ["config", "--cmd", json.dumps(cmd)]
            for k, v in env.items():
                cfg += ["--env", f"{k}={v}"]
            self.buildah(*cfg, c)
            self.buildah("commit", "--quiet", "--timestamp", EPOCH, c, ref)
        finally:
            with contextlib.suppress(BuildError):
                self.buildah("rm", c)

    # ---- the Dockerfiles
    def image(self, name: str, base: Built, busybox: Built | None = None,
              shared: dict[str, Built] | None = None) -> Built:
        """shared: the images of SHARED this one builds on, by build argument (WHEEL=...)."""
        dockerfile, args = recipe(name)
        if not dockerfile.is_file():
            raise BuildError(f"no such image: {name} ({dockerfile} missing)")
        args["BASE"] = base.ref
        if busybox is not None:
            args["BUSYBOX"] = busybox.ref
        for arg, b in (shared or {}).items():
            args[arg] = b.ref
        missing = [a for a in _shared_args(name) if a not in args]
        if missing:
            raise BuildError(f"{name}: build {', '.join(SHARED[a] for a in missing)} first (its Dockerfile uses {', '.join(missing)})")
        # args hold the refs, so the keys, of the base and of the shared images: a new wheel
        # (sources or images/wheel/Dockerfile changed) is a new key for every image on it
        key = _sha(name, dockerfile.read_text(), context_digest(copy_sources(dockerfile)),
                   json.dumps(args, sort_keys=True))[:16]
        if (b := self._cached(name, key)):
            return b
        t0 = time.monotonic()
        on = " ".join(f"{k}={v}" for k, v in args.items() if k == "BASE" or k in SHARED)
        self.say(f"==> {name}: buildah build -f {dockerfile.relative_to(ROOT)} ({on})")
        ref = f"localhost/awm-{name}:{key}"
        log = self.logs / f"{name}-{key}.log"
        log.unlink(missing_ok=True)
        cmd = ["build", "--isolation", "chroot", "--timestamp", EPOCH, "--layers=false",
               *_trust_mounts(self._tmp), "-f", str(dockerfile), "-t", ref]
        for k, v in args.items():
            cmd += ["--build-arg", f"{k}={v}"]
        try:
            self.buildah(*cmd, str(ROOT), log=log)
        finally:
            # buildah (1.28) leaves the working container of a stage that only names an image
            # (`FROM ${WHEEL} AS wheel`): a container per build, and an image no prune can remove
            self.remove_containers({args[a] for a in SHARED if a in args})
        return self._save(name, key, ref, time.monotonic() - t0)

    def remove_containers(self, refs: set[str]) -> None:
        """Remove the buildah containers made from any of these images."""
        if not refs:
            return
        out = self.buildah("containers", "--all", "--format", "{{.ContainerID}} {{.ImageName}}")
        ids = [w[0] for w in map(str.split, out.splitlines()) if len(w) == 2 and w[1] in refs]
        if ids:
            self.buildah("rm", *ids)

    def build(self, names: list[str]) -> list[Built]:
        lock = open(self.cache / ".lock", "w")
        fcntl.flock(lock, fcntl.LOCK_EX)  # two builds sharing a cache wait for each other
        try:
            base = self.base()
            needs_busybox = any(_uses_busybox(n) for n in names)
            busybox = self.busybox() if needs_busybox else None
            out = [base] + ([busybox] if busybox else [])
            shared: dict[str, Built] = {}
            # the shared images first (those asked for or used by one asked for), then the rest
            wanted = {a for n in names for a in _shared_args(n)} | {a for a, n in SHARED.items() if n in names}
            order = [n for a, n in SHARED.items() if a in wanted] + [n for n in names if n not in SHARED.values()]
            for n in order:
                b = self.image(n, base, busybox if _uses_busybox(n) else None,
                               {a: shared[a] for a in _shared_args(n)})
                self.say(f"    {n}: {b.ref} {b.size_bytes / 1e6:.0f} MB "
                         f"{'cached' if b.cached else f'built in {b.build_seconds:.0f} s'}")
                shared.update({a: b for a, s in SHARED.items() if s == n})
                out.append(b)
            self.prune(out)
            return out
        finally:
            lock.close()
            shutil.rmtree(self._tmp, ignore_errors=True)

    def prune(self, current: list[Built], keep: int = KEEP) -> None:
        """Drop what superseded builds left: every image name keeps its current build and the
        newest `keep - 1` others (switching back a commit stays a cache hit). Without this the
        cache grows by ~1.5 GB per source change (one archive and one storage copy per image) until
        a shared machine's disk is full, which is how a CI run once failed."""
        for b in current:
            records = sorted((r for r in self.cache.glob(f"{b.name}-*.json")
                              if re.fullmatch(rf"{re.escape(b.name)}-[0-9a-f]{{16}}", r.stem)),  # not trainer-eval for trainer
                             key=lambda r: r.stat().st_mtime, reverse=True)
            old = [r for r in records if r.stem != f"{b.name}-{b.key}"][max(keep - 1, 0):]
            kept = {b.ref} | {f"localhost/awm-{b.name}:{r.stem[len(b.name) + 1:]}" for r in records if r not in old}
            for r in old:
                key = r.stem[len(b.name) + 1:]
                for f in (r, r.with_suffix(".tar"), self.logs / f"{b.name}-{key}.log"):
                    f.unlink(missing_ok=True)
            # storage: every tag of this name not kept (also tags whose records are long gone)
            tags = self.buildah("images", "--format", "{{.Name}}:{{.Tag}}").split()
            stale = [t for t in tags if t.rpartition(":")[0] == f"localhost/awm-{b.name}" and t not in kept]
            if stale:
                self.remove_containers(set(stale))  # (left by an interrupted build)
                self.buildah("rmi", *stale)  # a tag sharing its image with a kept one is only untagged
                self.say(f"    {b.name}: pruned {len(stale)} superseded build(s)")


def _uses_busybox(name: str) -> bool:
    return "${BUSYBOX}" in recipe(name)[0].read_text()


def _shared_args(name: str) -> list[str]:
    """The build arguments of SHARED that an image's Dockerfile uses (its FROM ${WHEEL})."""
    text = recipe(name)[0].read_text()
    return [a for a in SHARED if re.search(rf"^\s*FROM\s+\$\{{{a}\}}", text, re.M)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"images to build (default: {' '.join(DEFAULT)}; also: {', '.join(n for n in ALL if n not in DEFAULT)}; "
                    "what they build on comes first)")
    ap.add_argument("--json", action="store_true", help="print one JSON record per image on stdout")
    a = ap.parse_args(argv)
    names = a.names or DEFAULT
    unknown = [n for n in names if n not in ALL]
    if unknown:
        ap.error(f"unknown image(s): {', '.join(unknown)} (known: {', '.join(ALL)})")
    if os.geteuid() != 0:
        print("images/build.py: needs root (mmdebstrap and buildah's chroot isolation)", file=sys.stderr)
        return 1
    try:
        built = Builder(quiet=False).build(names)
    except BuildError as exc:
        print(f"images/build.py: {exc}", file=sys.stderr)
        return 1
    for b in built:
        print(json.dumps(asdict(b)) if a.json else f"{b.ref}\t{b.archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
