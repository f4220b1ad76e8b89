"""A layer is the env: the interpreter and the commands of the venv it stands on.

Every small venv layered over an env's venv (release probes, repro/engines/venv/engine.py;
DeepSpeed checkouts and work trees, repro/bisect/ds_layer.py; a job's packages,
repro/engines/venv/joblayer.py) must run what the env runs:

- the same interpreter. `python -m venv` names in the new venv's pyvenv.cfg the Python that ran
  it; the tool's own interpreter (e.g. pyenv's 3.11.7 behind the host's .venv) is not the one the
  env venv was made with (e.g. /usr/bin/python3.11, 3.11.2), and a layer must not mix the base's
  compiled packages with another build of Python. So the layer is made by `base_interpreter`.
- the same commands. A job says `torchrun ...` or `deepspeed ...`; the job runner puts the
  layer's bin/ first on PATH, and a layer made without them makes every command exit 127 (a
  DeepSpeed survey then saw "unknown" for every release but the env's own). `carry_scripts`
  gives the layer a copy of each of the base's Python scripts (console scripts: torchrun,
  deepspeed, ds_report, pip...) whose interpreter line names the LAYER's Python. A symlink, or
  the base's bin/ on PATH, would not do: the script's own interpreter line names the base's
  Python, which never sees the layer's site-packages (the .pth link goes one way), so the job
  would run the base's release instead of the layer's. The layer's interpreter sees both.

LAYER_FORMAT names what a finished layer holds; a cached layer of an older format is rebuilt.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from repro.core import cmd
from repro.core.errors import BuildError
from repro.engines.venv.layer import PURELIB, link_base

# 2: made by the base's interpreter, with the base's scripts (1: neither; issue #29).
LAYER_FORMAT = 2
# Linux reads at most this many bytes of a `#!` line on older kernels; pip (distlib) switches to
# the /bin/sh trampoline above it, and so does this.
_SHEBANG_MAX = 127
_BIG = 1 << 20  # a console script is a few hundred bytes; a binary is not a script to rewrite
# `#!/abs/venv/bin/python3.11 [-E]`, and pip's trampoline for long or spaced paths.
_PLAIN = re.compile(rb"#!(?P<py>/[^\s]*/bin/python[0-9.]*)(?P<args>[ \t][^\n]*)?\n")
_TRAMPOLINE = re.compile(
    rb"#!/bin/sh\n'''exec' \"(?P<py>/[^\"\n]*/bin/python[0-9.]*)\"(?P<args>[^\n]*?) \"\$0\" \"\$@\"\n' '''\n"
)
# Interpreter options a console script may carry (-E, -s, -I...): anything else is not one of
# pip's scripts, and would reach /bin/sh in the trampoline.
_ARGS = re.compile(rb"(?:-[A-Za-z]+(?:[ \t]+-[A-Za-z]+)*)?")
# In the trampoline the path is inside double quotes for /bin/sh and inside a string for Python.
_UNSAFE_IN_TRAMPOLINE = re.compile(r'["$`\\\n\x00]')


def check_step(result: cmd.CmdResult, subject: str, what: str) -> None:
    if not result.ok:
        raise BuildError(
            f"{subject}: {what} failed (exit {result.returncode})",
            why=result.tail() or "see the output above",
            fix="fix the cause and rerun; nothing half-built was kept",
        )


@contextlib.contextmanager
def building(final: Path) -> Iterator[Path]:
    """A temporary folder next to `final` to build a venv or layer in (`.<final>.<random>`, which
    the venv engine's stale-temp sweep knows). When the block succeeds its paths are pointed at
    `final` and it is swapped into place (an older `final` renamed away first, then deleted); a
    crash never leaves a directory that looks complete, and nothing half-built is kept."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield tmp
        relocate(tmp, final)
        stale = final.with_name(f".{final.name}.stale")
        if final.exists():
            os.rename(final, stale)
        os.rename(tmp, final)
        shutil.rmtree(stale, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def make_layer_venv(
    base: Path,
    tmp: Path,
    subject: str,
    *,
    what: str = "the layer venv",
    base_is: str = "the base's",
    env: Mapping[str, str] | None = None,
) -> str:
    """Create a layer's venv in `tmp`, made by the base's own interpreter (not this tool's: the
    layer is the env) and seeing the base's site-packages after its own; its Python."""
    check_step(cmd.run(venv_argv(base, tmp), env=env), subject, f"creating {what}")
    py = str(tmp / "bin" / "python")
    layer_lib = cmd.run([py, "-c", PURELIB], capture=True, echo=False, env=env)
    base_lib = cmd.run([str(base / "bin" / "python"), "-c", PURELIB], capture=True, echo=False, env=env)
    check_step(layer_lib, subject, "locating the layer's site-packages")
    check_step(base_lib, subject, f"locating {base_is} site-packages")
    link_base(Path(layer_lib.stdout.strip()), base_lib.stdout.strip())
    return py


def relocate(tmp: Path, final: Path) -> None:
    """Rewrite the temporary path baked into scripts (shebangs, activate) to the final one.

    venv writes absolute paths into bin/; without this, console scripts such as `torchrun`
    and `ds_report` would point at the temporary directory after the rename.
    """
    old, new = str(tmp).encode(), str(final).encode()
    for path in [*(tmp / "bin").iterdir(), tmp / "pyvenv.cfg"]:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > _BIG:
            continue
        data = path.read_bytes()
        if old in data:
            path.write_bytes(data.replace(old, new))


def base_interpreter(base: Path) -> Path:
    """The Python the venv `base` was made with (the interpreter its own `bin/python` runs).

    A venv's bin/python is a chain of links (python -> python3 -> /usr/bin/python3.11): the first
    hop that leaves the venv is that interpreter, as `python -m venv` wrote it (pyvenv.cfg's
    `home`). A venv of copies (--copies) names it only in pyvenv.cfg (`executable` from Python
    3.11, else `home` and `version`). Last resort: the venv's own python, which makes a venv of
    its base interpreter when it runs `-m venv` (Python 3.11+ resolves sys._base_executable)."""
    bin_dir = os.path.normpath(base / "bin")
    path = os.path.normpath(base / "bin" / "python")
    for _ in range(32):  # a loop of links is a broken venv: fall through to pyvenv.cfg
        if os.path.dirname(path) != bin_dir:
            return Path(path)
        if not os.path.islink(path):
            break
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    cfg = _pyvenv_cfg(base)
    for candidate in _cfg_interpreters(cfg):
        if os.access(candidate, os.X_OK) and os.path.dirname(os.path.normpath(candidate)) != bin_dir:
            return Path(candidate)
    return base / "bin" / "python"


def venv_argv(base: Path, dest: Path, *, with_pip: bool = False) -> list[str]:
    """`python -m venv` for a layer over `base`, run by the base's own interpreter."""
    return [str(base_interpreter(base)), "-m", "venv", *([] if with_pip else ["--without-pip"]), str(dest)]


def carry_scripts(base: Path, layer: Path) -> tuple[str, ...]:
    """Give `layer` each Python script of the base's bin/ that it lacks, started by the layer's
    interpreter; returns their names. (A layer built in a temporary folder names that folder
    until the builder's relocation step points its bin/ at the final one.)

    Scripts the layer has (its own pip, a console script of a package installed into it, the
    venv module's python and activate) are kept: they are the layer's. Only scripts whose
    interpreter is the base's own Python are carried: anything else (activate, a binary, a
    script for another interpreter) is not a command of this env."""
    base_bin, layer_bin = base / "bin", layer / "bin"
    python = layer / "bin" / "python"
    carried = []
    for script in sorted(base_bin.iterdir()) if base_bin.is_dir() else []:
        target = layer_bin / script.name
        if (
            script.name.startswith(("python", "activate", "Activate"))
            or target.exists()
            or target.is_symlink()
        ):
            continue
        if script.is_symlink() or not script.is_file() or script.stat().st_size > _BIG:
            continue
        body = _body_under(script.read_bytes(), base_bin)
        if body is None:
            continue
        header, args = body
        target.write_bytes(_header(python, args) + header)
        target.chmod(script.stat().st_mode | 0o111)
        carried.append(script.name)
    return tuple(carried)


def _body_under(data: bytes, base_bin: Path) -> tuple[bytes, bytes] | None:
    """(the script without its interpreter line(s), the interpreter's arguments) when the script
    is started by a Python of `base_bin`; None otherwise."""
    m = _TRAMPOLINE.match(data) or _PLAIN.match(data)
    if m is None:
        return None
    if os.path.normpath(os.path.dirname(m["py"].decode(errors="replace"))) != os.path.normpath(base_bin):
        return None
    args = (m["args"] or b"").strip()
    return (data[m.end() :], args) if _ARGS.fullmatch(args) else None


def _header(python: Path, args: bytes) -> bytes:
    py = str(python).encode()
    extra = b" " + args if args else b""
    line = b"#!" + py + extra
    if len(line) <= _SHEBANG_MAX and not re.search(rb"\s", py):
        return line + b"\n"
    if _UNSAFE_IN_TRAMPOLINE.search(str(python)) or "'''" in str(python):
        raise BuildError(
            f"cannot give the layer {python.parent.parent} the env's commands (torchrun...)",
            why="its path is too long for a #! line, and holds a character (a double quote, $, `, a "
            "backslash, a newline or three single quotes) that the /bin/sh line pip writes instead "
            "cannot quote",
            fix="put the venv cache under a plain path (MICS_REPRO_CACHE=/some/plain/dir) and rerun",
        )
    # pip's own form: sh runs the first line (exec), Python reads the first two as a string.
    return b"#!/bin/sh\n'''exec' \"" + py + b'"' + extra + b' "$0" "$@"\n' + b"' '''\n"


def _pyvenv_cfg(venv: Path) -> dict[str, str]:
    try:
        text = (venv / "pyvenv.cfg").read_text()
    except (OSError, UnicodeDecodeError):
        return {}
    pairs = (line.partition("=") for line in text.splitlines())
    return {k.strip().lower(): v.strip() for k, sep, v in pairs if sep}


def _cfg_interpreters(cfg: dict[str, str]) -> list[str]:
    out = [cfg["executable"]] if cfg.get("executable") else []
    home = cfg.get("home")
    if home:
        version = (cfg.get("version") or cfg.get("version_info") or "").split(".")
        if len(version) >= 2:
            out.append(os.path.join(home, f"python{version[0]}.{version[1]}"))
        out += [os.path.join(home, "python3"), os.path.join(home, "python")]
    return out
