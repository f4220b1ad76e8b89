"""The generated REPORT.md / report.html read back and checked against the records they came from."""

from __future__ import annotations

import base64
import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from fixtures.report_records import ResultsBuilder, rich_results, standard_env
from markdown_it import MarkdownIt

from repro.cli import main as cli
from repro.core.errors import UsageError
from repro.report.build import ReportPaths, build_report
from repro.report.render import DATA_ELEMENT_ID, MD_DATA_INFO

REPORTER_SCENARIOS = ("mics", "mics-hier")


# -- an independent reading of the records: what the headline must say --------------------------------


def records(folders: list[Path]) -> list[dict[str, Any]]:
    return [run for f in folders for run in json.loads((f / "results.json").read_text())["runs"]]


def expected_reproduces(runs: list[dict[str, Any]], env: str) -> str:
    stock = [
        r
        for r in runs
        if r["env"] == env and r["scenario"] != "zero3" and r["patch"] == "stock" and r["transport"] != "sync"
    ]
    if not stock:
        return "not-tested"
    if any(r["outcome"] == "reproduced" for r in stock):
        return "yes"
    if all(r["outcome"] == "unsupported" for r in stock):
        return "unsupported"
    judged = [r for r in stock if r["scenario"] in REPORTER_SCENARIOS and r["outcome"] != "unsupported"]
    return "no" if judged and all(r["outcome"] == "clean" for r in judged) else "inconclusive"


def expected_fixed(runs: list[dict[str, Any]], env: str) -> str | None:
    """Only decided here for envs where the bug reproduced and every fixed twin exists."""
    mine = [r for r in runs if r["env"] == env and r["scenario"] != "zero3" and r["transport"] != "sync"]
    bug = [r for r in mine if r["patch"] == "stock" and r["outcome"] == "reproduced"]
    if not bug:
        return None
    ok = True
    for stock in bug:
        twin = [
            r
            for r in mine
            if r["patch"] == "fixed"
            and r["scenario"] == stock["scenario"]
            and r["dtype"] == stock["dtype"]
            and r["world_size"] == stock["world_size"]
        ]
        if not twin:
            return None
        fixed = twin[0]
        ok &= (
            fixed["outcome"] == "clean"
            and fixed["illegal_work_messages"] == 0
            and fixed["first_divergent_step"] is None
        )
    return "yes" if ok else "no"


# -- readers of the two outputs ----------------------------------------------------------------------


class Html(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self.styles: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("script", "style"):
            self._in = tag
            (self.scripts if tag == "script" else self.styles).append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "script":
            self.scripts[-1] += data
        elif self._in == "style":
            self.styles[-1] += data

    def find(self, tag: str, **attrs: str) -> list[dict[str, str | None]]:
        return [
            a
            for t, a in self.tags
            if t == tag and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]


def read_html(path: Path) -> Html:
    parser = Html()
    parser.feed(path.read_text())
    return parser


HEADLINE = re.compile(
    r"^- \*\*(?P<env>[^*]+)\*\* \((?P<versions>(?:[^()]|\([^()]*\))*)\): reproduces: "
    r"\*\*(?P<reproduces>[a-z/-]+)\*\*(?: \((?P<signatures>[a-z, -]+)\))?; fixed by the patch: "
    r"\*\*(?P<fixed>[a-z/-]+)\*\*; verdict: (?P<words>.+)$"
)


def md_headline(text: str) -> dict[str, dict[str, str]]:
    section = text.split("## Answer", 1)[1].split("###", 1)[0]
    found = {}
    for line in section.strip().splitlines():
        match = HEADLINE.match(line)
        assert match, f"headline line not in the documented format: {line!r}"
        found[match["env"]] = match.groupdict()
    return found


def md_data(text: str) -> dict[str, Any]:
    tokens = MarkdownIt("commonmark").parse(text)
    fences = [t for t in tokens if t.type == "fence" and t.info.strip() == MD_DATA_INFO]
    assert len(fences) == 1
    data: dict[str, Any] = json.loads(fences[0].content)
    return data


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], ReportPaths]:
    """Built once: the tests below only read it."""
    root = tmp_path_factory.mktemp("rich")
    folders = rich_results(root)
    return folders, build_report(folders, root / "out", gpu_env_hint=("rocm56",))


