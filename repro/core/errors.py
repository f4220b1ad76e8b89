"""One error hierarchy for the host-side tool, caught once in `repro.cli.main.main`.

Each error carries an exit code (distinct per kind, so scripts can tell them apart) and a
message that says what went wrong, why, and what to do next.
"""

from __future__ import annotations

import os

from repro.core.printable import printable


class ReproError(Exception):
    """Base class. `exit_code` is what `python -m repro` exits with."""

    exit_code = 2

    def __init__(self, what: str, *, why: str = "", fix: str = "") -> None:
        self.what, self.why, self.fix = what, why, fix
        super().__init__(self.render())

    def render(self) -> str:
        # Messages quote input from others (a bundle's member names, a config's keys): a terminal
        # escape or bidi override in them is shown escaped, never acted on.
        parts = [f"error: {printable(self.what, keep_newlines=True)}"]
        if self.why:
            parts.append(f"  why: {printable(self.why, keep_newlines=True)}")
        if self.fix:
            parts.append(f"  what to do: {printable(self.fix, keep_newlines=True)}")
        return "\n".join(parts)


class UsageError(ReproError):
    """Bad command-line input (unknown option value, bad combination)."""

    exit_code = 2


class MatrixError(ReproError):
    """The env matrix file is malformed (names the file, the env and the key)."""

    exit_code = 3


class UnknownEnvError(ReproError):
    """ENV= names no env in the matrix (the message lists the valid ones and the closest)."""

    exit_code = 4


class ConfigError(ReproError):
    """A user-supplied DeepSpeed config cannot be used."""

    exit_code = 5


class DockerUnavailableError(ReproError):
    """ENGINE=docker but no Docker daemon answers."""

    exit_code = 10


class DeviceUnavailableError(ReproError):
    """A ROCm/CUDA env on a host without the GPU devices or runtime it needs."""

    exit_code = 11


# GPU host problems found before anything is built: each its own exit code (41-45), all kinds of
# DeviceUnavailableError, so `list`/`matrix` and callers that only ask "can this host run it" treat
# them alike.
class DevicePermissionError(DeviceUnavailableError):
    """The GPU device nodes exist but this user may not open them (not in their render/video group)."""

    exit_code = 41


class GpuArchError(DeviceUnavailableError):
    """The GPU's architecture (gfx arch) is not one the env's torch wheel was built for."""

    exit_code = 42


class GpuDriverError(DeviceUnavailableError):
    """The NVIDIA driver does not answer, or is older than the env's CUDA runtime needs."""

    exit_code = 43


class ContainerGpuError(DeviceUnavailableError):
    """The Docker daemon cannot hand GPUs to containers (no NVIDIA runtime hook or CDI spec)."""

    exit_code = 44


class GpuCountError(DeviceUnavailableError):
    """WORLD_SIZE asks for more ranks than the host has GPUs (one rank per GPU)."""

    exit_code = 45


class PythonVersionError(ReproError):
    """The interpreter is too new/old for the pinned torch wheels."""

    exit_code = 12


class BuildError(ReproError):
    """Building an image or installing a venv failed."""

    exit_code = 13


class MissingToolError(ReproError):
    """An external executable the step needs is not installed."""

    exit_code = 14


class RunError(ReproError):
    """The workload could not be run at all (not a run outcome: those are results)."""

    exit_code = 15


class SuiteFailedError(RunError):
    """The suite of an env exited non-zero, timed out or recorded no run: the verdict is
    incomplete, so `make repro` must not exit 0 (same code as RunError: the workload failed)."""


class BundleError(ReproError):
    """A bundle is corrupt, truncated or does not match its manifest."""

    exit_code = 16


class LeakError(BundleError):
    """A text the lab hands out (a bundle file, ISSUE.md, REPORT.md, report.html) still holds a
    secret or a host value after scrubbing: refused, never written. A kind of BundleError (the
    bundle's final scan raises it), with its own exit code."""

    exit_code = 19


class CommandSecretError(LeakError):
    """A secret of the user's own command line (`--password X`, `-u user:pass`, `TOKEN=x python
    ...`) would be handed out where it cannot be replaced (a file named after it): refused, and
    what the command wrote is removed. Not a bug of the scrubber (LeakError's exit 19): the user's
    input must change, so it has an exit code of its own."""

    exit_code = 24


class FixNotResolvedError(ReproError):
    """`check-fix`: the fixed runs did not come out clean."""

    exit_code = 20


class NothingVerifiedError(ReproError):
    """`check-fix`: no fixed MiCS run could be compared with a clean control (control crashed,
    no steps ran, every fixed run unsupported...): nothing was verified, so no pass."""

    exit_code = 6


class Interrupted(ReproError):
    """Ctrl-C: what finished was saved; the message says how to resume."""

    exit_code = 130


class FixDoesNotApplyError(ReproError):
    """`make pr`: the fix cannot be spliced into DeepSpeed at REF (names the file and line)."""

    exit_code = 23


class DiskFullError(ReproError):
    """A write of the lab's own files hit a full disk (ENOSPC/EDQUOT): the run ends at once."""

    exit_code = 28  # repro.workload.diskfull.EXIT_DISK_FULL, the in-env runner's code too

    @classmethod
    def writing(cls, what: str, path: object, free: str) -> DiskFullError:
        where = os.path.dirname(os.path.abspath(str(path)))
        return cls(
            f"the disk is full: writing {what} failed",
            why=f"{path}: No space left on device ({free} free there)",
            fix=f"free space on the disk that holds {where}, or give another OUT= on a disk with "
            "room; then run the same command with RESUME=1 to finish what did not",
        )
