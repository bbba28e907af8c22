"""`make compose-images`: the images compose/ci.yml runs, built here with no registry.

    base        debootstrap --variant=minbase bookworm, then `docker import`
    etcd, redis, prometheus
                Debian's packages on that base (compose/images/*.Dockerfile)
    pydeps      Debian's Python 3.11 + Java + the project's dependencies, from wheels
                built on the host with `pip wheel` (pip in a container does not trust this
                machine's certificate chain)
    quire       pydeps + the tree (the packages pyproject.toml lists), installed editable
    s3          pydeps + moto[server]: the S3 server of the tests, in place of MinIO

Every tag is `quire-ci/<name>:<hash>` of what goes into that image (its Dockerfile, its
parent's tag, the pinned requirements, the tree's files), so an unchanged tree rebuilds
nothing and a changed file rebuilds only the quire image. Older tags of the same images
are removed after a build. The tags are written to build/compose/images.env (read by
compose/smoke.py and by `docker compose --env-file`).

Runs with the project's venv Python against the daemon in $DOCKER_HOST (compose/engine.sh).
Stdlib only, plus `packaging` (pip's own dependency, in every venv here)."""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
IMAGES = REPO / "compose" / "images"
OUT = REPO / "build" / "compose"
PREFIX = "quire-ci"
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
EXTRA = ["flower>=2.0"]            # compose/Dockerfile installs Flower beside the dependencies
S3 = ["moto[server]>=5"]           # the S3 server of the tests (pyproject's dev extra)
ENV = {**os.environ, "DOCKER_BUILDKIT": "0"}  # the classic builder: BuildKit would pull its frontend


def log(msg: str) -> None:
    print(f"[compose-images] {msg}", flush=True)


def run(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=True, env=ENV, **kw)


def digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:12]


def exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True, env=ENV).returncode == 0


# -- pins: the dependency closure as installed in this venv -------------------------------

# Debian bookworm's python3 (the containers' Python): markers such as redis's
# `python_full_version < "3.11.3"` are evaluated for it, not for the host's Python.
TARGET = {"python_version": "3.11", "python_full_version": "3.11.2",
          "implementation_version": "3.11.2"}


def closure(requirements: list[str]) -> tuple[list[str], list[str]]:
    """(`name==version` of every distribution `requirements` pull in, as installed in
    the running venv: the versions the test suite runs with; the requirements the
    containers' Python needs beyond those, e.g. backports the host's newer Python does
    not), markers and extras honoured."""
    pins: dict[str, str] = {}
    missing: list[str] = []
    todo = [(Requirement(r), "") for r in requirements]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, extra = todo.pop()
        if req.marker and not req.marker.evaluate({**TARGET, "extra": extra}):
            continue
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            missing.append(str(Requirement(f"{req.name}{req.specifier}")))
            continue
        pins[key[0]] = dist.version
        for dep in dist.requires or []:
            dreq = Requirement(dep)
            for want in [""] + sorted(req.extras):
                if dreq.marker is None or dreq.marker.evaluate({**TARGET, "extra": want}):
                    todo.append((dreq, want))
                    break
    return [f"{n}=={v}" for n, v in sorted(pins.items())], sorted(set(missing))


def wheels(reqs: tuple[list[str], list[str]], tag: str) -> Path:
    """A context directory with wheels/ (built or cached by pip on the host: one per pin,
    then the others with their dependencies, held to the pins) and wheels/requirements.txt."""
    pins, others = reqs
    ctx = OUT / f"ctx-{tag.replace('/', '-').replace(':', '-')}"
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "wheels").mkdir(parents=True)
    pinned = ctx / "pins.txt"
    pinned.write_text("\n".join(pins) + "\n")
    (ctx / "wheels" / "requirements.txt").write_text("\n".join(pins + others) + "\n")
    started = time.monotonic()
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "-w", str(ctx / "wheels")]
    for argv in ([*pip, "--no-deps", "-r", str(pinned)], [*pip, "-c", str(pinned), *others] if others else None):
        if argv is None:
            continue
        proc = subprocess.run(argv, capture_output=True, text=True, env=ENV)
        if proc.returncode != 0:  # pip's warnings only when it failed
            sys.stderr.write(proc.stdout[-6000:] + proc.stderr[-6000:])
            sys.exit(f"pip wheel for {tag} failed")
    log(f"{len(list((ctx / 'wheels').glob('*.whl')))} wheels for {tag} in {time.monotonic() - started:.0f}s")
    return ctx


# -- the tree -----------------------------------------------------------------------------

def tree_files() -> list[Path]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = sorted({p.rstrip("*") for p in include})
    files = [REPO / "pyproject.toml", REPO / "README.md"]
    for package in packages:
        for path in sorted((REPO / package).rglob("*")):
            rel = path.relative_to(REPO).parts
            if path.is_file() and "__pycache__" not in rel and not path.name.endswith(".pyc") \
                    and not any(part.endswith(".egg-info") for part in rel):
                files.append(path)
    return files