def test_headline_in_both_outputs_matches_the_records(built: tuple[list[Path], ReportPaths]) -> None:
    folders, paths = built
    runs = records(folders)
    envs = list(dict.fromkeys(r["env"] for r in runs))
    md = md_headline(paths.markdown.read_text())
    html = {a["data-env"]: a for a in read_html(paths.html).find("li", **{"class": "headline-env"})}
    summary = {h["env"]: h for h in md_data(paths.markdown.read_text())["headline"]}
    assert list(md) == envs and list(html) == envs and list(summary) == envs
    for env in envs:
        want = expected_reproduces(runs, env)
        assert md[env]["reproduces"] == html[env]["data-reproduces"] == summary[env]["reproduces"] == want, (
            env
        )
        fixed = expected_fixed(runs, env)
        if fixed is not None:
            assert md[env]["fixed"] == html[env]["data-fixed"] == summary[env]["fixed"] == fixed, env
        sigs = sorted(
            {
                r["signature"]
                for r in runs
                if r["env"] == env
                and r["patch"] == "stock"
                and r["scenario"] != "zero3"
                and r["transport"] != "sync"
                and r["outcome"] == "reproduced"
            }
        )
        assert (md[env]["signatures"] or "") == ", ".join(sigs)
        assert html[env]["data-signatures"] == ",".join(sigs)
    # the rich set has both: envs that reproduce and one that does not decide
    assert {h["reproduces"] for h in summary.values()} >= {"yes", "inconclusive"}


def test_answers_embedded_in_html_equal_report_json(built: tuple[list[Path], ReportPaths]) -> None:
    _, paths = built
    html = read_html(paths.html)
    scripts = [a for t, a in html.tags if t == "script"]
    assert scripts == [{"type": "application/json", "id": DATA_ELEMENT_ID}]
    embedded = json.loads(html.scripts[0])
    assert embedded == json.loads(paths.data.read_text())
    cause = html.find("dd", data_answer="cause")
    assert [c["data-verdict"] for c in cause] == [embedded["cause"]["verdict"]] == ["mics-logic"]
    assert html.find("dd", data_answer="upgrade")[0]["data-verdict"] == embedded["upgrade"]["verdict"]
    kinds = sorted(a["data-kind"] or "" for a in html.find("li", **{"class": "finding"}))
    assert kinds == sorted(f["kind"] for f in embedded["findings"])
    assert "hang" in kinds and "unsupported" in kinds and "crash" in kinds


def test_html_is_self_contained(built: tuple[list[Path], ReportPaths]) -> None:
    _, paths = built
    html = read_html(paths.html)
    csp = html.find("meta", http_equiv="Content-Security-Policy")
    assert len(csp) == 1 and "default-src 'none'" in (csp[0]["content"] or "")
    url_attrs = ("src", "href", "srcset", "action", "poster", "data", "background", "formaction")
    for tag, attrs in html.tags:
        assert tag not in ("link", "iframe", "object", "embed", "base", "frame")
        for name in url_attrs:
            value = attrs.get(name)
            if value is not None:
                assert tag == "img" and name == "src" and value.startswith("data:image/png;base64,"), (
                    tag,
                    name,
                )
    assert all("url(" not in s and "@import" not in s for s in html.styles)
    assert len(html.find("img")) == len(json.loads(paths.data.read_text())["plots"]) > 0


def test_plots_are_real_images_with_the_nan_steps_of_the_records(
    built: tuple[list[Path], ReportPaths],
) -> None:
    from PIL import Image

    folders, paths = built
    by_ident = {f"{r['env']}/{r['run_name']}": r for r in records(folders)}
    data = json.loads(paths.data.read_text())
    marked = 0
    for plot in data["plots"]:
        for series in plot["loss"]:
            losses = by_ident[series["run"]]["losses"]
            assert series["null_steps"] == [i for i, v in enumerate(losses) if v is None]
            marked += len(series["null_steps"])
        png = (paths.markdown.parent / "plots" / f"{plot['slug']}.png").read_bytes()
        image = Image.open(io.BytesIO(png)).convert("L")
        dark = sum(1 for px in image.tobytes() if px < 200)
        assert image.width > 300 and dark > 0.01 * image.width * image.height
    assert marked > 0
    fp16 = [p for p in data["plots"] if "fp16" in p["slug"]]
    assert fp16 and all(p["loss_scale"] for p in fp16)
    for img in read_html(paths.html).find("img"):
        raw = base64.b64decode((img["src"] or "").split(",", 1)[1])
        assert Image.open(io.BytesIO(raw)).format == "PNG"


