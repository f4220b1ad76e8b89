"""The suite's side of the pre-imported launcher (server: repro/workload/prefork_server.py).

`PreforkServer` starts the server once per suite, in its own session, and starts runs through
it; each run comes back as a `ForkedRun`, which the runner treats like torchrun's Popen: a pid
that leads the run's session (signal it with os.killpg), `poll()`, `wait()`, `returncode`.
When the server cannot start, is not ready (an import failed, a thread appeared) or dies,
`start` raises `PreforkUnavailable` and the runner launches that run with torchrun instead,
saying why in the record. Standard library only: the suite imports no torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Callable

from repro.workload.prefork_server import RunRequest, TaskRequest

if TYPE_CHECKING:
    from repro.workload.prefork_server import Reply

SERVER_MODULE = "repro.workload.prefork_server"
READY_TIMEOUT_S = 300.0  # importing torch and DeepSpeed on a loaded 2-core host: seconds; a cold disk: more
START_TIMEOUT_S = 60.0
POLL_S = 0.05


class PreforkUnavailable(RuntimeError):
    """The pre-imported launcher cannot start this run; the caller uses torchrun."""


class PreforkServer:
    def __init__(
        self,
        env: dict[str, str],
        cwd: str,
        log_path: str,
        alive: Callable[[int], bool],
        server_args: Sequence[str] = (),
    ) -> None:
        """`alive(pid)`: the runner's zombie-aware liveness test (for a leader whose exit the
        server could no longer report). `server_args`: for tests (a stand-in entry point)."""
        self.log_path = log_path
        self.alive = alive
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._replies: dict[str, Reply] = {}
        self._exits: dict[str, int] = {}
        self._ready: Reply | None = None
        self._dead = False
        self._count = 0
        self._log: IO[bytes] = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, *server_args],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            # Not in the suite's process group: Ctrl-C reaches the suite, which stops every run
            # and then the server, in that order.
            start_new_session=True,
        )
        threading.Thread(target=self._read, name="prefork-replies", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                message = json.loads(raw)
            except ValueError:
                continue
            with self._changed:
                if "ready" in message:
                    self._ready = message
                elif "exit" in message:
                    self._exits[str(message["run"])] = int(message["exit"])
                elif "run" in message:
                    self._replies[str(message["run"])] = message
                self._changed.notify_all()
        with self._changed:
            self._dead = True
            self._changed.notify_all()

    def wait_ready(self) -> Reply:
        """The server's ready message; raises PreforkUnavailable when it is not ready. A server
        not ready in time is given up (killed) once, so later runs do not wait for it again."""
        with self._changed:
            self._changed.wait_for(lambda: self._ready is not None or self._dead, READY_TIMEOUT_S)
            ready = self._ready
            if ready is None and not self._dead:
                self._ready = ready = {"ready": False, "error": f"not ready after {READY_TIMEOUT_S:g} s"}
                self.abandon()
        if ready is None:
            raise PreforkUnavailable(
                f"the pre-imported launcher did not start (see {os.path.basename(self.log_path)})"
            )
        if not ready.get("ready"):
            raise PreforkUnavailable(f"the pre-imported launcher is not usable: {ready.get('error')}")
        return ready

    @property
    def dead(self) -> bool:
        return self._dead

    def exit_code(self, run: str) -> int | None:
        with self._lock:
            return self._exits.get(run)

    def wait_exit(self, run: str, timeout_s: float | None) -> None:
        """Block until the server reports `run`'s exit or dies, or `timeout_s` passes: the
        reader thread notifies at once, so a run's end is seen without a polling delay."""
        with self._changed:
            self._changed.wait_for(lambda: run in self._exits or self._dead, timeout_s)

    def start(self, argv: list[str], env: dict[str, str], world_size: int, log: str) -> ForkedRun:
        """A run: `world_size` ranks of the trainer with `argv`, logging to `log`."""
        return self._request(
            lambda run: RunRequest(run=run, argv=argv, env=env, world_size=world_size, log=log)
        )

    def start_task(
        self, entry: str, argv: list[str] | None, env: dict[str, str], stdout: str, stderr: str
    ) -> ForkedRun:
        """One process running `module:function` (`argv` None: called without arguments)."""
        return self._request(
            lambda run: TaskRequest(run=run, task=entry, argv=argv, env=env, stdout=stdout, stderr=stderr)
        )

    def _request(self, build: Callable[[str], RunRequest | TaskRequest]) -> ForkedRun:
        self.wait_ready()
        with self._lock:
            self._count += 1
            run = str(self._count)
        request = build(run)
        try:
            assert self.proc.stdin is not None
            with self._lock:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
        except (OSError, ValueError) as exc:
            raise PreforkUnavailable(f"the pre-imported launcher is gone: {exc}") from None
        with self._changed:
            self._changed.wait_for(lambda: run in self._replies or self._dead, START_TIMEOUT_S)
            reply = self._replies.get(run)
        if reply is None or "pid" not in reply:
            why = (reply or {}).get("error") or ("it exited" if self._dead else "no answer")
            raise PreforkUnavailable(f"the pre-imported launcher could not start the run: {why}")
        return ForkedRun(self, run, int(reply["pid"]))

    def ready_info(self) -> Reply | None:
        """What the server said when it was ready (import seconds, modules), for suite.json."""
        with self._lock:
            return self._ready.copy() if self._ready else None

    def abandon(self) -> None:
        """Interrupted: kill the server now (it only imports and forks; runs it started are their
        own sessions, which the runner stops); anyone waiting for it gives up."""
        if self.proc.poll() is None:
            self.proc.kill()

    def close(self) -> None:
        """Stop the server (its stdin closing is its signal to leave); runs are the caller's."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


class ForkedRun:
    """A run started by the server, seen like a Popen of torchrun: `pid` leads its session."""

    def __init__(self, server: PreforkServer, run: str, pid: int) -> None:
        self.server, self.run, self.pid = server, run, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self.server.exit_code(self.run)
            if code is None and self.server.dead and not self.server.alive(self.pid):
                code = -1  # the server died before it could report: the code is lost
            self.returncode = code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("prefork run", timeout or 0)
            if self.server.dead:  # nobody will report the exit: look at the leader's pid
                time.sleep(POLL_S if left is None else min(POLL_S, left))
            else:
                self.server.wait_exit(self.run, left)
        assert self.returncode is not None
        return self.returncode