def tree_context(files: list[Path], tag: str) -> Path:
    ctx = OUT / f"ctx-{tag.replace('/', '-').replace(':', '-')}"
    shutil.rmtree(ctx, ignore_errors=True)
    for path in files:
        dest = ctx / path.relative_to(REPO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    return ctx


# -- building -----------------------------------------------------------------------------

def build(name: str, tag: str, ctx: Path, **args: str) -> None:
    started = time.monotonic()
    argv = ["docker", "build", "--force-rm", "--network", "host", "--label", f"{PREFIX}=1",
            "-f", str(IMAGES / f"{name}.Dockerfile"), "-t", tag]
    for key, value in args.items():
        argv += ["--build-arg", f"{key}={value}"]
    proc = subprocess.run([*argv, str(ctx)], capture_output=True, text=True, env=ENV)
    if proc.returncode != 0:  # the classic builder's output only when it failed
        sys.stderr.write(proc.stdout[-6000:] + proc.stderr[-6000:])
        sys.exit(f"docker build of {tag} failed")
    log(f"built {tag} in {time.monotonic() - started:.0f}s")


def base_image() -> str:
    setup = (IMAGES / "base-setup.sh").read_text()
    tag = f"{PREFIX}/debian:{SUITE}-{digest('minbase', SUITE, MIRROR, setup)}"
    if exists(tag):
        return tag
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="quire-ci-rootfs-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "rootfs"
        run("debootstrap", "--variant=minbase", SUITE, str(root), MIRROR, stdout=subprocess.DEVNULL)
        shutil.copy(IMAGES / "base-setup.sh", root / "tmp" / "base-setup.sh")
        run("chroot", str(root), "/bin/sh", "/tmp/base-setup.sh")
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."],
                               stdout=subprocess.PIPE)
        run("docker", "import", "--change", "CMD [\"/bin/bash\"]", "-", tag,
            stdin=tar.stdout, stdout=subprocess.DEVNULL)
        if tar.wait() != 0:
            sys.exit("tar of the debootstrapped root failed")
    log(f"built {tag} (debootstrap + import) in {time.monotonic() - started:.0f}s")
    return tag


def prune(current: dict[str, str]) -> None:
    """Remove quire-ci images other than the current tags (old trees' images)."""
    keep = set(current.values())
    out = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}",
                          f"{PREFIX}/*"], capture_output=True, text=True, env=ENV).stdout
    stale = [t for t in out.split() if t not in keep and not t.endswith(":<none>")]
    if stale:
        subprocess.run(["docker", "rmi", *stale], capture_output=True, env=ENV)
        log(f"removed {len(stale)} older image tag(s)")
    # and what failed builds left (untagged, but labelled by build() as ours)
    subprocess.run(["docker", "image", "prune", "-f", "--filter", f"label={PREFIX}=1"],
                   capture_output=True, env=ENV)


def main() -> int:
    started = time.monotonic()
    OUT.mkdir(parents=True, exist_ok=True)
    base = base_image()
    tags = {"base": base}
    for name in ("etcd", "redis", "prometheus"):
        tag = f"{PREFIX}/{name}:{digest(base, (IMAGES / f'{name}.Dockerfile').read_text())}"
        if not exists(tag):
            build(name, tag, IMAGES, BASE=base)
        tags[name] = tag

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    # + the build backend pyproject.toml asks for: the tree is installed editable with no
    # build isolation (no index in the container)
    pins, others = closure(pyproject["project"]["dependencies"] + EXTRA)
    deps_pins = (pins, others + pyproject["build-system"]["requires"])
    deps = f"{PREFIX}/pydeps:{digest(base, (IMAGES / 'pydeps.Dockerfile').read_text(), *deps_pins[0], *deps_pins[1])}"
    if not exists(deps):
        build("pydeps", deps, wheels(deps_pins, deps), BASE=base)
    tags["pydeps"] = deps

    files = tree_files()
    tree = digest(deps, (IMAGES / "quire.Dockerfile").read_text(),
                  *(f"{p.relative_to(REPO)}\0{digest(p.read_bytes())}" for p in files))
    quire = f"{PREFIX}/quire:{tree}"
    if not exists(quire):
        build("quire", quire, tree_context(files, quire), DEPS=deps)
    tags["quire"] = quire

    s3_pins = closure(S3)
    s3 = f"{PREFIX}/s3:{digest(deps, (IMAGES / 's3.Dockerfile').read_text(), *s3_pins[0], *s3_pins[1])}"
    if not exists(s3):
        build("s3", s3, wheels(s3_pins, s3), DEPS=deps)
    tags["s3"] = s3

    for ctx in OUT.glob("ctx-*"):
        shutil.rmtree(ctx, ignore_errors=True)
    prune(tags)
    env = "".join(f"QUIRE_CI_IMAGE_{k.upper()}={v}\n" for k, v in tags.items())
    (OUT / "images.env").write_text(env)
    log(f"images ready in {time.monotonic() - started:.0f}s:\n" + env.rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
