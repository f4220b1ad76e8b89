"""Secrets of the command line are scrubbed by value before the line is quoted (issue 45, round 4).

`make run CMD="... --password 'hunter2 horse'"` records the reproduce line `make run ...
CMD='... --password '"'"'hunter2 horse'"'"''`: a pattern over that text never saw the value, and it
reached ISSUE.md, REPORT.md, report.html and a bundle (whose scan then stopped with exit 19, "report
this as a bug", leaving README.md, ISSUE_COMMENT.md and report/ on disk). `curl -u alice:pw` was not
scrubbed at all. Each form below is run through `make run`'s own job runner (a fake Docker engine),
then every text handed out is rendered and must not hold the value, in any quoting.

Default tier: the fake docker-py client and job engine of the bundle tests.
"""

from __future__ import annotations

import html
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from repro.core.errors import CommandSecretError, LeakError
from repro.core.results import InvocationDir, invocation_meta
from repro.core.scrub import Scrubber
from repro.matrix.schema import load_matrix
from repro.report import build_report
from repro.run.job import JobRequest, execute_job, reproduce_line
from repro.upstream.bundle import make as bundle
from repro.upstream.bundle.files import IMAGE_FILE
from repro.upstream.issue import make as issue
from tests.fixtures.fake_bundle_docker import SOURCE_ID, SOURCE_TAG, FakeClient
from tests.fixtures.job_docker import JobDocker, project

# (CMD=, the secret it holds); each value is what must appear nowhere. Forms that main already kept
# out of every text (`--password="a b"`, `--api-key X`, `--api_key=X`, `NAME=value`, a URL's
# `user:token@`) are tested in tests/upstream/test_secrets_whole_values.py and not repeated here.
FORMS = {
    "-u user:pass": ("python train.py -u alice:Wh1sper-42 --steps 2", "Wh1sper-42"),
    "--user=user:pass": ("python train.py --user=alice:Wh1sper-43 --steps 2", "Wh1sper-43"),
    "curl -u alice:pw": ("curl -u alice:pw -O https://hub.example.com/data.tar", "alice:pw"),
    "--password 'a b'": ("python train.py --password 'hunter2 horse' --steps 2", "hunter2 horse"),
    "PASSWORD='a b' python": ("PASSWORD='correct pony' python train.py --steps 2", "correct pony"),
    "--token 'two words'": ("python train.py --token 'two w0rds quoted' --steps 2", "two w0rds quoted"),
    "a quote in the value": ('python train.py --password "it\'s m1ne" --steps 2', "it's m1ne"),
}


def job_results(root: Path, work: Path, command: str, client: FakeClient) -> Path:
    """A results folder of `make run ENV=cpu ENGINE=docker CMD=<command>`, written by the job
    runner itself, with the invocation's argv and reproduce line as `make run` records them."""
    env = load_matrix().get("cpu")
    request = JobRequest(env_id="cpu", command=command, workdir=work)
    out = root / "20250101T000000Z-run-cpu"
    out.mkdir(parents=True)
    argv = ["run", "--env", "cpu", "--workdir", str(work), "--cmd", command]
    invocation = InvocationDir(out, invocation_meta(argv, reproduce_line(request)))
    execute_job(request, env, JobDocker(client), invocation, say=lambda _line: None)
    return out


