"""The fix's behaviour, checked on the compiled code itself.

Default tier: the fixed methods are compiled by `repro.workload.fix` (the path `apply()` uses)
into a namespace of fakes that model torch's coalescing manager: inside it, collectives return
placeholders whose wait() raises (torch >= 2.1's `_IllegalWork`), and outputs are only written
when the manager's real work is waited. Each behaviour test also runs against the stock method
taken from the pristine sdist (when the wheelhouse has it) and must fail there: those cases are
strict xfails, so a test that stops catching the bug turns red.

The integration tier (the real torch + DeepSpeed of a dev venv, one rank, with torch's own
`_coalescing_manager` and `_IllegalWork`) is tests/workload/test_fix_integration.py.
"""

from __future__ import annotations

import builtins
import contextlib
import enum
import functools
import importlib.util
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from repro.upstream.patchgen import default_wheelhouse
from repro.workload import fix

COMM, MICS = fix.TARGETS
REPO = Path(__file__).resolve().parents[2]

# A release-shaped module: what `locate` splices into when no sdist is at hand.
SYNTHETIC_COMM = '''\
class TorchBackend:

    def all_gather_coalesced(self, output_tensors, input_tensors, group=None, async_op=False):
        """"""
        raise AssertionError("release statements must have been replaced")
'''
SYNTHETIC_MICS = '''\
class MiCS_AllGatherCoalescedHandle:

    def wait(self) -> None:
        """
        """
        raise AssertionError("release statements must have been replaced")
'''


# ---- fakes -------------------------------------------------------------------------------------


class Buf:
    """A tensor stand-in: a value plus the device attribute DeepSpeed reads."""

    device = "fake:0"

    def __init__(self, value: float | None) -> None:
        self.value = value


class Placeholder:
    """Like torch's _IllegalWork: any wait raises (RuntimeError on 2.1, ValueError on 2.2+)."""

    def __init__(self, exc: type[Exception], log: list[str]) -> None:
        self.exc, self.log = exc, log

    def wait(self) -> None:
        self.log.append("placeholder.wait")
        raise self.exc("Illegal to call wait on IllegalWork object")


class Transport:
    """Collectives are issued now and land later: only a completed work writes its outputs."""

    def __init__(self) -> None:
        self.in_flight: list[tuple[Buf, Buf]] = []

    def land(self, pairs: list[tuple[Buf, Buf]]) -> None:
        for out, inp in pairs:
            out.value = inp.value
            if (out, inp) in self.in_flight:
                self.in_flight.remove((out, inp))


class Work:
    def __init__(self, transport: Transport, pairs: list[tuple[Buf, Buf]]) -> None:
        self.transport, self.pairs, self.waits = transport, pairs, 0

    def wait(self) -> bool:
        self.waits += 1
        self.transport.land(self.pairs)
        return True


class Manager:
    """torch >= 2.1's _CoalescingManager, as far as DeepSpeed can see it."""

    def __init__(self) -> None:
        self.works: list[Work] = []

    def append(self, work: Work | None) -> None:
        if work:
            self.works.append(work)

    def wait(self) -> None:
        for work in self.works:
            work.wait()


DEFAULT_GROUP = "default-group"
# What torch's Backend says when it has no coalescing (gloo): `startCoalescing` is not overridden.
REFUSAL = "Backend gloo does not implement startCoalescing"


