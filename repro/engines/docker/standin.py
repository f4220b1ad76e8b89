"""Stand-in images: a GPU env's Dockerfile built on the local Debian base (CI's check that its
shared steps build). They are kept under their own repository, never under the env's tag (they
do not hold the env's stack), so Docker's layer cache makes the next identical build quick;
`make clean` removes them."""

from __future__ import annotations

from typing import Any

STAND_IN_REPOSITORY = "mics-repro/standin"


def stand_in_client() -> Any:
    """A Docker client that answered a ping (raises when none does)."""
    from repro.engines.docker.engine import _client

    return _client()


def remove_stand_ins(client: Any) -> list[str]:
    """Remove every stand-in image; returns the tags removed."""
    removed = []
    for image in client.images.list(name=STAND_IN_REPOSITORY):
        client.images.remove(image.id, force=True)
        removed.extend(image.tags)
    return removed
