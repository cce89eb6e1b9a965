"""The container images (images/<component>/Dockerfile), without a Docker engine.

Fast: each Dockerfile parses, is multi-stage, pins every base image by tag (or digest), runs as a
non-root user, has an exec-form ENTRYPOINT, copies only files that exist, and keeps pip out of the
final stage.

The awm package is built in one place, images/wheel/Dockerfile (the wheel every image installs
through its WHEEL build argument): no other Dockerfile copies the package's sources.

Slow: each image's build is replayed on the host: the wheel as images/wheel/Dockerfile builds it
(the files its COPY lines name copied into an empty directory, its `pip wheel`), then a clean
virtualenv gets exactly the `pip install` of the image's RUN line, and the image's commands run
from that virtualenv: the entrypoint, and for the env-server image also the
commands the operator puts in env pods (operator/awm_operator/pods.py). That catches a missing
COPY, a missing extra or a broken entrypoint before anyone builds the image.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest

from images import build as image_build
from tests.conftest import require
from tests.test_chart import helm  # noqa: F401  (the fixture: the chart's UI command below)

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
NAMES = ["envserver", "operator", "trainer", "catalog", "postgres"]
# Images that are built on, never run: the awm package's wheel (images/build.py SHARED).
SHARED = dict(image_build.SHARED)  # build argument -> images/<dir>
# Where the wheel image keeps the wheel, and the wheel's file name pattern.
WHEELS = "/wheels"
WHEEL_GLOB = "awm_fleet-*.whl"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, instr: str) -> list[str]:
        return [args for i, args in self.instructions if i == instr]


def parse(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """(ARG defaults, stages) of a Dockerfile: continuation lines joined, comments dropped."""
    logical, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        instr, _, rest = line.partition(" ")
        instr, rest = instr.upper(), rest.strip()
        if instr == "FROM":
            words = rest.split()
            stages.append(Stage(words[0], words[2] if len(words) >= 3 and words[1].upper() == "AS" else None))
        elif instr == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            args[k] = v
        elif stages:
            stages[-1].instructions.append((instr, rest))
    return args, stages


def dockerfile(name: str) -> tuple[dict[str, str], list[Stage]]:
    return parse(IMAGES / name / "Dockerfile")


def test_every_component_has_an_image() -> None:
    assert sorted(p.name for p in IMAGES.iterdir() if (p / "Dockerfile").is_file()) == sorted(NAMES + list(SHARED.values()))


def build_stage(stages: list[Stage]) -> Stage:
    """The stage that installs awm (its `pip install`)."""
    return next(s for s in stages if any("pip install" in r for r in s.all("RUN")))


@pytest.mark.parametrize("name", NAMES)
def test_dockerfile_rules(name: str) -> None:
    args, stages = dockerfile(name)
    if any("pip install" in r for s in stages for r in s.all("RUN")):
        assert len(stages) >= 2, "multi-stage: build tools stay out of the final image"
    seen: set[str] = set()
    for stage in stages:
        if stage.base in seen:
            continue
        shared = re.fullmatch(r"\$\{(\w+)\}", stage.base)
        if shared and shared.group(1) in SHARED:
            # an image built from this checkout (images/wheel/Dockerfile): its tag as documented
            assert args[shared.group(1)] == f"awm-{SHARED[shared.group(1)]}", stage.base
            seen.add(stage.name or stage.base)
            continue
        # a variable base (images/build.py substitutes a locally built one) defaults to a pinned tag
        ref = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), stage.base)
        assert "$" not in ref, f"FROM {stage.base}: a variable without a pinned default"
        if "@sha256:" not in ref:
            image, _, tag = ref.rpartition(":")
            assert image and "/" not in tag, f"FROM {ref}: no tag"
            assert tag != "latest" and re.search(r"\d", tag), f"FROM {ref}: pin a version tag"
        if stage.name:
            seen.add(stage.name)
    final = stages[-1]
    users = final.all("USER")
    assert users, "the final stage must set USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0") and (not user.isdigit() or int(user) > 0), users[-1]
    entry = final.all("ENTRYPOINT")
    assert entry, "ENTRYPOINT missing"
    assert isinstance(json.loads(entry[-1]), list), "ENTRYPOINT must be exec form (a JSON array)"
    assert not any("pip install" in r for r in final.all("RUN")), "pip belongs in the build stage"
    for stage in stages:
        for copy in stage.all("COPY"):
            if copy.startswith("--from"):
                continue
            for src in copy.split()[:-1]:
                src = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], src)
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
    final_base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), final.base)
    if "python" in final_base:  # the final stage runs Python
        env = " ".join(final.all("ENV"))
        assert "PYTHONDONTWRITEBYTECODE=1" in env, "read-only root: no .pyc writes at run time"
        compile_runs = [r for s in stages for r in s.all("RUN") if "compileall" in r]
        assert compile_runs, "precompile bytecode"
        # images/build.py clamps layer timestamps: mtime-checked .pyc files would all be stale
        assert all("--invalidation-mode unchecked-hash" in r for r in compile_runs), compile_runs


def test_one_build_of_the_package() -> None:
    """images/wheel/Dockerfile is the only place the awm package is built: it copies every source
    folder pyproject.toml maps to a package and builds one wheel into /wheels of an image holding
    nothing else; every image that runs awm installs that wheel (FROM ${WHEEL}, COPY --from) and
    copies none of the sources itself."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = {d.split("/")[0] for d in project["tool"]["setuptools"]["package-dir"].values() if d != "."}
    sources = {"pyproject.toml", project["project"]["readme"], "awm", *folders}
    [(arg, directory)] = SHARED.items()
    assert (arg, directory) == ("WHEEL", "wheel")
    args, stages = dockerfile(directory)
    build, final = stages[0], stages[-1]
    copied = {src for copy in build.all("COPY") for src in copy.split()[:-1]}
    assert copied == sources, f"the wheel's build stage copies {sorted(copied)}, the package is {sorted(sources)}"
    [run] = build.all("RUN")
    assert f"pip wheel --no-deps --wheel-dir {WHEELS} ." in run, run
    assert final.base == "scratch" and final.all("COPY") == [f"--from=build {WHEELS} {WHEELS}"]
    assert [i for i, _ in final.instructions] == ["COPY"], "the wheel image holds the wheel and nothing else"

    users = [n for n in NAMES if any("pip install" in r for s in dockerfile(n)[1] for r in s.all("RUN"))]
    assert sorted(users) == ["catalog", "envserver", "operator", "trainer"]
    for name in NAMES:
        args, stages = dockerfile(name)
        for stage in stages:
            for copy in stage.all("COPY"):
                if not copy.startswith("--from"):
                    for src in copy.split()[:-1]:
                        src = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], src)
                        # (a catalog's data may come from inside awm/: the catalog image's awm/starter)
                        assert src not in sources and src.split("/")[0] not in sources - {"awm"}, \
                            f"{name}: COPY {src}: the package's sources go into images/wheel/Dockerfile only"
        if name not in users:
            continue
        assert args[arg] == "awm-wheel"
        assert [s.name for s in stages if s.base == "${WHEEL}"] == ["wheel"], name
        build = build_stage(stages)
        assert f"--from=wheel {WHEELS} {WHEELS}" in build.all("COPY"), name
        install = pip_install_args(build, {**args, "EXTRAS": "x"})
        assert len(install) == 1 and install[0].startswith(f"$(ls {WHEELS}/{WHEEL_GLOB})"), install
        # the shared image's build argument is what images/build.py passes
        assert image_build._shared_args(name) == [arg]


