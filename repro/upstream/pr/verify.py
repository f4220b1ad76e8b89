"""`make pr VERIFY=1` / `make pr-verify PR=dir`: the lab verifies a `make pr` branch at its commit.

For each check of repro/upstream/pr/checks.py and each torch (the reporter's env and the matrix's
newest), two probes through the front door (`python -m repro probe`), both PATCH=stock, with
DeepSpeed from a commit layer of DS_REPO (AXIS=deepspeed-commit's machinery): REF, then the
branch's commit. No run-time fix is applied on either side: the branch's DeepSpeed holds the
change in its own files. Then the branch's regression test (tests/unit/.../test_mics_coalesced_wait.py)
runs in the same env against REF's `deepspeed/` and against the branch's (both taken with
`git archive`, never checked out in DS_REPO), through patches/pr/harness.

Every probe's folder stays under OUT/verify/, and verify.json is rewritten after each step, so an
interrupted verification keeps what it saw. PR_DESCRIPTION.md is rendered again from pr.json and
verify.json (and range.json, when present).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypedDict, cast

from repro.core import cmd, console
from repro.core.errors import RunError, UsageError
from repro.core.paths import cache_root
from repro.core.safe_git import SafeGit
from repro.core.smallfile import read_regular
from repro.core.walk_files import ProbeRow
from repro.upstream.pr import checks as pr_checks
from repro.upstream.pr import fix as pr_fix
from repro.upstream.pr import regression as pr_regression
from repro.upstream.pr import suite as pr_suite
from repro.upstream.pr.checks import Seen, Stack
from repro.upstream.pr.out_folders import fresh_folder, log_path
from repro.upstream.pr.record import pr_data_problem
from repro.workload.record import write_json_atomic

# What `import deepspeed` reads from a tree: deepspeed/ links into accelerator/ and op_builder/.
TREE_PATHS = ("deepspeed", "accelerator", "op_builder")
# probe's exit codes that carry an outcome: good, bad, unknown (repro/cli/bisect_commands.py)
PROBE_EXITS = (0, 1, 125)


@dataclass(frozen=True)
class ProbeCall:
    env: str
    torch: str
    commit: str
    scenario: str
    transport: str
    out: Path
    engine: str = "venv"
    patch: str = "stock"
    deepspeed: str | None = None  # a release instead of a commit (repro/upstream/pr/affected_range.py)


ProbeRunner = Callable[[ProbeCall, str], ProbeRow]  # (call, DS_REPO) -> probes[0] of probe.json


def probe_argv(call: ProbeCall, ds_repo: str) -> list[str]:
    argv = [sys.executable, "-m", "repro", "probe", "--env", call.env, "--engine", call.engine]
    argv += ["--torch", call.torch, "--scenario", call.scenario, "--patch", call.patch]
    argv += ["--transport", call.transport, "--bad-if", "failed", "--out", str(call.out)]
    if call.deepspeed:
        argv += ["--deepspeed", call.deepspeed]
    else:
        argv += ["--deepspeed-commit", call.commit, "--ds-repo", ds_repo]
    return argv


def front_door(argv: list[str], out: Path, name: str, what: str, exits: Sequence[int] = ()) -> list[ProbeRow]:
    """A `python -m repro` walk as a user runs it, its log beside `out`: the probes of its `name`
    file, the evidence (`exits`: the exit codes that carry an outcome; empty: any)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    result = cmd.run(argv, tee=log_path(out))
    record = out / name
    if (exits and result.returncode not in exits) or not record.is_file():
        raise RunError(
            f"{what} stopped (exit {result.returncode})", why=result.tail(8), fix=f"read {log_path(out)}"
        )
    probes: list[ProbeRow] = json.loads(record.read_text()).get("probes") or []
    return probes


def front_door_probe(call: ProbeCall, ds_repo: str) -> ProbeRow:
    """One probe as a user runs it; its probe.json is the evidence."""
    what = f"the probe {call.scenario}/{call.transport} on torch {call.torch}"
    return (front_door(probe_argv(call, ds_repo), call.out, "probe.json", what, PROBE_EXITS) or [{}])[0]


