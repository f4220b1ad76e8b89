"""The one door for git on a repository that is not ours: a user's DeepSpeed clone (`make pr`,
pr-verify's exports, `--deepspeed-src`), the cached mirror of it and the probes' work trees.

A clone's own configuration is code: `core.fsmonitor` is a command git runs on every index
refresh, a filter driver (`filter.<name>.clean/smudge/process`) named by a committed
`.gitattributes` rewrites what is committed, checked out or archived, a diff driver
(`diff.<name>.command/textconv`) runs on every diff. And the caller's environment can point git
somewhere else (`GIT_DIR`, `GIT_INDEX_FILE`, `GIT_CONFIG_PARAMETERS`, ...). So every git call
made here runs with:

- no `GIT_*` variable of the caller, only the ones set here: no system or global config (they
  are not needed: identities are set by the caller, `make pr` never takes the global one), no
  system attributes, no replace refs (what we read and verify is what the objects hold);
- a fixed set of settings, given as command-scope config (`GIT_CONFIG_PARAMETERS`, what `-c`
  sets: it outranks every config file, and every git since 1.7 reads it; `GIT_CONFIG_COUNT`
  would need git 2.31, and an older git would ignore it without a word):
  `core.fsmonitor`, hooks, pager, editors, askpass, credential helpers, signing, external diff,
  submodule recursion off; only the transports DS_REPO may name (repro/bisect/commits.py);
- every filter, diff and merge driver that the repository's config defines neutralised (its
  commands set empty, a filter no longer `required`), for commands that may run one. git has no
  switch that turns drivers off, but a driver does nothing unless config defines it, and git
  reads config only from the files this listing reads (the repository's own, with its includes),
  so listing the repository's config finds every driver a `.gitattributes` (committed, in
  info/, anywhere) could name. Refusing such a clone instead would refuse every clone that
  `git lfs install --local` has set up, for nothing: neutralised, the driver never runs and the
  bytes are taken as they are (`make pr` then checks the committed blobs byte for byte).
- diff commands (`diff`, `show`, `log`, `format-patch`) with `--no-ext-diff --no-textconv`:
  an emptied diff command would otherwise make git fail to run "" (fail-closed, but a failure).

- `safe.directory` as the user's own global and system config say (read from those two files
  only, never from the repository's): git refuses a repository another user owns unless those
  name it, and that choice is the user's, not the clone's.

What is left to git: reading and writing the repository named by `-C`/`--git-dir`, and
`ssh`/`git-upload-pack` for a DS_REPO URL (the mirror's remote; its config is ours).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from repro.core import cmd
from repro.core.errors import UsageError

Runner = Callable[..., cmd.CmdResult]

# What every call sets; a key's last value wins, and command scope is read last.
SAFE_SETTINGS: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),
    # Hook lookups under /dev/null find nothing: no hook of the clone runs (commit, checkout...).
    ("core.hooksPath", os.devnull),
    ("core.sshCommand", "ssh"),
    ("core.pager", "cat"),
    # ':' is git's "no editor" (it never starts one); nothing here edits a message.
    ("core.editor", ":"),
    ("sequence.editor", ":"),
    ("core.askPass", ""),
    ("core.attributesFile", os.devnull),
    ("core.alternateRefsCommand", ""),
    ("core.gitProxy", ""),
    ("diff.external", ""),
    ("credential.helper", ""),  # an empty value clears the list of helpers
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("log.showSignature", "false"),
    ("gpg.program", os.devnull),
    ("gpg.ssh.program", os.devnull),
    ("gpg.x509.program", os.devnull),
    ("submodule.recurse", "false"),
    ("fetch.recurseSubmodules", "false"),
    ("remote.origin.uploadpack", "git-upload-pack"),
    ("protocol.allow", "never"),
    ("protocol.https.allow", "always"),
    ("protocol.ssh.allow", "always"),
    ("protocol.git.allow", "always"),
    ("protocol.file.allow", "always"),
)
# The variables git gets; nothing else of the caller's GIT_* reaches it.
FIXED_ENV: Mapping[str, str] = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_NO_REPLACE_OBJECTS": "1",
}
# Config keys that hold a command, per driver kind: section -> keys.
DRIVER_COMMANDS: Mapping[str, tuple[str, ...]] = {
    "filter": ("clean", "smudge", "process"),
    "diff": ("command", "textconv"),
    "merge": ("driver",),
}
DIFF_COMMANDS = frozenset({"diff", "show", "log", "format-patch", "whatchanged"})
DIFF_GUARDS = ("--no-ext-diff", "--no-textconv")
# The caller's variables that say which of the user's own config files to read for
# `safe.directory` (and only for it).
USER_CONFIG_VARS = frozenset({"GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM"})
# Commands that never read an attribute-selected driver (no content conversion, no diff): they
# run without first listing the repository's drivers.
NO_DRIVERS = frozenset(
    {
        "rev-parse", "config", "for-each-ref", "rev-list", "merge-base", "update-ref", "show-ref",
        "check-ref-format", "ls-tree", "clone", "fetch",
    }
)  # fmt: skip


def quoted(setting: tuple[str, str]) -> str:
    """One `'key=value'` word of GIT_CONFIG_PARAMETERS, quoted as git's sq_quote does."""
    text = "=".join(setting)
    return "'" + text.replace("'", "'\\''").replace("!", "'\\!'") + "'"


