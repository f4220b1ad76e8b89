"""The command registry: feature modules register subcommands with `@command`; `main` builds
the parser from it. Kept apart from main.py so command modules never import the front door
(no cycle: main -> command modules -> registry)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

Handler = Callable[[argparse.Namespace], int]
Configure = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class Spec:
    name: str
    help: str
    handler: Handler
    configure: Configure | None
    # Exit code for bad options and errors. `probe` uses 128: `git bisect run` reads 1-127 as
    # bad/skip, so a broken probe must exit above 127 to stop the bisection instead.
    error_exit: int | None = None


SPECS: dict[str, Spec] = {}


def command(
    name: str, help_text: str, configure: Configure | None = None, *, error_exit: int | None = None
) -> Callable[[Handler], Handler]:
    """Register a subcommand; feature modules add theirs with this decorator."""

    def wrap(fn: Handler) -> Handler:
        SPECS[name] = Spec(name, help_text, fn, configure, error_exit)
        return fn

    return wrap