class FakeTorch:
    """`torch.distributed.distributed_c10d` reduced to what all_gather_coalesced touches.

    style "2.1": ops inside the manager are recorded and return placeholders; the real work is
    made on exit (kept in the manager when async, waited otherwise; with lose_work it is dropped,
    as pytorch#122807 builds do). style "2.0": the manager yields nothing and each op returns a
    real work of one group (waiting any completes all, like NCCL's grouped launch).
    `enter_error` (style "2.1"): entering the manager raises it, as torch's does when the backend
    refuses `_start_coalescing` (gloo: REFUSAL); like torch, the group stays registered as
    coalescing, so a later op on it is only recorded and returns a placeholder. Outside a manager
    an op is issued on its own and returns its own work.
    """

    def __init__(
        self,
        style: str,
        exc: type[Exception] = ValueError,
        lose_work: bool = False,
        enter_error: Exception | None = None,
        exit_error: Exception | None = None,
    ) -> None:
        self.style, self.exc, self.lose_work = style, exc, lose_work
        self.enter_error, self.exit_error = enter_error, exit_error
        self.transport = Transport()
        self.log: list[str] = []
        # torch's _world.pg_coalesce_state: the groups inside a coalescing block, and their ops
        self.coalescing: dict[Any, list[tuple[Buf, Buf]]] = {}
        self.made: list[Work] = []
        self.syncs = 0
        self.distributed = SimpleNamespace(
            distributed_c10d=SimpleNamespace(
                all_gather_into_tensor=self.all_gather_into_tensor,
                _world=SimpleNamespace(pg_coalesce_state=self.coalescing),
                _get_default_group=lambda: DEFAULT_GROUP,
                _CoalescingManager=Manager,
            )
        )

    def all_gather_into_tensor(
        self, output: Buf, input: Buf, group: Any = None, async_op: bool = False
    ) -> Any:
        self.transport.in_flight.append((output, input))
        recording = self.coalescing.get(group or DEFAULT_GROUP)
        if recording is None:  # not coalescing: issued now, on its own
            assert async_op
            work = Work(self.transport, [(output, input)])
            self.made.append(work)
            return work
        recording.append((output, input))
        if self.style == "2.1":
            return Placeholder(self.exc, self.log)
        work = Work(self.transport, recording)  # shares the group's list
        self.made.append(work)
        return work

    @contextlib.contextmanager
    def manager(self, group: Any, device: Any, reqs: list[Any], async_op: bool) -> Iterator[Any]:
        key = group or DEFAULT_GROUP
        self.coalescing.setdefault(key, [])
        if self.enter_error is not None:
            raise self.enter_error
        if self.style == "2.0":
            yield None
            self.coalescing.pop(key)
            return
        cm = Manager()
        yield cm
        pairs = self.coalescing.pop(key)
        if self.exit_error is not None:
            raise self.exit_error
        work = None if self.lose_work else Work(self.transport, pairs)
        if work is not None:
            self.made.append(work)
        if async_op:
            cm.append(work)
        else:
            work.wait()  # as torch's own manager: with a lost work this raises AttributeError

    def synchronize(self) -> None:
        """The accelerator's device-wide sync: everything in flight lands."""
        self.syncs += 1
        self.transport.land(list(self.transport.in_flight))


class Status(enum.Enum):
    INFLIGHT = 1
    AVAILABLE = 2


class Param:
    def __init__(self) -> None:
        self.ds_status = Status.INFLIGHT

    def ds_summary(self) -> str:
        return "param"


def _identity(func: Any = None, **_: Any) -> Any:
    return func if func is not None else _identity


def comm_namespace(fake: FakeTorch, customized: Callable[..., Any] | None = None) -> dict[str, Any]:
    torch = fake
    if customized is not None:
        torch = SimpleNamespace(
            distributed=SimpleNamespace(
                distributed_c10d=SimpleNamespace(_all_gather_base_coalesced=customized)
            )
        )
    return {
        "__builtins__": builtins,
        "torch": torch,
        "has_coalescing_manager": lambda: True,
        "get_coalescing_manager": fake.manager,
        "get_accelerator": lambda: fake,
        # decorators some releases put on the method (0.13.2+: compiler.disable; 0.19.x: these two)
        "compiler": SimpleNamespace(disable=_identity),
        "disable_compiler_collective": _identity,
        "stage_on_cpu": _identity,
    }


def mics_namespace(logged: list[str]) -> dict[str, Any]:
    return {
        "__builtins__": builtins,
        "instrument_w_nvtx": lambda f: f,
        "ZeroParamStatus": Status,
        "log_dist": lambda msg, ranks=None: logged.append(str(msg)),
    }


