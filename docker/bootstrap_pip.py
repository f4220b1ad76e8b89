"""Install the pinned pip into a venv made `--without-pip`, from pip's own wheel.

Why: on Ubuntu 20.04 bases (rocm56) `python3.9 -m venv` bootstraps the distribution's pip 20.0.2,
built for Python 3.8, which needs a distutils that Python 3.9 there does not have; the venv step
then fails before anything is installed. So those images make the venv without pip and run this:

    python bootstrap_pip.py pip==26.0.1

It takes `pip-<version>-py3-none-any.whl` from PIP_FIND_LINKS (a folder or an http(s) listing, as
the stand-in builds serve the wheelhouse), else, unless PIP_NO_INDEX=1, from PIP_INDEX_URL's
simple page (PyPI by default), checking the sha256 the index gives. pip then installs itself from
that wheel (`python pip.whl/pip install pip.whl`). Standard library only; runs in the image.
"""

from __future__ import annotations

import hashlib
import html.parser
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Mapping

PYPI_SIMPLE = "https://pypi.org/simple"
CA_BUNDLE = "/opt/mics-repro/ca-bundle.pem"  # written by the Dockerfile when docker/certs/ has any


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(value for name, value in attrs if name == "href" and value)


def wheel_name(version: str) -> str:
    return f"pip-{version}-py3-none-any.whl"


def find_link(page: str, base: str, filename: str) -> tuple[str, str | None] | None:
    """(absolute URL, sha256 or None) of `filename` among the page's links, or None."""
    parser = _Links()
    parser.feed(page)
    for href in parser.hrefs:
        url, _, fragment = href.partition("#")
        if urllib.parse.unquote(url.rsplit("/", 1)[-1]) == filename:
            digest = fragment[len("sha256=") :] if fragment.startswith("sha256=") else None
            return urllib.parse.urljoin(base, url), digest
    return None


def _context() -> ssl.SSLContext:
    cafile = os.environ.get("PIP_CERT") or (CA_BUNDLE if os.path.isfile(CA_BUNDLE) else None)
    return ssl.create_default_context(cafile=cafile)


def _read(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120, context=_context()) as response:  # noqa: S310
        data: bytes = response.read()
        return data


def sources(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """Where to look, in order: (where, page) for every PIP_FIND_LINKS entry (a folder, or a URL
    whose page lists the wheels), then the index's project page unless PIP_NO_INDEX is set."""
    found = [("links", s) for s in environ.get("PIP_FIND_LINKS", "").split() if s]
    if environ.get("PIP_NO_INDEX", "0").lower() not in ("1", "true", "yes", "on"):
        index = environ.get("PIP_INDEX_URL") or PYPI_SIMPLE
        found.append(("index", index.rstrip("/") + "/pip/"))
    return found


def fetch(version: str, where: list[tuple[str, str]], dest: str) -> str:
    """Path of the pip wheel in `dest`, taken from the first source that has it."""
    filename = wheel_name(version)
    target = os.path.join(dest, filename)
    tried = []
    for _kind, source in where:
        if "://" not in source:  # a folder
            local = os.path.join(source, filename)
            if os.path.isfile(local):
                shutil.copyfile(local, target)
                return target
            tried.append(local)
            continue
        try:
            link = find_link(_read(source).decode("utf-8", "replace"), source, filename)
        except OSError as exc:
            tried.append(f"{source} ({exc})")
            continue
        if link is None:
            tried.append(source)
            continue
        url, digest = link
        data = _read(url)
        if digest is not None and hashlib.sha256(data).hexdigest() != digest:
            raise SystemExit(f"bootstrap_pip: {url} does not match the index's sha256 {digest}")
        with open(target, "wb") as fh:
            fh.write(data)
        return target
    raise SystemExit(f"bootstrap_pip: {filename} not found; looked in: {', '.join(tried) or 'nothing'}")


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].startswith("pip=="):
        print("usage: bootstrap_pip.py pip==VERSION", file=sys.stderr)
        return 2
    version = argv[0].partition("==")[2]
    with tempfile.TemporaryDirectory() as tmp:
        wheel = fetch(version, sources(os.environ), tmp)
        # pip runs from its own wheel and installs that wheel: no network, no other pip involved.
        return subprocess.call(
            [
                sys.executable,
                os.path.join(wheel, "pip"),
                "install",
                "--no-index",
                "--no-deps",
                "--disable-pip-version-check",
                wheel,
            ]
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
