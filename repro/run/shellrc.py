"""How `make shell` starts the user's shell so the env's venv is first on PATH AFTER their rc files.

An interactive shell reads the user's rc files, and the usual `conda init` / `pyenv init` block in
them puts its own Python first on PATH: `python` would then not be the env's although VIRTUAL_ENV
names it. So the shell gets an rc file of ours that runs theirs first, then puts the env's bin
folder first and sets the prompt:
  bash  `bash --rcfile OURS -i`; OURS sources ~/.bashrc (bash still reads /etc/bash.bashrc itself)
  zsh   ZDOTDIR=OUR_DIR, whose .zshenv/.zshrc source the user's (from their ZDOTDIR or HOME)
  fish  `fish -i -C '...'`: fish runs -C commands after its config files
Any other $SHELL gets bash, and a line saying so.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED = ("bash", "zsh", "fish")


@dataclass(frozen=True)
class ShellLaunch:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the shell's environment
    note: str = ""  # said before the shell starts (an unsupported $SHELL)


def _posix_tail(bin_dir: str, venv: str, prompt: str, ps1_var: str) -> str:
    return (
        f'export PATH={shlex.quote(bin_dir)}:"$PATH"\n'
        f"export VIRTUAL_ENV={shlex.quote(venv)}\n"
        "hash -r 2>/dev/null\n"
        f'{ps1_var}={shlex.quote(prompt)}"${{{ps1_var}}}"\n'
    )


def launch(
    shell: str | None, bin_dir: str, venv: str, prompt: str, rc_dir: Path, environ: dict[str, str]
) -> ShellLaunch:
    """The command (and environment) that starts `shell` (the user's $SHELL) with our rc file,
    written into `rc_dir`."""
    rc_dir.mkdir(parents=True, exist_ok=True)
    name = os.path.basename(shell or "")
    note = ""
    if name not in SUPPORTED:
        note = f"make shell supports {', '.join(SUPPORTED)}; $SHELL is {shell or '(unset)'}, so this is bash"
        shell, name = shutil.which("bash") or "/bin/bash", "bash"
    assert shell is not None
    if name == "bash":
        rc = rc_dir / "bashrc"
        rc.write_text(
            "# mics-repro `make shell`: your ~/.bashrc first, then the env's venv first on PATH\n"
            'if [ -f "$HOME/.bashrc" ]; then . "$HOME/.bashrc"; fi\n'
            + _posix_tail(bin_dir, venv, prompt, "PS1")
        )
        return ShellLaunch([shell, "--rcfile", str(rc), "-i"], {}, note)
    if name == "zsh":
        theirs = environ.get("ZDOTDIR") or environ.get("HOME") or "~"
        (rc_dir / ".zshenv").write_text(
            f"if [ -f {shlex.quote(theirs)}/.zshenv ]; then . {shlex.quote(theirs)}/.zshenv; fi\n"
        )
        (rc_dir / ".zshrc").write_text(
            "# mics-repro `make shell`: your .zshrc first, then the env's venv first on PATH\n"
            f"ZDOTDIR={shlex.quote(theirs)}\n"
            f'if [ -f "$ZDOTDIR/.zshrc" ]; then . "$ZDOTDIR/.zshrc"; fi\n'
            + _posix_tail(bin_dir, venv, prompt, "PS1")
        )
        return ShellLaunch([shell, "-i"], {"ZDOTDIR": str(rc_dir)}, note)
    init = (
        f"set -gx PATH {shlex.quote(bin_dir)} $PATH; set -gx VIRTUAL_ENV {shlex.quote(venv)}; "
        f"functions -c fish_prompt _mics_repro_prompt 2>/dev/null; "
        f"function fish_prompt; echo -n {shlex.quote(prompt)}; _mics_repro_prompt; end"
    )
    return ShellLaunch([shell, "-i", "-C", init], {}, note)
