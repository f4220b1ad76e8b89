"""Build-time check that an image holds the env its Dockerfile was generated for.

Run by every docker/*.Dockerfile after DeepSpeed is installed. Exits non-zero, failing the build,
when an installed version differs from its pin (for example pip resolved torch from the wrong
index), and, with --strict 1, when the Python, the torch build (HIP/CUDA) or the base image's ROCm
differ from the env (a derived env may use a torch built for another ROCm than its base: the
two are checked separately). Stand-in builds (docker/README.md) pass --strict 0: they keep the pins but
run on another base. Standard library only (plus torch for the build check): it runs in the image.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
from pathlib import Path

ROCM_VERSION_FILES = ("/opt/rocm/.info/version-dev", "/opt/rocm/.info/version")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, str]:
    return {canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}


def same_minor(version: str, want: str) -> bool:
    return version.split(".")[:2] == want.split(".")[:2]


def check_pins(pins: list[str], have: dict[str, str]) -> list[str]:
    problems = []
    for pin in pins:
        name, _, want = pin.partition("==")
        version = have.get(canonical(name))
        if version is None:
            problems.append(f"{name} is not installed (pinned {want})")
        elif version.split("+", 1)[0] != want:
            problems.append(f"{name} is {version}, pinned {want}")
    return problems


def check_stack(
    python: str | None, rocm: str | None, torch_hip: str | None, torch_cuda: str | None
) -> list[str]:
    """Python version, the base's ROCm, and which GPU build of torch pip installed."""
    problems = []
    running = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if python and running != python:
        problems.append(f"Python is {running}, the env wants {python}")
    if rocm:
        found = [Path(p) for p in ROCM_VERSION_FILES if Path(p).is_file()]
        # DeepSpeed reads the ROCm version from these files when it builds or loads its ops.
        base = found[0].read_text().strip() if found else ""
        if not same_minor(base, rocm):
            problems.append(f"the base image's ROCm is {base or 'missing'} ({ROCM_VERSION_FILES[0]}), "
                            f"the env wants {rocm}")
    if torch_hip or torch_cuda:
        import torch

        built = (torch.version.hip if torch_hip else torch.version.cuda) or ""
        want = torch_hip or torch_cuda or ""
        kind = "ROCm" if torch_hip else "CUDA"
        if not same_minor(built, want):
            problems.append(f"torch is not a {kind} {want} build (it reports {built or 'none'})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", choices=("0", "1"), default="1")
    parser.add_argument("--python")
    parser.add_argument("--rocm", help="ROCm version the base image must have")
    parser.add_argument("--torch-hip", help="ROCm version torch must be built for")
    parser.add_argument("--torch-cuda", help="CUDA version torch must be built for")
    parser.add_argument("pins", nargs="+", help="name==version, one per installed package")
    args = parser.parse_args(argv)
    problems = check_pins(args.pins, installed())
    if args.strict == "1":
        problems += check_stack(args.python, args.rocm, args.torch_hip, args.torch_cuda)
    for problem in problems:
        print(f"verify_image: {problem}", file=sys.stderr)
    if not problems:
        print(f"verify_image: {len(args.pins)} pins match (strict={args.strict})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
