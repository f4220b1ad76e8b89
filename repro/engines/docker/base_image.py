"""`make base-image`: a Debian bookworm base made locally, for hosts that reach no container registry.

debootstrap writes a minimal root filesystem from the Debian archive, which `docker import` turns
into an image. Bookworm's python3 is 3.11, which torch 2.0-2.4 publish wheels for, so CPU envs
build FROM it with BASE_IMAGE=mics-repro/base:bookworm.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from repro.core import cmd, console
from repro.core.errors import BuildError
from repro.core.paths import cache_root

if TYPE_CHECKING:
    from repro.engines.docker.engine import DockerEngine

BASE_IMAGE_REF = "mics-repro/base:bookworm"


@dataclass(frozen=True)
class BaseImageSpec:
    ref: str = BASE_IMAGE_REF
    suite: str = "bookworm"
    variant: str = "minbase"
    packages: tuple[str, ...] = ("python3", "python3-venv", "python3-pip", "ca-certificates")
    mirror: str = "http://deb.debian.org/debian"

    @classmethod
    def from_environ(cls) -> BaseImageSpec:
        mirror = os.environ.get("MICS_REPRO_DEBIAN_MIRROR")
        return cls(mirror=mirror) if mirror else cls()

    def debootstrap_argv(self, rootfs: Path) -> list[str]:
        include = f"--include={','.join(self.packages)}"
        return ["debootstrap", f"--variant={self.variant}", include, self.suite, str(rootfs), self.mirror]

    def changes(self) -> list[str]:
        """Dockerfile instructions applied on import: a rootfs tarball carries no image config."""
        return [
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            f'LABEL mics-repro.base="{self.suite}-{self.variant}" mics-repro.base-mirror="{self.mirror}"',
            'CMD ["/bin/bash"]',
        ]


# Package caches debootstrap leaves behind: about a third of the rootfs, useless in an image.
_TRIM = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man")


def _trim(rootfs: Path) -> None:
    for rel in _TRIM:
        folder = rootfs / rel
        if not folder.is_dir():
            continue
        for child in folder.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            elif child.name != "lock":
                child.unlink(missing_ok=True)


def make_base_image(
    force: bool = False,
    *,
    engine: DockerEngine | None = None,
    spec: BaseImageSpec | None = None,
    workdir: Path | None = None,
) -> str:
    """Make (or, unless `force`, reuse) the base image; returns its image id."""
    spec = spec or BaseImageSpec.from_environ()
    if engine is None:
        from repro.engines.docker.engine import DockerEngine

        engine = DockerEngine.connect()
    if not force and engine.image_labels(spec.ref) is not None:
        console.info(f"base-image: {spec.ref} already exists (use --force to remake it)")
        return engine.image_id(spec.ref)
    if os.geteuid() != 0:
        raise BuildError(
            "making the base image needs root",
            why="debootstrap creates device nodes and files owned by other users",
            fix="run `sudo make base-image` (or `sudo python -m repro base-image`)",
        )
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="mics-repro-base-", dir=workdir or "/var/tmp"))
    try:
        rootfs, tarball = tmp / "rootfs", tmp / "rootfs.tar"
        # debootstrap's hundreds of lines go to a log (its own, in the root filesystem, goes with it),
        # shown in full when it fails; streamed only with VERBOSE=1.
        log = cache_root() / "logs" / "base-image.log"
        with console.task(
            f"base-image: debootstrap {spec.suite} ({spec.variant}) from {spec.mirror} (about a minute)"
        ):
            result, _ = cmd.run_logged(spec.debootstrap_argv(rootfs), log, "base-image: debootstrap")
        if not result.ok:
            raise BuildError(
                f"debootstrap failed (exit {result.returncode})",
                why=f"its output is above, and in {log}",
                fix="check access to the Debian mirror (MICS_REPRO_DEBIAN_MIRROR overrides it)",
            )
        _trim(rootfs)
        result = cmd.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), "."])
        if not result.ok:
            raise BuildError("packing the root filesystem failed", why=result.tail())
        size_mb = tarball.stat().st_size / 1e6
        with console.task(f"base-image: importing {size_mb:.0f} MB as {spec.ref}"):
            image_id = engine.import_rootfs(tarball, spec.ref, spec.changes())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    console.info(f"base-image: {spec.ref} = {image_id[:19]} in {time.monotonic() - started:.0f} s")
    return image_id