# ---- implementations under test ----------------------------------------------------------------


@functools.cache
def _read_member(sdist: Path, member: str) -> str:
    with tarfile.open(sdist) as tar:
        handle = tar.extractfile(member)
        assert handle is not None
        return handle.read().decode()


def sdist_source(version: str, path: str) -> str:
    sdist = default_wheelhouse() / f"deepspeed-{version}.tar.gz"
    if not sdist.is_file():
        pytest.skip(f"{sdist} missing: `python -m repro.upstream.patchgen --check` says how to fetch it")
    return _read_member(sdist, f"deepspeed-{version}/{path}")


def method_text(impl: str, target: fix.Target) -> str:
    """impl: "fixed" (synthetic release), "fixed-<v>" or "stock-<v>" (from that sdist)."""
    kind, _, version = impl.partition("-")
    if not version:
        source = SYNTHETIC_COMM if target is COMM else SYNTHETIC_MICS
    else:
        source = sdist_source(version, target.path)
    splice = fix.locate(source, target)
    if kind == "fixed":
        return fix.function_text(source, splice)
    lines = source.splitlines(keepends=True)
    return "".join(lines[splice.header_start - 1 : splice.end])


def compiled(impl: str, target: fix.Target, namespace: dict[str, Any]) -> Callable[..., Any]:
    return fix.compile_method(method_text(impl, target), target, namespace)  # type: ignore[no-any-return]


STOCK_BUG = pytest.mark.xfail(strict=True, reason="stock DeepSpeed has the bug this test catches")


def impls(stock_mark: pytest.MarkDecorator | None) -> list[Any]:
    """Every implementation; stock ones carry `stock_mark` (None: stock must pass too)."""
    marks = [stock_mark] if stock_mark else []
    return [
        "fixed",
        "fixed-0.13.1",
        "fixed-0.19.6",
        pytest.param("stock-0.13.1", marks=marks),
        pytest.param("stock-0.19.6", marks=marks),
    ]


def gather(impl: str, fake: FakeTorch, n: int = 3, async_op: bool = True) -> tuple[Any, list[Buf]]:
    method = compiled(impl, COMM, comm_namespace(fake))
    outs = [Buf(None) for _ in range(n)]
    ins = [Buf(float(i + 1)) for i in range(n)]
    handle = method(object(), outs, ins, group=None, async_op=async_op)
    return handle, outs


# ---- all_gather_coalesced ----------------------------------------------------------------------


@pytest.mark.parametrize("exc", [RuntimeError, ValueError])
@pytest.mark.parametrize("impl", impls(STOCK_BUG))
def test_async_handle_waits_the_real_work(impl: str, exc: type[Exception]) -> None:
    fake = FakeTorch("2.1", exc)
    handle, outs = gather(impl, fake)
    assert [o.value for o in outs] == [None, None, None], "nothing lands before a wait"
    handle.wait()
    assert [o.value for o in outs] == [1.0, 2.0, 3.0]
    assert [w.waits for w in fake.made] == [1]
    assert fake.log == []


@pytest.mark.parametrize("impl", impls(STOCK_BUG))
def test_sync_gather_never_waits_a_placeholder(impl: str) -> None:
    fake = FakeTorch("2.1", RuntimeError)
    result, outs = gather(impl, fake, async_op=False)
    assert result is None
    assert [o.value for o in outs] == [1.0, 2.0, 3.0], "the manager's exit waited the real work"
    assert fake.log == []


@pytest.mark.parametrize("impl", impls(STOCK_BUG))
def test_lost_work_is_guarded(impl: str) -> None:
    fake = FakeTorch("2.1", ValueError, lose_work=True)
    handle, outs = gather(impl, fake)
    handle.wait()
    assert fake.log == []
    assert [o.value for o in outs] == [1.0, 2.0, 3.0], "nothing real to wait: the device sync landed it"
    assert fake.syncs == 1


