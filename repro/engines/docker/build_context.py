"""The Docker build context and build arguments: pure functions, no daemon involved.

The context is an in-memory tar holding exactly what the env's Dockerfile COPYs, at the repo
paths it names (the Dockerfiles are written for `docker build -f docker/X.Dockerfile .` from the
repo root), plus the host's CA bundle for TLS-intercepting proxies. Nothing is written into the
repo, and results, venvs or bundles lying in the checkout are never uploaded.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from repro.core.errors import BuildError

if TYPE_CHECKING:
    from repro.matrix.model import Env

# Where the host CA bundle goes: the Dockerfiles add any *.crt in docker/certs/ to pip's and apt's
# trust (no BuildKit, so no build secrets: the bundle stays in the image; it holds no keys).
CA_CONTEXT_DIR = "docker/certs"
CA_CONTEXT_NAME = "host-ca.crt"
DEFAULT_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_FIXED_MTIME = 1_577_836_800  # 2020-01-01: a stable context tar regardless of checkout times
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")


def ca_bundle() -> Path | None:
    """The CA bundle copied into builds: MICS_REPRO_CA_BUNDLE ('' or 'none' disables), else the host's."""
    value = os.environ.get("MICS_REPRO_CA_BUNDLE")
    if value is not None:
        if value.strip().lower() in ("", "none"):
            return None
        path = Path(value).expanduser()
        if not path.is_file():
            raise BuildError(
                f"MICS_REPRO_CA_BUNDLE={value} is not a file",
                fix="point it at a PEM bundle, or set it to 'none'",
            )
        return path
    default = Path(DEFAULT_CA_BUNDLE)
    return default if default.is_file() else None


@dataclass(frozen=True)
class BuildContext:
    dockerfile: str  # path of the Dockerfile inside the context
    data: bytes  # uncompressed tar
    digest: str  # sha256 of what decides the image content (Dockerfile + workload + base override)


def copy_sources(dockerfile: str) -> list[str]:
    """Context paths the Dockerfile's COPY/ADD instructions read (multi-stage `--from` excluded)."""
    sources: list[str] = []
    for line in re.sub(r"\\\n", " ", dockerfile).splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        if any(w.startswith("--from") for w in words[1:]):
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if args and args[0].startswith("["):
            args = [str(a) for a in json.loads(" ".join(args))]
        sources.extend(args[:-1])
    return sources


def _wanted(path: Path) -> bool:
    return path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"


def context_files(dockerfile: str, repo_root: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """(files, empty dirs) to put in the context so that every COPY source exists.

    Only what the Dockerfile reads is sent: the repo also holds results, venvs and bundles that
    would make every build upload gigabytes.
    """
    files: dict[str, Path] = {}
    empty: list[str] = []
    for source in copy_sources(dockerfile):
        rel = source.strip("/")
        matches = sorted(repo_root.glob(rel)) if any(c in rel for c in "*?[") else [repo_root / rel]
        for match in matches:
            if match.is_dir():
                found = [p for p in sorted(match.rglob("*")) if _wanted(p)]
                files.update((p.relative_to(repo_root).as_posix(), p) for p in found)
                if not found:
                    empty.append(match.relative_to(repo_root).as_posix())
            elif match.is_file():
                files[match.relative_to(repo_root).as_posix()] = match
            elif source.endswith("/"):
                empty.append(rel)  # e.g. docker/certs/ in a checkout without it
            else:
                raise BuildError(
                    f"the Dockerfile copies {source}, which is not in {repo_root}",
                    fix="regenerate the Dockerfiles (python -m repro dockerfiles --write)",
                )
    return sorted(files.items()), empty


def dockerfile_text(env: Env, repo_root: Path) -> str:
    if env.derived_from:
        from repro.engines.docker import dockerfiles

        return str(dockerfiles.render(env))
    path = repo_root / env.dockerfile
    if not path.is_file():
        raise BuildError(
            f"{env.dockerfile} (Dockerfile of env {env.id}) does not exist",
            fix="regenerate the Dockerfiles: python -m repro dockerfiles --write",
        )
    return path.read_text()


def make_context(env: Env, repo_root: Path, ca: Path | None, args: Mapping[str, str]) -> BuildContext:
    """The build context as an in-memory tar; `args` are the build args that shape the image."""
    dockerfile = env.dockerfile or f"docker/{env.id}.Dockerfile"
    text = dockerfile_text(env, repo_root)
    files, empty = context_files(text, repo_root)
    digest = hashlib.sha256(text.encode())
    digest.update(json.dumps(dict(sorted(args.items()))).encode())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_bytes(tar, dockerfile, text.encode())
        for name in empty:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, _FIXED_MTIME
            tar.addfile(info)
        for name, path in files:
            data = path.read_bytes()
            digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
            add_bytes(tar, name, data)
        if ca is not None:
            # Not part of the digest: a host CA change alters no package in the image.
            add_bytes(tar, f"{CA_CONTEXT_DIR}/{CA_CONTEXT_NAME}", ca.read_bytes())
    return BuildContext(dockerfile, buf.getvalue(), digest.hexdigest())


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), _FIXED_MTIME, 0o644
    tar.addfile(info, io.BytesIO(data))


def image_args(base_override: str | None, extra: Mapping[str, str]) -> dict[str, str]:
    """Build args that change what the image holds (so they are part of the reuse check)."""
    args: dict[str, str] = {}
    if base_override:
        # A stand-in base is not the matrix's stack: verify_image.py then checks the pins only.
        args.update(BASE_IMAGE=base_override, STRICT="0")
    args.update(extra)
    return args


def source_args(wheelhouse_url: str | None, *, no_index: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """Build args that only say where packages come from."""
    args: dict[str, str] = {}
    if wheelhouse_url:
        # pip refuses plain-http find-links unless the host is trusted.
        args.update(PIP_FIND_LINKS=wheelhouse_url, PIP_TRUSTED_HOST="127.0.0.1")
    if no_index:
        args["PIP_NO_INDEX"] = "1"
    for var in _PROXY_VARS:
        if environ.get(var):
            args[var] = environ[var]
    if any(v.upper() == "HTTP_PROXY" or v.upper() == "HTTPS_PROXY" for v in args):
        # the wheelhouse server is local: keep it off the proxy
        for var in ("NO_PROXY", "no_proxy"):
            args[var] = ",".join(x for x in (args.get(var, ""), "127.0.0.1") if x)
    return args


def parse_build_args(text: str) -> dict[str, str]:
    """`K=V K2=V2` (MICS_REPRO_BUILD_ARGS), e.g. for stand-in builds of GPU Dockerfiles."""
    args: dict[str, str] = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BuildError(f"MICS_REPRO_BUILD_ARGS: {item!r} is not KEY=VALUE")
        args[key] = value
    return args