def git_env(settings: Sequence[tuple[str, str]], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a git call: the caller's without any GIT_*, plus ours and `settings`."""
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if not k.startswith("GIT_")}
    env.update(FIXED_ENV)
    env["GIT_CONFIG_PARAMETERS"] = " ".join(quoted(s) for s in settings)
    return env


def driver_settings(config_names: str) -> list[tuple[str, str]]:
    """Settings that empty every driver command named in `git config --list --name-only -z`."""
    names: set[tuple[str, str]] = set()
    for name in config_names.split("\0"):
        section, _, rest = name.partition(".")
        driver, _, key = rest.rpartition(".")
        if driver and key in DRIVER_COMMANDS.get(section, ()):
            if "=" in driver:
                # git splits a `-c` setting at its first '=': such a driver cannot be turned off.
                raise UsageError(
                    f"the repository's config defines a {section} driver named {driver!r}",
                    why="its command cannot be turned off for our git calls: the name holds '='",
                    fix=f"remove or rename {section}.{driver}.{key} in that repository's config",
                )
            names.add((section, driver))
    out: list[tuple[str, str]] = []
    for section, driver in sorted(names):
        out += [(f"{section}.{driver}.{key}", "") for key in DRIVER_COMMANDS[section]]
        if section == "filter":
            # A required filter that does nothing would make git stop; its bytes pass as they are.
            out.append((f"filter.{driver}.required", "false"))
    return out


def subcommand(args: Sequence[str]) -> tuple[int, str]:
    """Index and name of git's subcommand in `args` (after any `-c key=value` of the caller)."""
    n = 0
    while n < len(args) and args[n].startswith("-"):
        n += 2 if args[n] == "-c" else 1
    return (n, args[n]) if n < len(args) else (n, "")


class SafeGit:
    """Runs `git <where> <args>` the safe way; `where` is ("-C", path), ("--git-dir", path) or ()
    (clone). The drivers of each repository are listed once and reused."""

    def __init__(self, runner: Runner | None = None) -> None:
        self.runner = runner or cmd.run  # looked up now, so a test's stand-in for cmd.run is used
        self._drivers: dict[tuple[str, ...], list[tuple[str, str]]] = {}
        self._trusted: list[tuple[str, str]] | None = None

    def run(
        self,
        *args: str,
        where: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        echo: bool = False,
        capture: bool = True,
    ) -> cmd.CmdResult:
        at, name = subcommand(args)
        settings = list(SAFE_SETTINGS)
        if where:
            settings += self.trusted()
        if where and name not in NO_DRIVERS:
            listed = self.drivers(tuple(where))
            if isinstance(listed, cmd.CmdResult):
                return listed  # the repository's config cannot be read: nothing else runs in it
            settings += listed
        argv = list(args)
        if name in DIFF_COMMANDS:
            argv[at + 1 : at + 1] = DIFF_GUARDS
        return self.runner(
            ["git", *where, *argv], env=git_env(settings), capture=capture, echo=echo, extra_env=extra_env
        )

    def drivers(self, where: tuple[str, ...]) -> list[tuple[str, str]] | cmd.CmdResult:
        if where not in self._drivers:
            argv = ["git", *where, "config", "--list", "--name-only", "-z"]
            listed = self.runner(argv, env=git_env(SAFE_SETTINGS), capture=True, echo=False)
            if not listed.ok:
                return listed
            self._drivers[where] = driver_settings(listed.stdout)
        return self._drivers[where]

    def trusted(self) -> list[tuple[str, str]]:
        """The user's `safe.directory` entries, from their global and system config only."""
        if self._trusted is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k in USER_CONFIG_VARS}
            argv = ["git", "config", "--show-scope", "-z", "--get-all", "safe.directory"]
            found = self.runner(argv, env=env, capture=True, echo=False)
            words = found.stdout.split("\0") if found.ok else []
            self._trusted = [
                ("safe.directory", value)
                for scope, value in zip(words[0::2], words[1::2])
                if scope in ("global", "system")
            ]
        return self._trusted