@pytest.mark.parametrize("impl", impls(STOCK_BUG))
def test_lost_work_sync_is_guarded(impl: str) -> None:
    # torch <= 2.3 with device= set (pytorch#122807): the hierarchical (synchronous) gather must
    # neither crash with AttributeError in the manager's exit nor return before the data landed.
    fake = FakeTorch("2.1", ValueError, lose_work=True)
    result, outs = gather(impl, fake, async_op=False)
    assert result is None and fake.log == []
    assert [o.value for o in outs] == [1.0, 2.0, 3.0], "nothing real to wait: the device sync landed it"
    assert fake.syncs == 1


@pytest.mark.parametrize("impl", impls(STOCK_BUG))
def test_sync_waits_the_real_work_once(impl: str) -> None:
    fake = FakeTorch("2.1", ValueError)
    gather(impl, fake, async_op=False)
    assert [w.waits for w in fake.made] == [1] and fake.syncs == 0


@pytest.mark.parametrize("impl", impls(None))
def test_torch20_returns_the_last_request(impl: str) -> None:
    fake = FakeTorch("2.0")
    handle, outs = gather(impl, fake)
    assert handle is fake.made[-1]
    handle.wait()
    assert [o.value for o in outs] == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("impl", impls(None))
def test_torch20_sync_waits_the_last_request(impl: str) -> None:
    fake = FakeTorch("2.0")
    result, outs = gather(impl, fake, async_op=False)
    assert result is None
    assert [w.waits for w in fake.made] == [0, 0, 1]
    assert [o.value for o in outs] == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("impl", impls(None))
def test_customized_torch_path_is_untouched(impl: str) -> None:
    calls: list[dict[str, Any]] = []

    def customized(outs: Any, ins: Any, group: Any = None, async_op: bool = False) -> str:
        calls.append({"group": group, "async_op": async_op})
        return "custom-handle"

    method = compiled(impl, COMM, comm_namespace(FakeTorch("2.1"), customized))
    assert method(object(), [Buf(None)], [Buf(1.0)], group="g", async_op=True) == "custom-handle"
    assert calls == [{"group": "g", "async_op": True}]


# A backend without coalescing (gloo as torch ships it): the manager refuses on entry, before any
# collective is issued. Stock DeepSpeed dies there; the fix gathers one by one and waits each.


@pytest.mark.parametrize("impl", impls(STOCK_BUG))
def test_refused_coalescing_gathers_one_by_one(impl: str) -> None:
    fake = FakeTorch("2.1", enter_error=RuntimeError(REFUSAL))
    handle, outs = gather(impl, fake)
    assert fake.coalescing == {}, "the group torch left registered as coalescing is released"
    assert [o.value for o in outs] == [None, None, None], "nothing lands before a wait"
    handle.wait()
    assert [o.value for o in outs] == [1.0, 2.0, 3.0]
    assert [w.waits for w in fake.made] == [1, 1, 1], "one work per gather, each waited once"
    assert fake.log == [] and fake.syncs == 0


@pytest.mark.parametrize("impl", impls(STOCK_BUG))
def test_refused_coalescing_sync_waits_each_gather(impl: str) -> None:
    fake = FakeTorch("2.1", enter_error=RuntimeError(REFUSAL))
    result, outs = gather(impl, fake, async_op=False)
    assert result is None
    assert [o.value for o in outs] == [1.0, 2.0, 3.0]
    assert [w.waits for w in fake.made] == [1, 1, 1]
    assert fake.coalescing == {} and fake.log == []


@pytest.mark.parametrize(
    "where,error",
    [
        ("enter", RuntimeError("NCCL error: unhandled system error")),
        ("enter", ValueError(REFUSAL)),  # the refusal is a RuntimeError; nothing else is taken for it
        ("exit", RuntimeError(REFUSAL)),  # the block started: gathers were issued, never redo them
    ],
)
@pytest.mark.parametrize("impl", impls(None))
def test_other_coalescing_errors_reach_the_caller(impl: str, where: str, error: Exception) -> None:
    fake = FakeTorch(
        "2.1", enter_error=error if where == "enter" else None, exit_error=error if where == "exit" else None
    )
    with pytest.raises(type(error)) as raised:
        gather(impl, fake)
    assert raised.value is error
    assert fake.made == [], "no gather issued outside the manager"


