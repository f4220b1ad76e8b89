"""How many ranks a job's command asks for, read from its launcher's arguments: a pure module.

A user's command names its launcher: `torchrun`, `python -m torch.distributed.run` (or the older
`torch.distributed.launch`), DeepSpeed's `deepspeed`, or `accelerate launch`. Each says how many
processes to start in its own words, and `accelerate launch` starts ONE process on a host without
GPUs unless it is told to start several (`--multi_gpu`, or a config file whose distributed_type
asks for more than one process). The lab compares what was asked with the ranks that really joined
a process group (the hook's reports) and says so when fewer started, with the flag that fixes it
(repro/run/job.py). Reading the command is all this module does: nothing is run.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

# Options whose value is the per-node process count, by launcher.
_TORCHRUN_COUNT = ("--nproc_per_node", "--nproc-per-node")
_TORCHRUN_NODES = ("--nnodes",)
_DEEPSPEED_COUNT = ("--num_gpus", "--num-gpus")
_DEEPSPEED_NODES = ("--num_nodes", "--num-nodes")
_ACCELERATE_COUNT = ("--num_processes", "--num-processes")
_ACCELERATE_MULTI = ("--multi_gpu", "--multi-gpu", "--multi_cpu", "--multi-cpu", "--use_deepspeed")
_ACCELERATE_CONFIG = ("--config_file", "--config-file")
# accelerate's distributed types that start one process per rank (config files).
_ACCELERATE_MULTI_TYPES = {
    "MULTI_GPU",
    "MULTI_CPU",
    "MULTI_NPU",
    "MULTI_XPU",
    "MULTI_MLU",
    "DEEPSPEED",
    "FSDP",
}


@dataclass(frozen=True)
class Asked:
    """What the command asks for. `ranks` None: the launcher's count depends on the host (e.g.
    `--nproc_per_node gpu`, or deepspeed without --num_gpus): nothing to compare."""

    launcher: str  # "torchrun", "deepspeed", "accelerate launch"
    ranks: int | None
    how: str  # the words of the command that said it, e.g. "--nproc_per_node 2"
    single_process: bool = False  # accelerate launch will start one process whatever `ranks` says
    fix: str = ""  # what makes the launcher start `ranks` processes, when it will not


def _value(words: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the first option named `names` (`--opt V` or `--opt=V`), else None."""
    for i, word in enumerate(words):
        for name in names:
            if word == name and i + 1 < len(words):
                return words[i + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _times(per_node: int | None, nodes: str | None) -> int | None:
    """Per-node count times a fixed node count (`--nnodes 2`; a range `1:2` is not fixed)."""
    count = _int(nodes) if nodes is not None else 1
    return None if per_node is None or count is None else per_node * count


def _launcher_words(words: list[str]) -> tuple[str, list[str]] | None:
    """(launcher, its arguments up to the script) for the first launcher in the command."""
    for i, word in enumerate(words):
        name = Path(word).name
        rest = words[i + 1 :]
        if name == "torchrun":
            return "torchrun", rest
        if name == "deepspeed":
            return "deepspeed", rest
        if name == "accelerate" and rest[:1] == ["launch"]:
            return "accelerate launch", rest[1:]
        if word == "-m" and rest[:1] in (["torch.distributed.run"], ["torch.distributed.launch"]):
            return "torchrun", rest[1:]
    return None


def _config(path: str | None, workdir: Path | None) -> dict[str, str]:
    """Top-level `key: value` lines of an accelerate config file (YAML, read as lines: the two keys
    needed here are plain scalars); {} when it cannot be read."""
    if not path:
        return {}
    file = Path(path)
    if not file.is_absolute() and workdir is not None:
        file = workdir / file
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line[:1].isspace() or ":" not in line:
            continue
        key, _, value = line.partition(":")
        found[key.strip()] = value.strip().strip("'\"")
    return found


def _accelerate(args: list[str], workdir: Path | None) -> Asked:
    config = _config(_value(args, _ACCELERATE_CONFIG), workdir)
    given = _value(args, _ACCELERATE_COUNT)
    ranks = _int(given) if given is not None else _int(config.get("num_processes"))
    how = f"--num_processes {given}" if given is not None else f"num_processes: {ranks} in its config file"
    multi = (
        any(a in _ACCELERATE_MULTI for a in args)
        or config.get("distributed_type", "") in _ACCELERATE_MULTI_TYPES
    )
    single = bool(ranks and ranks > 1 and not multi)
    fix = "add --multi_gpu to `accelerate launch` (it starts one process otherwise on a host without GPUs)"
    return Asked("accelerate launch", ranks, how, single_process=single, fix=fix if single else "")


def asked_ranks(command: str, workdir: Path | None = None) -> Asked | None:
    """What the command's launcher asks for; None when no known launcher is in it (a plain
    `python train.py` is one process by the user's choice)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    found = _launcher_words(words)
    if found is None:
        return None
    launcher, args = found
    if launcher == "accelerate launch":
        return _accelerate(args, workdir)
    count_names, node_names = (
        (_TORCHRUN_COUNT, _TORCHRUN_NODES) if launcher == "torchrun" else (_DEEPSPEED_COUNT, _DEEPSPEED_NODES)
    )
    given = _value(args, count_names)
    nodes = _value(args, node_names)
    ranks = _times(_int(given), nodes) if given is not None else (1 if launcher == "torchrun" else None)
    how = f"{count_names[0]} {given}" if given is not None else f"no {count_names[0]}"
    if nodes is not None:
        how += f" {node_names[0]} {nodes}"
    return Asked(launcher, ranks, how)


def shortfall(asked: Asked | None, started: int | None) -> str:
    """The note for a job that started fewer ranks than it asked for; "" when it started as many,
    or either number is unknown. A launcher known to start one process whatever it is asked
    (accelerate launch without --multi_gpu) says so even when no rank got far enough to be counted
    (e.g. the single process crashed before it joined a process group)."""
    if asked is not None and asked.single_process and started is None:
        started = 1
    if asked is None or asked.ranks is None or started is None or started >= asked.ranks:
        return ""
    words = f"the command asks for {asked.ranks} ranks ({asked.launcher} {asked.how}) but {started} started"
    if asked.single_process:
        return f"{words}: {asked.fix}"
    return f"{words}: on the CPU twin every rank is a process on this host; check the launcher's arguments"
