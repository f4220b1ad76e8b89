"""`make build ENV=... DRY_RUN=1`: what a build and a run of that env would do, as plain text.

Pure: reads the matrix entry and the same option builders the Docker engine uses
(build_context.image_args / engine_docker.run_options), touches no daemon and no device.
"""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING

from repro.engines.docker.build_context import image_args, parse_build_args
from repro.engines.docker.engine import device_gids, run_options
from repro.engines.passthrough import split

if TYPE_CHECKING:
    from repro.matrix.model import Env


def docker_run_flags(platform: str) -> list[str]:
    """The `docker run` flags equivalent to what the engine passes to docker-py."""
    opts = run_options(platform, device_gids() if platform == "rocm" else ())
    return ["--network", "none", "--init", *(f"{flag}={value}" for flag, value in opts.cli_pairs())]


def _host_variables(platform: str) -> list[str]:
    """Which of this host's GPU/NCCL variables a run would get, and which a networkless one drops."""
    passed, dropped = split(os.environ, platform, networkless=True)
    lines = ["run env: " + (" ".join(f"{k}={shlex.quote(v)}" for k, v in passed.items()) or "(none)")]
    if dropped:
        lines.append("held back (the container has no network): " + " ".join(dropped))
    return lines


def dry_run_text(env: Env) -> str:
    args = image_args(
        os.environ.get("MICS_REPRO_BASE_IMAGE") or None,
        parse_build_args(os.environ.get("MICS_REPRO_BUILD_ARGS", "")),
    )
    build = ["docker", "build", "-f", env.dockerfile, "-t", env.image_tag()]
    for key, value in sorted(args.items()):
        build += ["--build-arg", f"{key}={value}"]
    build.append(".")
    derived = f" derived from {env.derived_from}" if env.derived_from else ""
    lines = [f"env {env.id} ({env.platform.value}){derived}", "pins:"]
    lines += [f"  {name} = {version}" for name, version in sorted(env.pins().items())]
    lines += [
        f"base image: {env.base_image}",
        f"torch index: {env.torch_index or 'PyPI'}",
        f"dockerfile: {env.dockerfile}",
        f"image tag: {env.image_tag()}",
        "build: " + shlex.join(build),
        "run flags: " + shlex.join(docker_run_flags(env.platform.value)),
        *_host_variables(env.platform.value),
        "run: "
        + shlex.join(["docker", "run", "--rm", *docker_run_flags(env.platform.value), env.image_tag()]),
    ]
    return "\n".join(lines)