# ---- MiCS_AllGatherCoalescedHandle.wait --------------------------------------------------------


def handle_for(allgather_handle: Any, params: list[Param]) -> SimpleNamespace:
    return SimpleNamespace(allgather_handle=allgather_handle, params=params, complete=False)


# Stock 0.13.1 catches RuntimeError only (torch 2.1's placeholder); 0.13.2+ also ValueError.
@pytest.mark.parametrize(
    "impl,exc",
    [
        ("fixed", RuntimeError),
        ("fixed", ValueError),
        ("fixed-0.13.1", RuntimeError),
        ("fixed-0.19.6", ValueError),
        pytest.param("stock-0.13.1", RuntimeError, marks=STOCK_BUG),
        ("stock-0.13.1", ValueError),
        pytest.param("stock-0.19.6", RuntimeError, marks=STOCK_BUG),
        pytest.param("stock-0.19.6", ValueError, marks=STOCK_BUG),
    ],
)
def test_mics_handle_propagates_a_failed_wait(impl: str, exc: type[Exception]) -> None:
    logged: list[str] = []
    wait = compiled(impl, MICS, mics_namespace(logged))
    params = [Param(), Param()]
    handle = handle_for(Placeholder(exc, []), params)
    with pytest.raises(exc):
        wait(handle)
    assert [p.ds_status for p in params] == [Status.INFLIGHT, Status.INFLIGHT]
    assert handle.complete is False


@pytest.mark.parametrize("impl", impls(None))
def test_mics_handle_marks_params_available_once(impl: str) -> None:
    fake = FakeTorch("2.1")
    wait = compiled(impl, MICS, mics_namespace([]))
    work = Work(fake.transport, [])
    params = [Param(), Param()]
    handle = handle_for(work, params)
    wait(handle)
    assert [p.ds_status for p in params] == [Status.AVAILABLE, Status.AVAILABLE]
    assert handle.complete is True
    params[0].ds_status = Status.INFLIGHT  # a second wait must return before touching params
    wait(handle)
    assert params[0].ds_status is Status.INFLIGHT
    assert work.waits == 2


# ---- splice / compile / apply ------------------------------------------------------------------


def test_splice_keeps_release_header_and_is_idempotent() -> None:
    decorated = SYNTHETIC_COMM.replace("    def all_gather", "    @stage_on_cpu\n    def all_gather")
    spliced = fix.patched_source(decorated, (COMM,))
    text = fix.function_text(spliced, fix.locate(spliced, COMM))
    assert text.startswith("    @stage_on_cpu\n    def all_gather_coalesced(self, output_tensors,")
    assert "as cm:" in text and "release statements must have been replaced" not in spliced
    assert not fix.locate(decorated, COMM).unchanged
    assert fix.locate(spliced, COMM).unchanged
    assert fix.patched_source(spliced, (COMM,)) == spliced


def test_missing_method_is_a_typed_error() -> None:
    with pytest.raises(fix.FixNotApplicableError, match="has no TorchBackend.all_gather_coalesced"):
        fix.locate("class TorchBackend:\n    pass\n", COMM)


def test_missing_helper_is_a_typed_error() -> None:
    namespace = comm_namespace(FakeTorch("2.1"))
    del namespace["get_coalescing_manager"]
    with pytest.raises(fix.FixNotApplicableError, match="get_coalescing_manager"):
        compiled("fixed", COMM, namespace)


def test_compiled_method_has_its_qualname() -> None:
    method = compiled("fixed", COMM, comm_namespace(FakeTorch("2.1")))
    assert method.__qualname__ == "TorchBackend.all_gather_coalesced"