def export_tree(ds_repo: str, sha: str, dest: Path, paths: Sequence[str]) -> Path:
    """The commit's files at `paths` under dest/ (`git archive`: nothing in DS_REPO changes)."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest.with_suffix(".tar")
    # DS_REPO's filter drivers would run on `git archive` (smudge): safe_git neutralises them.
    git, where = SafeGit(), ["-C", ds_repo]
    listed = git.run("ls-tree", "--name-only", sha, "--", *paths, where=where)
    present = [p for p in listed.stdout.splitlines() if p] if listed.ok else []
    if not present:
        raise UsageError(f"commit {sha[:10]} holds none of {', '.join(paths)}", why=listed.tail(5))
    result = git.run("archive", "--format=tar", "-o", str(archive), sha, "--", *present, where=where)
    if not result.ok:
        raise UsageError(f"git archive {sha[:10]} failed in DS_REPO={ds_repo}", why=result.tail(5))
    try:
        with tarfile.open(archive, mode="r:") as tar:
            # Only files, folders and links that stay under dest (DeepSpeed's deepspeed/accelerator
            # links to ../accelerator); Python 3.11.2 has no extraction filter to do it.
            members = tar.getmembers()
            root = dest.resolve()
            for member in members:
                parts = Path(member.name).parts
                inside = not member.name.startswith("/") and ".." not in parts
                if member.issym():
                    target = (root / Path(member.name).parent / member.linkname).resolve()
                    inside = inside and not member.linkname.startswith("/") and target.is_relative_to(root)
                elif not (member.isfile() or member.isdir()):
                    inside = False
                if not inside:
                    raise UsageError(
                        f"commit {sha[:10]} holds {member.name!r}, which leaves its tree",
                        fix="verify a commit of DeepSpeed",
                    )
            tar.extractall(dest, members=members)
    finally:
        archive.unlink(missing_ok=True)
    return dest


class CellCache:
    """Probe results by a key of what decides them, one JSON file each under the cache
    (`make clean` leaves it; delete ~/.cache/mics-repro/<name> to probe again). Only results are
    kept (pr_checks.is_result): an interrupted probe or a failed install (a pip network error)
    is probed again next time, also when an earlier version of the tool cached it. `keep` says
    what is a result (DeepSpeed's test sessions: pr_suite.worth_caching, which reads its
    cells back as its own Session)."""

    def __init__(
        self,
        name: str,
        root: Path | None = None,
        keep: Callable[[ProbeRow], bool] = pr_checks.is_result,
    ) -> None:
        self.root = root or cache_root() / name
        self.keep = keep

    def get(self, key: str) -> ProbeRow | None:
        try:
            found: ProbeRow | None = json.loads((self.root / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) and self.keep(found) else None

    def put(self, key: str, probe: ProbeRow) -> None:
        if self.keep(probe):
            write_json_atomic(str(self.root / f"{key}.json"), dict(probe))


def probe_key(call: ProbeCall) -> str:
    what = [
        1,
        call.env,
        call.torch,
        call.engine,
        call.commit,
        call.deepspeed,
        call.scenario,
        call.transport,
        call.patch,
    ]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:20]


def cached_probe(call: ProbeCall, cache: CellCache, probe: ProbeRunner, ds_repo: str) -> ProbeRow:
    """The probe's result from the cache, else probed now (and cached when it is a result)."""
    hit = cache.get(probe_key(call))
    if hit is None:
        # A rerun after an interruption: the probe's first folder holds what it began.
        call = replace(call, out=fresh_folder(call.out))
        hit = probe(call, ds_repo).copy()
        cache.put(probe_key(call), hit)
    return hit


RegressionRunner = Callable[[str, str, Path, Path, Path], dict[str, str]]


def harness_regression(python: str, label: str, tree: Path, test_file: Path, work: Path) -> dict[str, str]:
    """test_id -> outcome of the regression test with `tree`'s deepspeed/ first on the path."""
    _, results = pr_regression.run_pytest(python, label, tree, work, "async", test_file)
    return {r.test_id: r.outcome.value for r in results}


# One check on one stack: REF's and the branch's probe (probe.json's first probe) and the verdict.
class CheckEntry(TypedDict):
    stack: str
    env: str
    torch: str
    scenario: str
    transport: str
    key: str
    expect: str
    ref: ProbeRow
    branch: ProbeRow
    ok: bool | None  # None: not applicable (neither side imports with this torch)
    why: str