def forms_of(secret: str) -> list[str]:
    """The value, what quoting or escaping makes of it in a rendered text, and its second half
    (what a replacement that stopped at an inner quote or space leaves)."""
    requoted = secret.replace("'", "'\"'\"'")
    whole = {secret, requoted, html.escape(secret), json.dumps(secret)[1:-1], html.escape(requoted)}
    return sorted(whole | {secret[len(secret) // 2 :]})


def holding(texts: dict[str, str], secret: str) -> dict[str, list[str]]:
    """The texts that still hold `secret` in one of its forms, and which forms."""
    found = {name: [f for f in forms_of(secret) if f in text] for name, text in texts.items()}
    return {name: forms for name, forms in found.items() if forms}


@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_is_gone_from_issue_md_report_md_and_report_html(
    tmp_path: Path, host: dict[str, str], form: str
) -> None:
    command, secret = FORMS[form]
    client = FakeClient()
    client.add_source_image(SOURCE_ID, SOURCE_TAG)
    home = Path(host["home"])
    results = job_results(home / "results", project(home, "x"), command, client)
    recorded = json.loads((results / "results.json").read_text())
    assert secret in shlex.split(recorded["invocation"]["command"])[-1]  # the record holds it, as made
    issue_md = issue.render(results, Scrubber.from_host(paths={"<repo>": str(bundle.REPO_ROOT)}))
    paths = build_report([results], tmp_path / "report")
    texts = {
        "ISSUE.md": issue_md,
        "REPORT.md": paths.markdown.read_text(),
        "report.html": paths.html.read_text(),
        "report.json": paths.data.read_text(),
    }
    assert holding(texts, secret) == {}
    # The evidence around it stays: the command is still shown, its secret replaced.
    assert "train.py" in texts["REPORT.md"] or "curl" in texts["REPORT.md"]
    assert "<secret>" in issue_md and "make run" in issue_md


SURVEY_CMD = "python train.py --password 'hunter2 horse' -u alice:Wh1sper-42"


def test_a_survey_of_a_command_with_a_secret_keeps_it_out_of_issue_md(tmp_path: Path) -> None:
    """`make survey CMD=...`: the survey's line and each probe's line quote CMD= once more."""
    line = f"make survey AXIS=deepspeed FROM=0.19.0 TO=0.19.6 ENV=cpu-latest CMD={shlex.quote(SURVEY_CMD)}"
    probe: dict[str, Any] = {
        "outcome": "clean",
        "signature": "none",
        "verdict": "",
        "reason": "clean",
        "seconds": 1.0,
        "env": "cpu-latest",
        "record": None,
        "versions": {"python": "3.11.7", "torch": "2.13.0", "deepspeed": "0.19.2"},
    }
    hung = {**probe, "outcome": "hung", "signature": "hang", "reason": "hung"}
    change: dict[str, Any] = {
        "before": "0.19.2",
        "after": "0.19.3",
        "outcome_before": "clean",
        "outcome_after": "hung",
    }
    change |= {"signature_before": "none", "signature_after": "hang", "unknown_between": []}
    data: dict[str, Any] = {
        "kind": "survey",
        "axis": "deepspeed",
        "env": "cpu-latest",
        "scenario": "custom",
        "patch": "stock",
    }
    data |= {"command": line, "change_points": [change]}
    data["probes"] = [{**probe, "version": "0.19.2"}, {**hung, "version": "0.19.3"}]
    (tmp_path / "survey.json").write_text(json.dumps(data))
    text = issue.render(tmp_path, Scrubber.from_host({}, home="/nonexistent", hostnames=[], user=""))
    assert holding({"ISSUE.md": text}, "hunter2 horse") == {}
    assert holding({"ISSUE.md": text}, "Wh1sper-42") == {}
    assert "make probe" in text and "<secret>" in text  # the first bad release's line, from the survey's


REQUOTED = "make run ENV=cpu CMD='python t.py --password '\"'\"'hunter2 horse'\"'\"' --steps 2'"


# The same line as `'\''`-style quoting writes it.
REQUOTED_BACKSLASH = "make run ENV=cpu CMD='python t.py --password '\\''hunter2 horse'\\'' --steps 2'"


@pytest.mark.parametrize(
    "text",
    [REQUOTED, json.dumps({"log": REQUOTED}), REQUOTED_BACKSLASH, json.dumps({"log": REQUOTED_BACKSLASH})],
)
def test_a_value_quoted_inside_a_quoted_word_is_replaced_in_any_text(text: str) -> None:
    """A make line printed into a log (no record says it is a command line): the text pattern
    itself reads `'"'"'a b'"'"'` (and `'\\''`, and both as JSON escapes them) as quotes."""
    scrubber = Scrubber.from_host({}, home="/nonexistent", hostnames=[], user="")
    scrubbed = scrubber.text(text)
    assert "hunter2" not in scrubbed and "horse" not in scrubbed, scrubbed
    assert "--steps 2" in scrubbed and scrubber.leaks(scrubbed) == []


def new_bundle(home: Path, command: str, client: FakeClient, work: Path) -> bundle.BundleResult:
    client.add_source_image(SOURCE_ID, SOURCE_TAG)
    results = job_results(home / "results", work, command, client)
    request = bundle.BundleRequest(env_id="cpu", out=home / "bundles" / "cpu", results=results)
    scrubber = Scrubber.from_host(paths={"<repo>": str(bundle.REPO_ROOT)})
    return bundle.make_bundle(request, client, scrubber, say=lambda _line: None)


@pytest.mark.parametrize("form", ["--password 'a b'", "curl -u alice:pw", "a quote in the value"])
def test_a_bundle_of_a_job_with_a_secret_in_its_command_holds_it_nowhere(
    tmp_path: Path, host: dict[str, str], form: str
) -> None:
    command, secret = FORMS[form]
    home = Path(host["home"])
    result = new_bundle(home, command, FakeClient(), project(home, "x"))
    texts = {
        p.relative_to(result.folder).as_posix(): p.read_bytes().decode("latin-1")
        for p in sorted(result.folder.rglob("*"))
        if p.is_file() and p.name != IMAGE_FILE
    }
    for name in ("README.md", "ISSUE_COMMENT.md", "manifest.json", "report/REPORT.md", "report/report.html"):
        assert name in texts
    assert holding(texts, secret) == {}
    assert result.archive is not None
    assert holding({"archive": result.archive.read_bytes().decode("latin-1")}, secret) == {}


def test_a_secret_the_bundle_cannot_replace_is_refused_and_nothing_is_left(
    tmp_path: Path, host: dict[str, str]
) -> None:
    """A file of the job's folder named after the password: its name cannot be scrubbed (the job
    reads it by that name). The bundle is refused with its own exit code, the message says where
    and what to do without the value, and no bundle folder or archive stays behind."""
    home = Path(host["home"])
    work = project(home, "x")
    (work / "Tr0ub4dor-and-3.key").write_text("nothing else\n")
    with pytest.raises(LeakError) as err:
        new_bundle(home, "python train.py --password Tr0ub4dor-and-3", FakeClient(), work)
    assert isinstance(err.value, CommandSecretError) and err.value.exit_code not in (19, 2, 16)
    message = err.value.render()
    assert "workdir/<secret>.key" in message and "command line" in message
    assert "Tr0ub4dor-and-3" not in message and "report this as a bug" not in message
    assert not (home / "bundles" / "cpu").exists() and not (home / "bundles" / "cpu.tar").exists()