def md_table_rows(text: str) -> list[list[str]]:
    """Every table row of the Markdown, as the inline text of its cells (a GFM-style table parser)."""
    rows: list[list[str]] = []
    in_cell = False
    for tok in MarkdownIt("commonmark").enable("table").parse(text):
        if tok.type == "tr_open":
            rows.append([])
        elif tok.type in ("th_open", "td_open"):
            in_cell = True
        elif tok.type in ("th_close", "td_close"):
            in_cell = False
        elif tok.type == "inline" and in_cell:
            rows[-1].append(tok.content)
    return rows


def test_markdown_table_survives_hostile_text(built: tuple[list[Path], ReportPaths]) -> None:
    folders, paths = built
    text = paths.markdown.read_text()
    rows = md_table_rows(text)
    header = next(r for r in rows if r[:2] == ["env", "scenario"])
    body = [r for r in rows if len(r) == len(header) and r[0] in {x["env"] for x in records(folders)}]
    assert len(body) == len(json.loads(paths.data.read_text())["table"])
    hostile = next(r for r in body if r[0] == "cpu+ds0.19.8" and r[1] == "mics-hier")
    # the whole message stays in the last cell: a raw pipe would have cut it at "bad"
    cell = hostile[-1]
    assert cell.startswith("ValueError: bad | pipe &lt;script&gt;") and cell.endswith("(rank 0) → –")
    html_text = paths.html.read_text()
    assert "<script>alert(1)</script>" not in html_text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html_text


def test_details_give_versions_artifacts_and_command(built: tuple[list[Path], ReportPaths]) -> None:
    folders, paths = built
    html = read_html(paths.html)
    blocks = [a["data-env"] for a in html.find("details") if a.get("data-env")]
    envs = list(dict.fromkeys(r["env"] for r in records(folders)))
    assert blocks == envs
    text = paths.html.read_text()
    assert "make repro ENV=rocm56" in text and "DeepSpeed general environment info (rocm56)" in text
    md = paths.markdown.read_text()
    assert md.count("<details><summary>") >= 3 * len(envs)  # env + ds_report + collect_env
    assert md.count("<details") == md.count("</details>")  # balanced, so GitHub folds them right


def test_survey_and_bisect_timeline(tmp_path: Path) -> None:
    folders = rich_results(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    survey = {
        "change_points": [
            {
                "before": "2.0.1",
                "after": "2.1.0",
                "outcome_before": "clean",
                "outcome_after": "reproduced",
                "signature_before": "none",
                "signature_after": "illegal-work-divergence",
            }
        ],
        "probes": [
            {"version": "2.0.1", "outcome": "clean", "signature": "none", "verdict": "good"},
            {
                "version": "2.1.0",
                "outcome": "reproduced",
                "signature": "illegal-work-divergence",
                "verdict": "bad",
            },
        ],
    }
    (out / "survey.json").write_text(json.dumps(survey))
    paths = build_report(folders, out, gpu_env_hint=())
    data = json.loads(paths.data.read_text())
    assert [t["source"] for t in data["timelines"]] == ["survey.json"]
    assert data["timelines"][0]["change_points"][0]["after"] == "2.1.0"
    assert len(data["timelines"][0]["probes"]) == 2
    assert "## Survey / bisection" in paths.markdown.read_text()
    assert read_html(paths.html).find("table", **{"class": "change-points"})
    (out / "bisect.json").write_text(json.dumps({"probes": "not a list"}))
    with pytest.raises(UsageError, match="probes"):
        build_report(folders, out, gpu_env_hint=())


def test_rebuilding_into_the_same_folder_drops_stale_plots(tmp_path: Path) -> None:
    b = ResultsBuilder(tmp_path, "20250101T000000Z-cpu")
    b.env("cpu")
    standard_env(b, "cpu")
    b.clean("cpu", "zero3", dtype="bf16")
    first = build_report([b.write()], tmp_path / "out")
    assert len(first.plots) == 2
    only = ResultsBuilder(tmp_path, "20250102T000000Z-cpu")
    only.env("cpu")
    standard_env(only, "cpu")
    second = build_report([only.write()], tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out" / "plots").iterdir()) == sorted(
        p.name for p in second.plots
    )


def test_module_entry_point(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folders = rich_results(tmp_path)
    assert cli.main(["report", "--results", ",".join(str(f) for f in folders)]) == 0
    assert (folders[0] / "report.html").is_file() and (folders[0] / "REPORT.md").is_file()
    assert "report.html" in capsys.readouterr().out
    assert cli.main(["report", "--results", str(tmp_path / "missing")]) == UsageError.exit_code
    assert "no results.json" in capsys.readouterr().err
