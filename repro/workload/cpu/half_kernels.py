"""fp16 (Half) kernels that torch lacks on CPU, supplied by computing in fp32 (CPU runs only).

Test scaffolding, not part of the bug: torch < 2.2 has no CPU kernel for Half in matmul
(addmm/mm/bmm/baddbmm), layer norm, softmax/log_softmax, nll_loss, dropout and more, so any fp16
job (the lab's model, a user's, DeepSpeed's own tests) stops with "... not implemented for 'Half'"
on the CPU twin. This adapter is a `TorchDispatchMode` pushed once in each rank. It sits below
autograd, so torch's and DeepSpeed's Python code and the autograd graph are untouched: it sees
the aten ops they issue. Every op goes to torch's own kernel first; an op whose kernel raises
"not implemented for 'Half'" on a call whose floating-point tensors are all Half is remembered,
and such calls of it run on fp32 copies of the Half tensors, with the results rounded back to
Half (tensors the op writes to are written back). A call mixing Half and fp32 always goes to
torch's kernel, which refuses or runs it as on a stock install. Storage stays fp16 between ops,
so overflow to inf, NaN and the loss scaler behave as in an fp16 run; only the arithmetic inside
those ops is fp32, as a GPU's fp16 matmul accumulates in fp32.

Dispatch modes are per thread. The mode is pushed in the thread that prepares the rank (the
thread that imports DeepSpeed, for a user's job): that is where the model runs, and autograd on
CPU runs the backward pass in the thread that calls `backward()`, carrying the mode along. A
thread the job starts itself does not get the mode (its Half ops fail as on a stock install).

Installed only where torch lacks the kernels (`torch_runs_fp16_on_cpu`): torch 2.13 has them and
gets nothing.
"""

from __future__ import annotations

from typing import Any, TypedDict

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _push_mode
from torch.utils._pytree import tree_map

MISSING_KERNEL = "not implemented for 'Half'"
WHAT = "fp32 compute, fp16 storage, for the aten ops whose CPU kernel lacks Half"


# What install() put in place, for the record (error: the hook's, when it failed).
class HalfKernels(TypedDict, total=False):
    what: str
    reason: str  # the missing kernel's error
    torch: str
    upcast_ops: list[str]  # live: every op met so far
    error: str


_INSTALLED: HalfKernels = {}


def _all_floats_half(values: Any) -> bool:
    """Whether every floating-point tensor in `values` is Half (and there is one). Only such calls
    are computed in fp32: a call mixing Half and fp32 goes to torch's kernel, which refuses it
    or runs it exactly as on a stock install."""
    dtypes = set()

    def visit(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            dtypes.add(value.dtype)
        return value

    tree_map(visit, values)
    return dtypes == {torch.float16}


# kwargs below: an aten op's keyword arguments, whatever its schema names.
def _written_args(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The tensors an in-place or out= overload writes to (its schema marks them)."""
    written: list[Any] = []
    for position, argument in enumerate(func._schema.arguments):
        alias = argument.alias_info
        if alias is None or not alias.is_write:
            continue
        value = args[position] if position < len(args) else kwargs.get(argument.name)
        written.extend(v for v in (value if isinstance(value, (list, tuple)) else [value]) if v is not None)
    return written


class HalfViaFloat32(TorchDispatchMode):  # type: ignore[misc]  # no torch in the lint venv
    """Runs the aten ops whose CPU kernel lacks Half on fp32 copies (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.upcast_ops: list[str] = []  # in the order first met; the record lists them
        self._lacking: set[Any] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in self._lacking and _all_floats_half((args, kwargs)):
            return self.in_float32(func, args, kwargs)
        try:
            return func(*args, **kwargs)
        except (RuntimeError, NotImplementedError) as exc:
            # torch checks the dtype before its kernel touches any tensor, so nothing was
            # written yet and the call can be made again.
            if MISSING_KERNEL not in str(exc) or not _all_floats_half((args, kwargs)):
                raise
        self._lacking.add(func)
        self.upcast_ops.append(str(func))
        return self.in_float32(func, args, kwargs)

    @staticmethod
    def in_float32(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """`func` on fp32 copies of its Half tensors (and fp32 for a Half dtype argument); fp32
        results come back as Half, as torch's Half kernel would give them."""
        copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def up(value: Any) -> Any:
            if value is torch.float16:  # a dtype argument (`_softmax_backward_data`'s input_dtype)
                return torch.float32
            if isinstance(value, torch.Tensor) and value.dtype == torch.float16:
                if id(value) not in copies:
                    copies[id(value)] = (value, value.float())
                return copies[id(value)][1]
            return value

        result = func(*tree_map(up, args), **tree_map(up, kwargs))
        originals = {id(copy): original for original, copy in copies.values()}
        for written in _written_args(func, args, kwargs):
            if id(written) in copies:
                computed = copies[id(written)][1]
                if written.shape != computed.shape:  # an out= tensor the op resized
                    written.resize_(computed.shape)
                written.copy_(computed)

        def down(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            if id(value) in originals:  # an in-place/out= op hands back what it wrote to
                return originals[id(value)]
            # fp32 where torch's Half kernel would give Half: round to fp16 (inf on overflow)
            return value.to(torch.float16) if value.dtype == torch.float32 else value

        return tree_map(down, result)


def installed() -> HalfKernels | None:
    """What `install` returned in this process, or None before it ran."""
    return _INSTALLED or None


def install(reason: str) -> HalfKernels:
    """Push the mode in this thread (once per process); returns what the record shows. The
    returned `upcast_ops` is the live list: a record written later lists every op met by then."""
    if not _INSTALLED:
        mode = HalfViaFloat32()
        _push_mode(mode)  # never popped: the rank computes under it until it exits
        _INSTALLED.update(
            {"what": WHAT, "reason": reason, "torch": torch.__version__, "upcast_ops": mode.upcast_ops}
        )
    return _INSTALLED
