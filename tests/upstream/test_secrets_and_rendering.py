"""Secrets by name and by shape, and a REPORT.md that embeds no HTML from the records
(issue 22, items 15 and 16)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt

from repro.core.errors import BundleError
from repro.core.scrub import Scrubber, secret_name
from repro.upstream.bundle import files as bundle_files
from tests.fixtures.report_records import ResultsBuilder, standard_env

# ---- item 15: SSHPASS=..., Password=... in a connection string -----------------------------------


def _clean_host() -> Scrubber:
    return Scrubber.from_host({}, home="/nonexistent", hostnames=[], user="")


@pytest.mark.parametrize(
    "line,secret",
    [
        ("+ SSHPASS=hunter2-x sshpass -e rsync data/ node2:", "hunter2-x"),
        ("conn: Server=db;Database=train;User Id=sa;Password=Pa55-word;", "Pa55-word"),
        ("dsn = Driver={PG};Uid=me;Pwd=s3cr3t!", "s3cr3t!"),
        ('environ: {"DB_TOKEN": "tkn-0451", "PATH": "/usr/bin"}', "tkn-0451"),
        ("export MY_SECRET='quoted value'", "quoted"),
    ],
)
def test_secrets_named_in_a_log_are_scrubbed_and_the_scan_refuses_them(
    line: str, secret: str, tmp_path: Path
) -> None:
    scrubber = _clean_host()  # the bundling shell's own environment holds none of them
    log = tmp_path / "job.log"
    log.write_text(line + "\n")
    with pytest.raises(BundleError):
        bundle_files.scan(tmp_path, scrubber)
    bundle_files.copy_scrubbed(log, log, scrubber)
    assert secret not in log.read_text()
    bundle_files.scan(tmp_path, scrubber)  # what is left passes


def test_evidence_that_only_looks_like_an_assignment_is_kept() -> None:
    text = "PATH=/usr/bin BYPASS_CACHE=1 steps=10 KeyError: 'x' PWD=/srv/run reason: clean https://x.org/a"
    assert _clean_host().text(text) == text


@pytest.mark.parametrize("name", ["SSHPASS", "DBPWD", "SSHKEY", "APIKEY", "DB_PASSWORD", "GH_TOKEN"])
def test_compound_secret_names(name: str) -> None:
    assert secret_name(name)
    scrubber = Scrubber.from_host({name: "v4lue-of-it"}, home="/nonexistent", hostnames=[], user="")
    assert "v4lue-of-it" not in scrubber.text("x v4lue-of-it y")


@pytest.mark.parametrize("name", ["BYPASS_CACHE", "COMPASS_DIR", "KEYBOARD_LAYOUT", "PATH", "MONKEY"])
def test_ordinary_names_stay_ordinary(name: str) -> None:
    assert not secret_name(name)


# ---- item 16: REPORT.md from a crafted results.json holds no live HTML ---------------------------

HOSTILE = "<script>alert(1)</script>"
SVG = "<svg onload=alert(2)>"


def _crafted(tmp_path: Path) -> Path:
    b = ResultsBuilder(tmp_path / "r", "20250101T000000Z-cpu")
    b.env("cpu")
    standard_env(b, "cpu")
    folder = b.write()
    path = folder / "results.json"
    data: dict[str, Any] = json.loads(path.read_text())
    env = data["envs"]["cpu"]
    env["pins"][HOSTILE] = SVG
    env["pins"]["torch"] = f"2.1.0{HOSTILE}"
    env["image_id"] = f"sha256:`{HOSTILE}`"
    env["engine"] = f"docker{SVG}"
    data["invocation"]["command"] = f"make repro {HOSTILE}"
    data["invocation"]["host"]["os"] = SVG
    for run in data["runs"]:
        run["versions"] = {**(run.get("versions") or {}), "deepspeed": f"0.13.1{SVG}"}
    path.write_text(json.dumps(data))
    return folder


def _live_html(markdown: str) -> list[str]:
    """Raw HTML that a CommonMark renderer would pass through (inline and block)."""
    found: list[str] = []

    def walk(tokens: Any) -> None:
        for tok in tokens:
            if tok.type in ("html_inline", "html_block"):
                found.append(tok.content)
            if tok.children:
                walk(tok.children)

    walk(MarkdownIt("commonmark").parse(markdown))
    return found


def test_report_md_escapes_html_in_every_interpolated_value(tmp_path: Path) -> None:
    from repro.report.build import build_report

    folder = _crafted(tmp_path)
    paths = build_report([folder], tmp_path / "out")
    markdown = Path(str(paths.markdown)).read_text()
    live = "\n".join(_live_html(markdown))
    assert "<script" not in live.lower() and "onload" not in live.lower()
    assert "<details>" in live  # the report's own HTML is still there
    # The values are shown, escaped, not dropped.
    assert "&lt;svg onload=alert(2)&gt;" in markdown or "<svg onload=alert(2)>" in markdown
