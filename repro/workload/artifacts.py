"""ds_report and torch's collect_env, once per environment (what maintainers ask for), written to
DIR/artifacts/{ds_report,collect_env}.txt: stdout, then stderr after "[stderr]", then the exit code.

Both run in the background while the first runs train. With the suite's pre-imported launcher
(CPU) they are forked from it, so neither imports torch or DeepSpeed again: as two fresh
interpreters they cost ~7 CPU-seconds, half a probe's budget on 2 cores. Without it (GPU envs,
or a launcher that could not start) they are fresh interpreters, as before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

from repro.workload import runner
from repro.workload.prefork import ForkedRun, PreforkServer, PreforkUnavailable
from repro.workload.stackfiles import read_text

TIMEOUT_S = 120.0

# name -> (module:function, its arguments; None: called without any). ds_report goes through our
# wrapper: on CPU, DeepSpeed < 0.14.1 needs the placeholder modules the runs use to even report.
ENTRIES: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "ds_report": ("repro.workload.ds_report:main", ("--device", "{device}")),
    "collect_env": ("torch.utils.collect_env:main", None),
}


class ArtifactCapture:
    def __init__(self, out: str, device: str, server: PreforkServer | None = None) -> None:
        self.folder = os.path.join(out, "artifacts")
        self.out = out
        os.makedirs(self.folder, exist_ok=True)
        self.started = time.monotonic()
        self.env = runner.base_env(device)
        self.argv = {
            name: None if args is None else [a.format(device=device) for a in args]
            for name, (_entry, args) in ENTRIES.items()
        }
        self.handles: dict[str, ForkedRun | subprocess.Popen[bytes]] = {}
        self._abandoned = threading.Event()
        # Forking through the server waits for its imports: in a thread, so the suite goes on.
        self._starter = threading.Thread(target=self._start, args=(server,), name="artifacts", daemon=True)
        self._starter.start()

    def _paths(self, name: str) -> tuple[str, str]:
        return (os.path.join(self.folder, f".{name}.stdout"), os.path.join(self.folder, f".{name}.stderr"))

    def _start(self, server: PreforkServer | None) -> None:
        for name, (entry, _args) in ENTRIES.items():
            if self._abandoned.is_set():
                return
            stdout, stderr = self._paths(name)
            handle: ForkedRun | subprocess.Popen[bytes] | None = None
            if server is not None:
                try:
                    handle = server.start_task(entry, self.argv[name], self.env, stdout, stderr)
                except PreforkUnavailable:
                    server = None  # the rest as fresh interpreters
            if handle is None:
                if self._abandoned.is_set():  # the server was closed by an interruption, not broken
                    return
                module = entry.split(":")[0]
                with open(stdout, "wb") as out_fh, open(stderr, "wb") as err_fh:
                    handle = subprocess.Popen(
                        [sys.executable, "-m", module, *(self.argv[name] or [])],
                        stdout=out_fh,
                        stderr=err_fh,
                        env=self.env,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
            self.handles[name] = handle
            # abandon() sets the flag, then kills what is registered: a start that raced with it
            # is either in its list or sees the flag here, so it never outlives the suite.
            if self._abandoned.is_set():
                _kill(handle)
                return

    def finish(self) -> dict[str, str]:
        """Wait for both (within TIMEOUT_S of the start) and write the artifact files."""
        self._starter.join(max(TIMEOUT_S - (time.monotonic() - self.started), 1.0))
        paths = {}
        for name in ENTRIES:
            handle = self.handles.get(name)
            left = max(TIMEOUT_S - (time.monotonic() - self.started), 1.0)
            text = f"[not started within {TIMEOUT_S:g} s]\n"
            if handle is not None:
                try:
                    code = handle.wait(timeout=left)
                    stdout, stderr = (read_text(p) for p in self._paths(name))
                    text = stdout + (f"\n[stderr]\n{stderr}" if stderr.strip() else "")
                    text += f"\n[exit code {code}]\n"
                except subprocess.TimeoutExpired:
                    _kill(handle)
                    text = f"[timed out after {TIMEOUT_S:g} s]\n"
            for path in self._paths(name):
                if os.path.exists(path):
                    os.remove(path)
            path = os.path.join(self.folder, f"{name}.txt")
            with open(path, "w") as fh:
                fh.write(text)
            paths[name] = os.path.relpath(path, self.out)
        return paths

    def abandon(self) -> None:
        """Interrupted (or finished): stop whatever still runs so nothing outlives the suite."""
        self._abandoned.set()
        for handle in list(self.handles.values()):
            if handle.poll() is None:
                _kill(handle)


def _kill(handle: ForkedRun | subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(handle.pid, signal.SIGKILL)  # its own session: whatever it started goes too
    with contextlib.suppress(subprocess.TimeoutExpired):
        handle.wait(timeout=10)