# --------------------------------------------------------------------------- replaying builds


@dataclass
class Built:
    src: Path
    venv: Path

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def run(self, *argv: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        """argv as the image would run it: `python`/`awm` resolve to the virtualenv's."""
        argv_l = list(argv)
        if (self.venv / "bin" / argv_l[0]).exists():
            argv_l[0] = self.bin(argv_l[0])
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWM_", "VIRTUAL_ENV", "PYTHON"))}
        clean["PATH"] = f"{self.venv / 'bin'}:{clean.get('PATH', '')}"
        # cwd: not the source tree (`python -m` puts its cwd first on sys.path, where a copied
        # awm/ without its component folders would shadow the installed package); the images run
        # from WORKDIR /tmp.
        return subprocess.run(argv_l, capture_output=True, text=True, cwd=self.src.parent, timeout=timeout,
                              env={**clean, **(env or {})})


def pip_args(stage: Stage, args: dict[str, str], command: str = "install") -> list[str]:
    """The arguments of the stage's `pip <command>`, build arguments substituted (``${EXTRAS}``)."""
    for run in stage.all("RUN"):
        m = re.search(rf"pip {command} ((?:\"[^\"]+\"|'[^']+'|[^&\s]+)(?: (?:\"[^\"]+\"|'[^']+'|[^&\s]+))*)", run)
        if m:
            return [re.sub(r"\$\{(\w+)\}", lambda v: args[v.group(1)], a) for a in shlex.split(m.group(1))]
    raise AssertionError(f"no pip {command} in the build stage")


def pip_install_args(stage: Stage, args: dict[str, str]) -> list[str]:
    return pip_args(stage, args, "install")


def copy_context(stage: Stage, args: dict[str, str], src: Path) -> None:
    """The stage's COPY lines from the build context (not --from) into src (its WORKDIR)."""
    for copy in stage.all("COPY"):
        if copy.startswith("--from"):
            continue
        *sources, dest = copy.split()
        for s in sources:
            s = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], s)
            target = src / dest.lstrip("/")  # WORKDIR /src: relative and absolute land in src
            origin = ROOT / s
            if origin.is_dir():
                shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target if not dest.endswith("/") else target / origin.name)