@pytest.fixture
def fresh_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fix, "_INSTALLED", {})


def load_module(path: Path, name: str, text: str, extra: dict[str, Any]) -> ModuleType:
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(extra)
    spec.loader.exec_module(module)
    return module


def fake_deepspeed(tmp_path: Path, mics_source: str = SYNTHETIC_MICS) -> dict[str, Any]:
    fake = FakeTorch("2.1")
    comm = load_module(tmp_path / "fake_comm.py", "fake_comm", SYNTHETIC_COMM, comm_namespace(fake))
    mics = load_module(tmp_path / "fake_mics.py", "fake_mics", mics_source, mics_namespace([]))
    return {"deepspeed": SimpleNamespace(__version__="0.0.test"), COMM.module: comm, MICS.module: mics}


@pytest.mark.usefixtures("fresh_fix")
def test_apply_replaces_both_methods_and_is_idempotent(tmp_path: Path) -> None:
    modules = fake_deepspeed(tmp_path)
    first = fix.apply(modules.__getitem__)
    assert first == {
        "applied": True,
        "deepspeed": "0.0.test",
        "fix_id": fix.FIX_ID,
        "patched": [COMM.qualname, MICS.qualname],
        "source": "runtime",
        "package_dir": None,  # the stand-in `deepspeed` module has no file
    }
    installed = modules[COMM.module].TorchBackend.__dict__["all_gather_coalesced"]
    assert fix.apply(modules.__getitem__) == first
    assert modules[COMM.module].TorchBackend.__dict__["all_gather_coalesced"] is installed
    # the installed code runs in the module's globals: it sees the module's fake torch
    handle = installed(object(), [Buf(None)], [Buf(5.0)], async_op=True)
    assert isinstance(handle, Manager) and len(handle.works) == 1
    assert set(fix.installed_sources()) == {COMM.qualname, MICS.qualname}


@pytest.mark.usefixtures("fresh_fix")
def test_apply_changes_nothing_when_a_target_is_missing(tmp_path: Path) -> None:
    modules = fake_deepspeed(tmp_path, mics_source="class Other:\n    pass\n")
    before = modules[COMM.module].TorchBackend.__dict__["all_gather_coalesced"]
    with pytest.raises(fix.FixNotApplicableError, match="MiCS_AllGatherCoalescedHandle"):
        fix.apply(modules.__getitem__)
    assert modules[COMM.module].TorchBackend.__dict__["all_gather_coalesced"] is before
    assert fix.installed_sources() == {}


@pytest.mark.usefixtures("fresh_fix")
def test_apply_reports_missing_module(tmp_path: Path) -> None:
    modules = fake_deepspeed(tmp_path)

    def importer(name: str) -> Any:
        if name == MICS.module:  # DeepSpeed 0.19.8 removed MiCS
            raise ModuleNotFoundError(f"No module named {name!r}")
        return modules[name]

    with pytest.raises(fix.FixNotApplicableError, match="cannot import deepspeed.runtime.zero.mics"):
        fix.apply(importer)
    assert fix.installed_sources() == {}


@pytest.mark.usefixtures("fresh_fix")
def test_apply_leaves_an_already_patched_install_alone(tmp_path: Path) -> None:
    mics = fix.patched_source(SYNTHETIC_MICS, (MICS,))
    modules = fake_deepspeed(tmp_path, mics_source=mics)
    before = modules[MICS.module].MiCS_AllGatherCoalescedHandle.__dict__["wait"]
    assert fix.apply(modules.__getitem__)["source"] == "in-source+runtime"
    assert modules[MICS.module].MiCS_AllGatherCoalescedHandle.__dict__["wait"] is before


@pytest.mark.usefixtures("real_subprocess")
def test_fix_module_imports_only_the_standard_library() -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import repro.workload.fix; "
        "bad = sorted(m for m in sys.modules "
        "             if m.split('.')[0] in ('torch', 'deepspeed', 'docker', 'jinja2', 'packaging')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