# The regression test on one stack: each side's {test id: outcome}, and the verdict.
class RegressionEntry(TypedDict, total=False):
    stack: str
    torch: str
    test: str
    ref: dict[str, str]
    branch: dict[str, str]
    ok: bool | None
    why: str


# One probe of the search for the oldest torch REF imports with (repro/upstream/pr/oldest_torch.py).
class TriedJSON(TypedDict):
    torch: str
    imports: bool
    why: str  # the probe's outcome and reason


# verify.json's `oldest_torch`.
class OldestJSON(TypedDict):
    torch: str | None  # the oldest torch REF imports with, when it is older than the others taken
    why: str
    tried: list[TriedJSON]


# verify.json's `stacks`: a Stack's fields.
class StackJSON(TypedDict):
    name: str
    env: str
    torch: str
    role: str
    suite: bool


# verify.json.
class VerifyData(TypedDict):
    kind: str
    ref: str
    ref_sha: str
    branch: str
    commit: str
    stacks: list[StackJSON]
    checks: list[CheckEntry]
    regression: list[RegressionEntry]
    suite: list[pr_suite.SuiteEntry]
    oldest_torch: OldestJSON | None
    verified: bool
    complete: bool
    seconds: float


@dataclass
class Verification:
    pr: Mapping[str, Any]
    stacks: Sequence[Stack]
    out: Path
    ds_repo: str
    engine: str = "venv"
    probe: ProbeRunner = front_door_probe
    regression: RegressionRunner = harness_regression
    cache: CellCache | None = None
    suite: pr_suite.SuiteRunner | None = None  # DeepSpeed's own tests (pr_suite); None: not run
    oldest: OldestJSON | None = None  # the search for the oldest torch REF imports with

    def __post_init__(self) -> None:
        self.data: VerifyData = {
            "kind": "pr-verify",
            "ref": self.pr["ref"],
            "ref_sha": self.pr["ref_sha"],
            "branch": self.pr["branch"],
            "commit": self.pr["commit"],
            "stacks": [cast(StackJSON, asdict(s)) for s in self.stacks],
            "checks": [],
            "regression": [],
            "suite": [],
            "oldest_torch": self.oldest,
            "verified": False,
            "complete": False,
            "seconds": 0.0,
        }

    def save(self) -> None:
        write_json_atomic(str(self.out / "verify.json"), self.data)

    def run(self) -> VerifyData:
        start = time.monotonic()
        folder = self.out / "verify"
        steps = pr_checks.plan(self.stacks)
        cache = self.cache or CellCache("pr-verify")
        for n, (stack, check) in enumerate(steps, 1):
            seen = {}
            for side in ("ref", "branch"):
                sha = self.pr["ref_sha"] if side == "ref" else self.pr["commit"]
                console.info(
                    f"== verify [{n}/{len(steps)}] {check.key} torch {stack.torch} ({stack.name}): "
                    f"{side} {sha[:10]}"
                )
                name = f"{stack.name}-{check.key.replace('@', '-')}-{side}"
                call = ProbeCall(
                    stack.env, stack.torch, sha, check.scenario, check.transport, folder / name, self.engine
                )
                seen[side] = cached_probe(call, cache, self.probe, self.ds_repo)
            ok, why = pr_checks.judge(
                check.expect, Seen.from_probe(seen["ref"]), Seen.from_probe(seen["branch"])
            )
            console.info(f"verify: {check.key} torch {stack.torch}: {why}")
            self.data["checks"].append(
                {
                    "stack": stack.name, "env": stack.env, "torch": stack.torch, "scenario": check.scenario,
                    "transport": check.transport, "key": check.key, "expect": check.expect.value,
                    "ref": seen["ref"], "branch": seen["branch"], "ok": ok, "why": why,
                }
            )  # fmt: skip
            self.save()
        for stack in self.stacks:
            self.data["regression"].append(self._regression(stack, folder))
            self.save()
        if self.suite is not None:
            # beside the probes' cache (a test's own cache root keeps its sessions to itself)
            sessions = self.cache.root.parent / "pr-suite" if self.cache else cache_root() / "pr-suite"
            upstream = pr_suite.UpstreamSuite(
                self.pr, self.ds_repo, self.out / "verify", export_tree, self.engine, self.suite,
                CellCache("pr-suite", sessions, keep=pr_suite.worth_caching),
            )  # fmt: skip
            for stack in (s for s in self.stacks if s.suite):
                self.data["suite"].append(self._suite(upstream, stack))
                self.save()
        self.data["complete"] = True
        judged = [c["ok"] for c in self.data["checks"] + self.data["regression"] if c["ok"] is not None]
        self.data["verified"] = bool(judged) and all(judged)
        self.data["seconds"] = round(time.monotonic() - start, 1)
        self.save()
        return self.data

    def _not_applicable(self, stack: Stack) -> str | None:
        """Why the stack's later steps are not run: the commits import with none of its torch (the
        lab's checks say so); None when they do."""
        checks = [c for c in self.data["checks"] if c["stack"] == stack.name]
        return f"not run: {checks[0]['why']}" if checks and all(c["ok"] is None for c in checks) else None

    def _suite(self, upstream: pr_suite.UpstreamSuite, stack: Stack) -> pr_suite.SuiteEntry:
        """DeepSpeed's own MiCS tests under its harness (pr_suite), where the stack's torch is one
        the commits import."""
        why = self._not_applicable(stack)
        if why:
            return {"stack": stack.name, "torch": stack.torch, "why": why}
        return upstream.run(stack.env, stack.torch, stack.name)

    def _regression(self, stack: Stack, folder: Path) -> RegressionEntry:
        """The branch's test against REF's and the branch's deepspeed/, in the stack's env venv."""
        probes = [c["ref"] for c in self.data["checks"] if c["stack"] == stack.name]
        venv = next((p.get("layered_on") for p in probes if p.get("layered_on")), None)
        entry: RegressionEntry = {"stack": stack.name, "torch": stack.torch, "test": str(pr_fix.TEST_REL)}
        why = self._not_applicable(stack)
        if why:
            entry["ok"], entry["why"] = None, why
            return entry
        if not venv:
            entry["ok"], entry["why"] = False, "no probe of this torch left a venv to run the test in"
            return entry
        python = str(Path(venv) / "bin" / "python")
        trees = folder / "trees"
        test_rel = str(pr_fix.TEST_REL)
        branch_tree = export_tree(self.ds_repo, self.pr["commit"], trees / "branch", [*TREE_PATHS, test_rel])
        ref_tree = export_tree(self.ds_repo, self.pr["ref_sha"], trees / "ref", list(TREE_PATHS))
        test_file = branch_tree / test_rel
        outcomes = {}
        for side, tree in (("ref", ref_tree), ("branch", branch_tree)):
            console.info(f"== verify: regression test, torch {stack.torch}, {side}")
            outcomes[side] = self.regression(
                python, f"{stack.name}-{side}", tree, test_file, folder / "regression"
            )
        ok, why = pr_checks.regression_ok(outcomes["ref"], outcomes["branch"])
        console.info(f"verify: regression test torch {stack.torch}: {why}")
        entry.update({"ref": outcomes["ref"], "branch": outcomes["branch"], "ok": ok, "why": why})
        return entry


MAX_PR_JSON_BYTES = 4 << 20


def read_pr(folder: Path) -> dict[str, Any]:
    """folder/pr.json as `make pr` wrote it; anything else (not JSON, a key missing or of the wrong
    type, another format) is a UsageError that names what is wrong, before git is touched."""
    path = folder / "pr.json"
    fix = "give PR= the OUT folder of a `make pr` run (or make the branch again with `make pr`)"
    if not path.is_file():
        raise UsageError(f"{folder} holds no pr.json", fix=fix)
    try:
        data = json.loads(read_regular(path, MAX_PR_JSON_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise UsageError(f"{path} cannot be read as JSON", why=str(exc), fix=fix) from None
    problem = pr_data_problem(data)
    if problem:
        raise UsageError(
            f"{path} is not a record `make pr` wrote: {problem}",
            why="pr-verify takes REF, the branch's commit and the callers from it",
            fix=fix,
        )
    return dict(data)