def replay(name: str, tmp: Path, preinstall=None, build_args: dict[str, str] | None = None) -> Built:
    """Build the wheel as images/wheel/Dockerfile does (its COPYs into tmp/wheel-src, its `pip
    wheel` into tmp/wheels), copy what the image's build stage COPYs from the context into tmp/src,
    then `pip install` as its RUN line does (the wheel found in tmp/wheels) into a fresh virtualenv
    (preinstall(venv) may seed it first). build_args override the Dockerfile's ARG defaults, as
    `--build-arg` does."""
    defaults, stages = dockerfile(name)
    args = {**defaults, **(build_args or {})}
    build = build_stage(stages)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "--quiet", "--disable-pip-version-check"]
    wheels = tmp / WHEELS.lstrip("/")
    wheel_args, wheel_stages = dockerfile(SHARED["WHEEL"])
    wheel_src = tmp / "wheel-src"
    wheel_src.mkdir()
    copy_context(wheel_stages[0], wheel_args, wheel_src)
    cmd = [*pip, "wheel", *(str(wheels) if a == WHEELS else a for a in pip_args(wheel_stages[0], wheel_args, "wheel"))]
    r = subprocess.run(cmd, cwd=wheel_src, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    src = tmp / "src"
    src.mkdir()
    copy_context(build, args, src)
    if preinstall:
        preinstall(venv)

    def wheel_file(m: re.Match) -> str:  # the RUN line's `$(ls /wheels/<glob>)`: exactly one wheel
        found = sorted(wheels.glob(m.group(1)))
        assert len(found) == 1, f"{m.group(0)}: {found}"
        return str(found[0])

    install = [re.sub(rf"\$\(ls {WHEELS}/([^)]+)\)", wheel_file, a) for a in pip_install_args(build, args)]
    pip = [*pip[:1], "install", *pip[1:], *install]
    r = subprocess.run(pip, cwd=src, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, f"{' '.join(pip)}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return Built(src, venv)


def entrypoint(name: str) -> list[str]:
    return json.loads(dockerfile(name)[1][-1].all("ENTRYPOINT")[-1])


def command_head(argv: list[str]) -> list[str]:
    """The program part of a command line: `python -m mod` or the words before the first option."""
    if argv[:2] == ["python", "-m"]:
        return argv[:3]
    head = []
    for word in argv:
        if word.startswith("-"):
            break
        head.append(word)
    return head


def pod_commands(binding: str = "pinned") -> dict[str, list[str]]:
    """container name -> command, from the operator's env-pod manifest (catalog from an image)."""
    from awm_operator.config import OperatorConfig
    from awm_operator.crds import EnvFleetSpec
    from awm_operator.pods import pod_manifest
    spec = EnvFleetSpec.model_validate({"environments": ["crm"], "catalog": {"image": "awm-catalog:0.1.0"},
                                        "database": {"secretName": "awm-database"}, "binding": binding})
    pod = pod_manifest("demo", "default", "uid", spec, "crm", OperatorConfig())
    containers = pod["spec"]["initContainers"] + pod["spec"]["containers"]
    return {c["name"]: c["command"] for c in containers}


@pytest.mark.slow
def test_envserver_image_commands(tmp_path: Path, helm: str) -> None:
    from tests.test_chart import one, render

    built = replay("envserver", tmp_path)
    commands = {"entrypoint": entrypoint("envserver")}
    commands.update({k: v for k, v in pod_commands().items() if k in ("provision", "envserver")})
    # a late-binding pod's (the default binding): its provisioner sidecar and its env server
    commands.update({f"late {k}": v for k, v in pod_commands("late").items() if k in ("provisioner", "envserver")})
    # the chart's web view runs `awm ui` from this image (charts/awm/templates/ui.yaml)
    ui = one(render(helm, "ui.enabled=true", "ui.runsClaim=runs"), "Deployment", "awm-ui")["spec"]["template"]["spec"]
    commands["ui"] = ui["containers"][0]["command"] + ui["containers"][0]["args"]
    assert set(commands) == {"entrypoint", "provision", "envserver", "late provisioner", "late envserver", "ui"}
    for what, argv in commands.items():
        r = built.run(*command_head(argv), "--help")
        assert r.returncode == 0 and "usage" in (r.stdout + r.stderr).lower(), f"{what}: {argv}\n{r.stdout}\n{r.stderr}"
        # Every option the pod passes is one the program accepts.
        for option in (w.split("=", 1)[0] for w in argv if w.startswith("--")):
            assert option in r.stdout, f"{what}: {option} not in `{' '.join(command_head(argv))} --help`"
    # No torch in the env server (it is the trainer's), and AWM-1K apps can run.
    r = built.run("python", "-c", "import importlib.util as u; print(u.find_spec('torch') is None); "
                  "import fastapi, sqlalchemy, pyseccomp, awm.sandbox.appshim, awm.envserver.mcp")
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_operator_image_entrypoint(tmp_path: Path) -> None:
    """`python -m awm_operator` from the replayed image serves /healthz against a real API server
    (k8s/harness.py; skipped without its binaries unless CI=true)."""
    built = replay("operator", tmp_path)
    argv = entrypoint("operator")
    r = built.run("awm", "operator", "run", "--help")
    assert r.returncode == 0 and "AWM_" in r.stdout, r.stdout + r.stderr
    r = built.run("python", "-c", "import awm_operator.main, awm_operator.handlers")
    assert r.returncode == 0, r.stderr

    from k8s import harness

    require(harness.binaries_present(), f"Kubernetes test binaries missing in {harness.default_bin_dir()}: "
            "run k8s/build.sh (the entrypoint's imports were checked)")
    cp = harness.ControlPlane(nodes=1)
    cp.start(tmp_path / "k8s")
    proc = None
    try:
        cp.kubectl("apply", "-f", str(ROOT / "charts" / "awm" / "crds"))
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/envfleets.awm.dev", "crd/envclaims.awm.dev")
        api, metrics = _free_port(), _free_port()
        env = {"KUBECONFIG": cp.kubeconfig, "AWM_NAMESPACES": "default", "AWM_API_PORT": str(api),
               "AWM_METRICS_PORT": str(metrics), "HOME": str(tmp_path)}
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWM_", "VIRTUAL_ENV", "PYTHON", "KUBERNETES_"))}
        argv = [built.bin(argv[0]), *argv[1:]] if (built.venv / "bin" / argv[0]).exists() else argv
        proc = subprocess.Popen(argv, cwd=tmp_path, env={**clean, **env}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        deadline, body = time.monotonic() + 60, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{api}/healthz", timeout=2) as resp:
                    body = resp.read().decode()
                    break
            except OSError:
                time.sleep(0.5)
        assert body == "ok", f"no /healthz (exit {proc.poll()})"
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as resp:
            assert "awm_" in resp.read().decode()
    finally:
        if proc is not None:
            proc.terminate()
            try:
                out, _ = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
        cp.stop()


def _seed_torch(venv: Path) -> None:
    """Link the test environment's torch (and what it requires) into a fresh virtualenv, so the
    Dockerfile's `pip install .[trainer]` finds it satisfied instead of downloading ~3 GB of CUDA
    wheels; every other package is installed by that pip command as in the image."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    site = next((venv / "lib").glob("python3*/site-packages"))
    todo, done = ["torch"], set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in done:
            continue
        done.add(name)
        dist = metadata.distribution(name)
        for req in dist.requires or []:
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
        for f in dist.files or []:
            if str(f).startswith(".."):
                continue  # scripts outside site-packages (torchrun...): not needed here
            origin, target = Path(dist.locate_file(f)), site / f
            if origin.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(origin, target)
                except OSError:
                    shutil.copy2(origin, target)


@pytest.mark.slow
def test_trainer_image_entrypoint(tmp_path: Path) -> None:
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    require(torch_version, "torch is not installed in the test environment, and the trainer image's "
            "`pip install .[trainer]` would download ~3 GB of torch + CUDA wheels")
    built = replay("trainer", tmp_path, preinstall=_seed_torch)
    argv = entrypoint("trainer")
    for sub in ("train", "eval", "agent"):
        r = built.run(*argv, sub, "--help")
        assert r.returncode == 0 and "Usage" in r.stdout, f"{sub}: {r.stdout}\n{r.stderr}"
    # awm.trainer.k8s_source: inside a campaign's Job the trainer claims through the operator's client
    r = built.run("python", "-c", "import importlib.metadata as m, torch, transformers, awm.trainer.grpo, "
                  "awm.trainer.k8s_source; print(m.version('torch'), int(torch.ones(3).sum()))")
    assert r.returncode == 0 and r.stdout.split() == [torch_version, "3"], r.stdout + r.stderr


@pytest.mark.slow
def test_trainer_eval_image_runs_awm_eval_without_torch(tmp_path: Path) -> None:
    """The evaluation image (images/build.py's `trainer-eval`: the trainer Dockerfile with the
    build arguments below) installs no torch, and what an evaluation Campaign's Job runs works:
    `awm eval` and the modules of its path inside a Job (the operator's allocation client)."""
    dockerfile_dir, build_args = image_build.VARIANTS["trainer-eval"]
    assert dockerfile_dir == "trainer" and build_args == {"EXTRAS": "eval"}
    built = replay("trainer", tmp_path, build_args=build_args)
    argv = entrypoint("trainer")
    for sub in ("eval", "agent"):
        r = built.run(*argv, sub, "--help")
        assert r.returncode == 0 and "Usage" in r.stdout, f"{sub}: {r.stdout}\n{r.stderr}"
    r = built.run("python", "-c", "import importlib.util as u, sys; import awm.trainer.eval, awm.trainer.k8s_source, "
                  "awm.trainer.policy, matplotlib.pyplot; print([m for m in ('torch', 'transformers', 'peft') "
                  "if u.find_spec(m) is not None])")
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


@pytest.mark.slow
def test_catalog_image_build(tmp_path: Path) -> None:
    """The catalog image's build step (`awm catalog export`) yields <env>.json files that load as
    bundles, at the path the operator's `bundle` init container copies from."""
    built = replay("catalog", tmp_path)
    _, stages = dockerfile("catalog")
    export = next(r for r in build_stage(stages).all("RUN") if "catalog export" in r)
    m = re.search(r"awm catalog export (\S+) --catalog (\S+)", export)
    assert m, export
    out, src = tmp_path / m.group(1).lstrip("/"), built.src / m.group(2).lstrip("/")
    r = built.run("awm", "catalog", "export", str(out), "--catalog", str(src))
    assert r.returncode == 0, r.stdout + r.stderr
    from awm.bundle import EnvBundle
    from awm.catalog import INDEX

    files = sorted(p.name for p in out.glob("*.json") if p.name != INDEX)
    assert files == ["bike_shop.json", "crm.json", "project_tracker.json"]
    # index.json (read by environmentSelector) lists exactly the exported bundles
    index = json.loads((out / INDEX).read_text())
    assert sorted(e["name"] if isinstance(e, dict) else e for e in index["environments"]) == \
        [f.removesuffix(".json") for f in files]

    for f in files:
        assert EnvBundle.model_validate_json((out / f).read_text()).name == f.removesuffix(".json")
    # The final stage holds them where the chart's default says (catalog.path: /catalog), and the
    # operator's init container copies <path>/<env>.json.
    final = stages[-1]
    assert any(c.split()[-1] == "/catalog" for c in final.all("COPY"))
    bundle_cmd = pod_commands()["bundle"]
    assert bundle_cmd[:2] == ["cp", "/catalog/crm.json"], bundle_cmd


def test_builder_prunes_superseded_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """images/build.py keeps, per image name, the current build and the one before (archive,
    record, log, storage tag) and drops the rest; another name sharing a prefix (trainer-eval for
    trainer) is left alone. A unit test: buildah is replaced by a recorder of its commands (the
    real builds run in tests/test_realnode.py and .ci/run)."""
    mod = image_build
    calls: list[tuple[str, ...]] = []

    class FakeBuildah:
        def __call__(self, *args: str, **_: object) -> str:
            calls.append(args)
            if args[0] == "images":
                return "\n".join(f"localhost/awm-{n}:{k}" for n, k in [
                    ("trainer", "a" * 16), ("trainer", "b" * 16), ("trainer", "c" * 16),
                    ("trainer", "d" * 16), ("trainer-eval", "e" * 16)])
            return ""

    monkeypatch.setattr(mod, "Buildah", lambda cache: FakeBuildah())
    builder = mod.Builder(tmp_path)
    for i, key in enumerate(["a" * 16, "b" * 16, "c" * 16, "e" * 16]):
        name = "trainer-eval" if key == "e" * 16 else "trainer"
        for suffix in (".json", ".tar"):
            f = tmp_path / f"{name}-{key}{suffix}"
            f.write_text("x")
            os.utime(f, (1000 + i, 1000 + i))
    current = mod.Built(name="trainer", ref=f"localhost/awm-trainer:{'a' * 16}", key="a" * 16,
                        archive=str(tmp_path / f"trainer-{'a' * 16}.tar"), image_id="", size_bytes=1,
                        build_seconds=0.0)
    builder.prune([current])
    shutil.rmtree(builder._tmp)  # what build() removes when it ends (not called here)
    left = sorted(p.name for p in tmp_path.glob("*-*.*"))
    # current (a, oldest by mtime), the newest other (c), and trainer-eval untouched; b gone
    assert left == sorted(f"{n}-{k}{s}" for n, k in [("trainer", "a" * 16), ("trainer", "c" * 16),
                                                        ("trainer-eval", "e" * 16)] for s in (".json", ".tar"))
    rmi = [c for c in calls if c[0] == "rmi"]
    assert rmi == [("rmi", f"localhost/awm-trainer:{'b' * 16}", f"localhost/awm-trainer:{'d' * 16}")]


def test_builder_builds_the_wheel_first_and_keys_images_on_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """images/build.py builds the shared wheel image once, before the images that install it,
    passes its tag as WHEEL, and an image's key follows the wheel's: a change to how the package
    is built (or to its sources) rebuilds every image on it. buildah replaced by a recorder."""
    mod = image_build
    builds: list[list[str]] = []
    removed: list[str] = []

    class FakeBuildah:
        def __call__(self, *args: str, **_: object) -> str:
            if args[0] == "build":
                builds.append(list(args))
            if args[0] == "containers":  # buildah 1.28 leaves the `FROM ${WHEEL} AS wheel` stage's container
                refs = [b[b.index("-t") + 1] for b in builds]
                return "\n".join(f"c{i}   {ref}" for i, ref in enumerate(refs) if "awm-wheel" in ref)
            if args[0] == "rm":
                removed.extend(args[1:])
            return ""

        def image_id(self, ref: str) -> str | None:
            return None

    monkeypatch.setattr(mod, "Buildah", lambda cache: FakeBuildah())
    builder = mod.Builder(tmp_path, quiet=True)

    def fake(name: str, key: str) -> image_build.Built:
        return mod.Built(name=name, ref=f"localhost/awm-{name}:{key}", key=key, archive="", image_id="",
                         size_bytes=0, build_seconds=0.0)

    monkeypatch.setattr(builder, "base", lambda: fake("base", "b" * 16))
    monkeypatch.setattr(builder, "busybox", lambda: fake("busybox", "c" * 16))
    monkeypatch.setattr(builder, "prune", lambda current: None)
    monkeypatch.setattr(builder, "_save", lambda name, key, ref, seconds: fake(name, key))
    # the wheel's key is in every image's key on it
    base = fake("base", "b" * 16)
    one = builder.image("envserver", base, None, {"WHEEL": fake("wheel", "1" * 16)})
    two = builder.image("envserver", base, None, {"WHEEL": fake("wheel", "2" * 16)})
    assert one.key != two.key and one.key == builder.image("envserver", base, None, {"WHEEL": fake("wheel", "1" * 16)}).key
    with pytest.raises(mod.BuildError, match="build wheel first"):
        builder.image("operator", base)
    builds.clear()
    removed.clear()

    built = {b.name: b for b in builder.build(["envserver", "catalog", "postgres", "trainer-eval"])}
    order = [b[b.index("-t") + 1].split(":")[0] for b in builds]  # the tags built, in order
    assert order == [f"localhost/awm-{n}" for n in ("wheel", "envserver", "catalog", "postgres", "trainer-eval")]
    # the wheel built once; every image that runs awm gets its tag as WHEEL (postgres runs none)
    for tag, b in zip(order[1:], builds[1:]):
        assert (f"WHEEL={built['wheel'].ref}" in b) == (tag != "localhost/awm-postgres"), b

    # the containers buildah leaves from the wheel image are removed after each image on it
    assert removed == ["c0"] * 3, removed
