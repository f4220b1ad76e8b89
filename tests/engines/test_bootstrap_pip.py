"""docker/bootstrap_pip.py: pip from its own wheel into a venv made --without-pip (Ubuntu 20.04 bases).

Pure parts (where to look, which link, the hash check) with fake pages; the install itself runs
in the image and is covered by the stand-in build (docker/README.md).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.fixtures.docker_scripts import load_docker_script

bootstrap = load_docker_script("bootstrap_pip")
WHEEL = "pip-26.0.1-py3-none-any.whl"


def test_sources_follow_pips_own_variables() -> None:
    assert bootstrap.sources({}) == [("index", "https://pypi.org/simple/pip/")]
    environ = {"PIP_FIND_LINKS": "http://127.0.0.1:8765/ /wheels", "PIP_INDEX_URL": "https://mirror/simple/"}
    assert bootstrap.sources(environ) == [
        ("links", "http://127.0.0.1:8765/"),
        ("links", "/wheels"),
        ("index", "https://mirror/simple/pip/"),
    ]
    assert bootstrap.sources({**environ, "PIP_NO_INDEX": "1"}) == environ_links(environ)


def environ_links(environ: dict[str, str]) -> list[tuple[str, str]]:
    return [("links", s) for s in environ["PIP_FIND_LINKS"].split()]


def test_find_link_reads_a_simple_page_with_its_hash() -> None:
    page = (
        '<a href="../../packages/aa/pip-26.0-py3-none-any.whl#sha256=00">pip-26.0</a>'
        f'<a href="../../packages/bb/{WHEEL}#sha256=abc">{WHEEL}</a>'
    )
    url, digest = bootstrap.find_link(page, "https://pypi.org/simple/pip/", WHEEL)
    assert url == f"https://pypi.org/packages/bb/{WHEEL}" and digest == "abc"
    assert bootstrap.find_link(page, "https://pypi.org/simple/pip/", "pip-1.0-py3-none-any.whl") is None


def test_fetch_takes_the_wheelhouse_folder_first(tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    (house / WHEEL).write_bytes(b"wheel")
    dest = tmp_path / "dest"
    dest.mkdir()
    got = bootstrap.fetch("26.0.1", [("links", str(house)), ("index", "https://unused/pip/")], str(dest))
    assert Path(got).read_bytes() == b"wheel"


def test_fetch_from_an_index_checks_the_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"the wheel"
    good = hashlib.sha256(data).hexdigest()
    pages = {
        "https://idx/simple/pip/": f'<a href="/files/{WHEEL}#sha256={good}">x</a>'.encode(),
        f"https://idx/files/{WHEEL}": data,
    }
    monkeypatch.setattr(bootstrap, "_read", pages.__getitem__)
    got = bootstrap.fetch("26.0.1", [("index", "https://idx/simple/pip/")], str(tmp_path))
    assert Path(got).read_bytes() == data
    pages["https://idx/simple/pip/"] = f'<a href="/files/{WHEEL}#sha256={"0" * 64}">x</a>'.encode()
    with pytest.raises(SystemExit, match="sha256"):
        bootstrap.fetch("26.0.1", [("index", "https://idx/simple/pip/")], str(tmp_path))


def test_fetch_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="not found; looked in"):
        bootstrap.fetch("26.0.1", [("links", str(tmp_path))], str(tmp_path))
