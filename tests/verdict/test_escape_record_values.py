"""Issue #32 item 6: a value from a record (commit subject, scenario, command, env id, pins) is
escaped for the text it lands in: ISSUE.md and REPORT.md (Markdown for GitHub), report.html, and
the terminal. Each check renders what a reader would see (CommonMark + tables, every link
allowed) and looks for what the hostile value tried to make live."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt

from repro.core import console, templating
from repro.core.scrub import Scrubber
from repro.upstream.issue import make as issue
from tests.fixtures.bisect_entries import commit_entry, commits_entry, probe_entry
from tests.fixtures.report_records import ResultsBuilder, standard_env

# Everything a hostile value could try at once: a newline and a heading, a tag, a closing
# </details>, a javascript: link, a mention, a terminal escape, bidi overrides and a fence.
HOSTILE = (
    "x\n# Injected heading\n<script>alert(1)</script></details> [x](javascript:alert(1)) "
    "@team \x1b[2J\u202egnp.exe\u2066 ```"
)
ENV_ID = "cpu[x](javascript:alert(1))@team\u202e"  # no '/' or newline: it names a folder too
TERMINAL_BAD = ("\x1b", "\x9b", "\u202e", "\u2066", "\x07")


def _html(markdown: str) -> str:
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    md.validateLink = lambda url: True  # show what the Markdown asks for, not what one renderer allows
    return md.render(markdown)


def _outside_code(html: str) -> str:
    html = re.sub(r"<pre>.*?</pre>", "", html, flags=re.S)
    return re.sub(r"<code[^>]*>.*?</code>", "", html, flags=re.S)


def _raw_outside_code(markdown: str) -> str:
    """The Markdown source without its fenced blocks and code spans (those show text literally)."""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    fenced = {i for t in tokens if t.type in ("fence", "code_block") and t.map for i in range(*t.map)}
    lines = [line for i, line in enumerate(markdown.splitlines()) if i not in fenced]
    text = "\n".join(lines)
    return re.sub(r"(?<![\\`])(`+)(?!`).*?(?<!`)\1(?!`)", "", text)


def assert_inert(markdown: str) -> None:
    html = _html(markdown)
    live = _outside_code(html)
    assert "<script" not in live.lower()
    assert 'href="javascript:' not in live
    assert not re.search(r"<h[1-6]>\s*Injected", html)  # the title's own heading may quote it
    raw = _raw_outside_code(markdown)
    assert not any(line.lstrip().startswith("# Injected") for line in raw.splitlines())
    # GitHub links mentions in text outside code only (not in attributes such as an image's alt).
    assert "@team" not in re.sub(r"<[^>]*>", "", live)
    assert html.count("<details>") == html.count("</details>")
    assert "](javascript:" not in raw
    for ch in TERMINAL_BAD:
        assert ch not in markdown


# ---- ISSUE.md -------------------------------------------------------------------------------------


def _probe(version: str, outcome: str, verdict: str, record: str | None = None) -> dict[str, Any]:
    versions = {"python": "3.11.7", "torch": HOSTILE, "deepspeed": "0.19.3"}
    return probe_entry(
        version, outcome, verdict, record, reason=f"{outcome}: {HOSTILE}", env=ENV_ID, versions=versions
    )


def _commit(short: str, subject: str) -> dict[str, Any]:
    return {
        **commit_entry(short, subject, date="2026-01-01", pr=1, pr_url="javascript:alert(1)"),
        "files": f" mics.py | 4 +-\n{HOSTILE}",
    }


@pytest.fixture
def bisect_folder(tmp_path: Path) -> Path:
    out = tmp_path / "bisect-1"
    run = out / "cpu" / "runs" / "r"
    run.mkdir(parents=True)
    stack = f'Current thread 0x02 (most recent call first):\n  File "/x/deepspeed/{HOSTILE}", line 1 in f\n'
    (run / "record.json").write_text(json.dumps({"stacks": {"0": stack, "1": stack}}))
    bad = _probe("02663d6", "hung", "bad", "cpu/runs/r/record.json")
    good = _probe("1111111", "clean", "good")
    reproduce = {"make": f"make probe {HOSTILE}", "pip": f"pip install {HOSTILE}", "command": HOSTILE}
    commits = commits_entry(bad, good, (_commit("02663d6", HOSTILE), _commit("1111111", HOSTILE)), reproduce)
    data = {
        "kind": "bisect",
        "axis": "deepspeed",
        "env": ENV_ID,
        "scenario": HOSTILE,
        "patch": HOSTILE,
        "bad_if": HOSTILE,
        "status": "found",
        "first_bad": HOSTILE,
        "last_good": "0.19.2",
        "evidence": {"first_bad": bad, "last_good": good},
        "change_points": [],
        "probes": [_probe(HOSTILE, "clean", "good"), bad],
        "repro_command": f"make repro {HOSTILE}",
        "commits": commits,
    }
    (out / "bisect.json").write_text(json.dumps(data))
    return out


def test_issue_md_shows_hostile_record_values_inert(bisect_folder: Path) -> None:
    text = issue.render(bisect_folder, Scrubber.from_host({}, home="/home/alice", hostnames=[], user="alice"))
    assert_inert(text)
    # Shown, not dropped: the subject's words are there, escaped.
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "Injected heading" in text


def test_issue_md_escapes_a_survey_command_in_its_fence(tmp_path: Path) -> None:
    (tmp_path / "survey.json").write_text(
        json.dumps(
            {
                "kind": "survey",
                "axis": "deepspeed",
                "env": ENV_ID,
                "scenario": HOSTILE,
                "patch": "fixed",
                "command": f"make survey\n```\n{HOSTILE}",
                "change_points": [],
                "probes": [_probe("0.19.2", "clean", "")],
            }
        )
    )
    text = issue.render(tmp_path, Scrubber.from_host({}, home="/home/alice", hostnames=[], user="alice"))
    assert_inert(text)


def test_a_secret_is_scrubbed_before_it_is_escaped(bisect_folder: Path) -> None:
    """The scrubber still finds a secret that Markdown escaping would have changed (`<`, `|`, `&`)."""
    secret = "s3cr<et|pa&ss"
    data = json.loads((bisect_folder / "bisect.json").read_text())
    data["scenario"] = f"mics {secret}"
    (bisect_folder / "bisect.json").write_text(json.dumps(data))
    scrubber = Scrubber.from_host({"DB_PASS": secret}, home="/home/alice", hostnames=[], user="alice")
    text = issue.render(bisect_folder, scrubber)
    assert "s3cr" not in text and "DB_PASS" in text


# ---- REPORT.md and report.html ------------------------------------------------------------------


def _hostile_results(tmp_path: Path) -> Path:
    b = ResultsBuilder(tmp_path / "r", "20250101T000000Z-cpu")
    b.env(ENV_ID)
    standard_env(b, ENV_ID)
    folder = b.write()
    path = folder / "results.json"
    data: dict[str, Any] = json.loads(path.read_text())
    env = data["envs"][ENV_ID]
    env["pins"]["torch"] = HOSTILE
    env["engine"] = HOSTILE
    env["derived_from"] = HOSTILE
    env["image_id"] = HOSTILE
    data["invocation"]["command"] = f"make repro\n```\n{HOSTILE}"
    data["invocation"]["host"]["os"] = HOSTILE
    data["invocation"]["tool_version"] = HOSTILE
    path.write_text(json.dumps(data))
    return folder


def test_report_md_and_html_show_hostile_values_inert(tmp_path: Path) -> None:
    from repro.report.build import build_report

    paths = build_report([_hostile_results(tmp_path)], tmp_path / "out")
    markdown = Path(str(paths.markdown)).read_text()
    assert_inert(markdown)
    html = Path(str(paths.html)).read_text()
    assert "<script>alert" not in html
    for ch in TERMINAL_BAD:
        assert ch not in html
    assert "\\x1b[2J" in html and "\\u202e" in html  # shown, escaped


# ---- the filters themselves -----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["a`b", "``x``", "`", "ends with `", "| pipe |", HOSTILE])
def test_a_code_span_shows_its_value_and_cannot_be_closed_early(value: str) -> None:
    span = str(templating.code_span(value))
    tokens = MarkdownIt("commonmark").parseInline(f"before {span} after")[0].children or []
    codes = [t.content for t in tokens if t.type == "code_inline"]
    assert len(codes) == 1 and "after" not in codes[0] and "before" not in codes[0]


def test_a_fence_is_longer_than_any_backtick_run_in_its_value() -> None:
    value = "````` inside\n```\nmore"
    fence = templating.fence(value)
    tokens = MarkdownIt("commonmark").parse(f"{fence}sh\n{value}\n{fence}\nafter\n")
    assert [t.type for t in tokens][0] == "fence" and tokens[0].content == value + "\n"


@pytest.mark.parametrize("start", ["# h", "## h", "=", "---", "- item", "+ item", "* item", "1. item", "> q"])
def test_a_value_at_a_line_start_cannot_open_a_block(start: str) -> None:
    html = _html(f"para\n{templating.md_inline(start)}\n")
    assert html.startswith("<p>") and html.count("<p>") == 1 and "<h" not in html and "<li>" not in html


# ---- the terminal -------------------------------------------------------------------------------


def test_summary_table_escapes_record_values() -> None:
    from repro.run.summary import render

    run = {
        "env": "cpu\x1b[2J",
        "scenario": "custom\u202e",
        "patch": "stock",
        "dtype": "fp32",
        "outcome": "crashed",
        "signature": "none\x07",
        "exception": {"type": "Err\x9b31m"},
        "world_size": 2,
    }
    text = render([run], "/tmp/r\u2066")  # type: ignore[list-item]
    for ch in TERMINAL_BAD:
        assert ch not in text
    assert "\\x1b" in text and "\\u202e" in text


@pytest.mark.parametrize("say", [console.result, console.info, console.warn])
def test_console_lines_escape_control_and_bidi_characters(
    say: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    level = console.get_level()
    try:
        console.set_level(console.Level.NORMAL)
        say("subject: \x1b]0;owned\x07 \u202erevert\u202c\nnext line\tcell")
    finally:
        console.set_level(level)
    out = capsys.readouterr()
    shown = out.out + out.err
    for ch in TERMINAL_BAD:
        assert ch not in shown
    assert "next line\tcell" in shown  # the tool's own layout is kept


def test_bisect_and_job_output_go_through_the_console() -> None:
    from repro.bisect.driver import Services

    assert Services().say is console.result


# ---- ISSUE_COMMENT.md (the bundle's comment for the upstream issue) --------------------------------


def test_issue_comment_shows_hostile_record_values_inert(tmp_path: Path) -> None:
    from repro.upstream.bundle import comment as issue_comment
    from repro.upstream.bundle import source_refs

    b = ResultsBuilder(tmp_path, "r")
    b.env("cpu")
    standard_env(b, "cpu")
    data = json.loads(b.write().joinpath("results.json").read_text())
    env = {**data["envs"]["cpu"], "derived_from": HOSTILE, "image_id": HOSTILE, "built_on": HOSTILE}
    env["pins"] = {**env["pins"], "base_image": HOSTILE, "deepspeed": "0.13.1) [x](javascript:alert(1)"}
    for run in data["runs"]:
        run.update(run_name=f"{run['run_name']}{HOSTILE}", reason=HOSTILE)
        run["versions"] = {**run["versions"], "torch": HOSTILE}
    ref = source_refs.SourceRef("comm.return", source_refs.COMM, 12, 14, HOSTILE)
    refs = source_refs.Refs("0.13.1) [x](javascript:alert(1)", (ref,), (HOSTILE,))
    text = issue_comment.render_fitting(
        issue_comment.IssueInput(
            ENV_ID,
            env,
            data["runs"],
            refs,
            HOSTILE,
            f"diff\n```\n{HOSTILE}",
            HOSTILE,
            HOSTILE,
            [f"make {HOSTILE}"],
            f"make repro {HOSTILE}",
        )
    )
    assert_inert(text)


def test_prose_keeps_the_tools_code_spans_and_escapes_the_rest() -> None:
    text = str(templating.prose("returns `reqs[-1]` on torch >= 2.1 <b>x</b> @team"))
    assert text.startswith("returns `reqs[-1]` on torch &gt;= 2.1 &lt;b&gt;")
    assert "@team" not in text
