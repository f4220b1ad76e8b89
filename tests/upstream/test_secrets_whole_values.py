"""Secrets never reach a text the lab hands out, whole values included (issue 32, item 3).

From a real Docker run these survived in a bundle whose leak check passed: `Authorization: Bearer
<JWT>` (only "Bearer" replaced), `"password": "correct horse battery staple"` (only the first
word), `--password X` / `--api-key X`, OpenAI, Google and GitLab keys, a URL password with "@";
REPORT.md and report.html showed the command's secrets. One corpus of every shape goes into logs,
records, commands and a working directory; each test asserts the secret itself is gone (and its
second half, which a partial replacement leaves), not only that a placeholder appears, and that the
evidence next to it stays.

Default tier: the fake docker-py client of the bundle tests, results made by the report builder.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from repro.core.errors import BundleError
from repro.core.scrub import Scrubber
from repro.upstream import patchgen
from repro.upstream.bundle import make as bundle
from repro.upstream.bundle.files import copy_workdir, scan
from repro.upstream.issue import make as issue
from tests.fixtures.bisect_entries import bisect_entry, probe_entry
from tests.fixtures.fake_bundle_docker import FakeClient
from tests.fixtures.report_records import ResultsBuilder, standard_env

JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
    "eyJzdWIiOiJtaWNzLXJlcHJvLXRlc3QiLCJpYXQiOjE3MDAwMDAwMDB9."
    "Qm9ndXNTaWduYXR1cmVGb3JUZXN0c09ubHk0Mg"
)
SECRETS = {
    "jwt": JWT,
    "json_password": "correct horse battery staple",
    "option_password": "Tr0ub4dor-and-3",
    "option_api_key": "k3y-space-separated",
    "option_api_key_eq": "eq-valued-k3y-77",
    "option_token_quoted": "two w0rds quoted",
    "openai": "sk-proj-" + "Ab12Cd34Ef56Gh78Ij90Kl12Mn34Op56Qr78St90Uv12",
    "openai_legacy": "sk-" + "Qw12Er34Ty56Ui78Op90As12Df34Gh56Jk78Lz90Xc12Vb34",
    "anthropic": "sk-ant-api03-" + "Zz98Yy87Xx76Ww65Vv54Uu43Tt32Ss21",
    "google": "AIza" + "SyD4nonExistentKey_for-tests0123456",
    "gitlab": "glpat-" + "x9Y8w7V6u5T4s3R2q1P0",
    "aws": "AKIA" + "Q7RZ2XNB4KFD8W3M",
    "github": "ghp_" + "1a2B3c4D5e6F7g8H9i0JkLmNoPqRsTuVwXyZ",
    "github_oauth": "gho_" + "9z8Y7x6W5v4U3t2S1r0QpOnMlKjIhGfEdCbA",
    "github_pat": "github_pat_" + "11ABCDE0123456789_abcdefghijklmnopqrstuv",
    "slack": "xoxb-" + "123456789012-abcdefABCDEF",
    "hf": "hf_" + "kTqXbWvNmRzLpYcJdHsGfAeUoIi0123456",
    "key_body": "MIIEowIBAAKCAQEAplanted0key0body0line",
    "basic": "YnVpbGRlcjpodW50ZXIyLWJhc2lj",
    "url_password": "p@ss@w0rd-9",
    "env_token": "env-style-t0ken-value",
    "yaml_password": "a yaml pass phrase",
}
COMMIT = "02663d6e1b2c3d4e5f60718293a4b5c6d7e8f901"
# Evidence that must survive next to the secrets: versions, a commit, paths, ordinary options.
ORDINARY = (
    "torch 2.1.0+cu121",
    "deepspeed 0.13.1",
    COMMIT,
    "/opt/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/mics.py",
    "--steps 20",
    "--world-size 4",
)
S = SECRETS
# One entry per line, but a private key's block is one entry: it spans lines.
LINES = (
    f"+ curl -H 'Authorization: Bearer {S['jwt']}' https://api.example.com/v1/runs",
    f'+ curl -H "Authorization: Basic {S["basic"]}" https://pypi.example.com/simple',
    f'config: {{"optimizer": {{"type": "Adam"}}, "password": "{S["json_password"]}", "steps": 20}}',
    f"+ python train.py --password {S['option_password']} --api-key {S['option_api_key']} "
    f"--api_key={S['option_api_key_eq']} --token '{S['option_token_quoted']}' --steps 20 --world-size 4",
    f"keys seen: {S['openai']} {S['openai_legacy']} {S['anthropic']}",
    f"google {S['google']} gitlab {S['gitlab']} aws {S['aws']}",
    f"github {S['github']} {S['github_oauth']} {S['github_pat']} slack {S['slack']} hf {S['hf']}",
    f"git clone https://builder:{S['url_password']}@git.example.com/team/repo.git",
    f"MY_SERVICE_TOKEN={S['env_token']} ./launch.sh",
    f"password: {S['yaml_password']}",
    f"-----BEGIN OPENSSH PRIVATE KEY-----\n{S['key_body']}\n-----END OPENSSH PRIVATE KEY-----",
    f"torch 2.1.0+cu121 deepspeed 0.13.1 at {COMMIT}",
    "File /opt/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/mics.py line 40",
    "suite --steps 20 --world-size 4",
)
LOG = "\n".join(LINES) + "\n"
COMMAND = (
    f'make run ENV=cpu CMD="python train.py --password {S["option_password"]} '
    f'--api-key {S["option_api_key"]} --steps 20" HF_TOKEN={S["hf"]} '
    f"INDEX=https://builder:{S['url_password']}@pypi.example.com/simple AUTH='Bearer {S['jwt']}'"
)


def survivors(text: str) -> list[str]:
    """The secrets still in `text`, whole or their second half (what a partial replacement leaves)."""
    return sorted(
        name for name, value in SECRETS.items() if value in text or value[len(value) // 2 :] in text
    )


def clean_host() -> Scrubber:
    return Scrubber.from_host({}, home="/nonexistent", hostnames=[], user="")


# ---- the scrubber itself -----------------------------------------------------------------------


@pytest.mark.parametrize("line", LINES)
def test_each_shape_is_replaced_whole_and_the_evidence_stays(line: str) -> None:
    scrubbed = clean_host().text(line)
    assert survivors(scrubbed) == [], scrubbed
    assert clean_host().leaks(scrubbed) == []
    assert clean_host().text(scrubbed) == scrubbed  # a second pass changes nothing
    for kept in ORDINARY:
        if kept in line:
            assert kept in scrubbed


def test_a_json_dump_of_the_corpus_keeps_no_secret() -> None:
    """JSON escapes the quotes of a quoted value (\\"a b\\"): the value is still replaced whole."""
    dumped = json.dumps({"log": LOG, "command": COMMAND, "argv": COMMAND.split()})
    scrubbed = clean_host().text(dumped)
    assert survivors(scrubbed) == []
    log = json.loads(scrubbed)["log"]  # still valid JSON
    assert all(kept in log for kept in ORDINARY)
    # Every line is kept but the private key's block, replaced whole with its two line breaks.
    assert log.count("\n") == LOG.count("\n") - 2 and "<private-key>" in log


def test_an_argv_list_loses_the_value_after_a_secret_option() -> None:
    argv = ["train.py", "--password", "plain words", "--api-key", "abc", "--steps", "20", "--world-size", "4"]
    assert clean_host().data(argv) == [
        "train.py",
        "--password",
        "<secret>",
        "--api-key",
        "<secret>",
        "--steps",
        "20",
        "--world-size",
        "4",
    ]


@pytest.mark.parametrize(
    "name,value",
    [("TOKENIZERS_PARALLELISM", "false"), ("XDG_SESSION_CLASS", "user"), ("MAX_NEW_TOKENS", "2048")],
)
def test_variables_that_only_sound_secret_do_not_garble_the_evidence(name: str, value: str) -> None:
    scrubber = Scrubber.from_host({name: value}, home="/nonexistent", hostnames=[], user="")
    text = f"username={value}-x flag {value} steps 2048 false"
    assert scrubber.text(text) == text


# ---- every text handed out ----------------------------------------------------------------------


@pytest.fixture
def bare_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A host whose shell holds no secret (they reached the logs from elsewhere); its home."""
    import matplotlib

    monkeypatch.setenv("MPLCONFIGDIR", matplotlib.get_cachedir())
    for name in list(os.environ):
        if any(w in name.upper() for w in ("TOKEN", "SECRET", "KEY", "PASS", "AUTH", "AWS", "HF_")):
            monkeypatch.delenv(name)
    home = tmp_path / "home" / "carol"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(socket, "gethostname", lambda: "lab-node-17")
    monkeypatch.setattr(socket, "getfqdn", lambda *a: "lab-node-17")
    monkeypatch.setattr(patchgen, "default_wheelhouse", lambda: tmp_path / "no-wheelhouse")
    return home


def planted_results(root: Path, *, docker: bool) -> Path:
    b = ResultsBuilder(root, "20250101T000000Z-cpu", command=COMMAND)
    if docker:
        b.env("cpu", engine="docker", image_id="sha256:" + "5" * 64, venv=None)
    else:
        b.env("cpu")
    standard_env(b, "cpu")
    folder = b.write()
    for path in [*folder.glob("cpu/runs/*/*.log"), *folder.glob("cpu/artifacts/*.txt")]:
        path.write_text(path.read_text() + LOG)
    data = json.loads((folder / "results.json").read_text())
    data["runs"][0]["reason"] += " " + LOG
    data["runs"][1]["exception"] = {"type": "RuntimeError", "message": LOG, "rank": 0, "traceback": LOG}
    (folder / "results.json").write_text(json.dumps(data))
    return folder


def text_files(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes().decode("latin-1")
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != bundle.IMAGE_FILE
    }


def test_a_bundle_holds_no_secret_of_the_corpus(tmp_path: Path, bare_host: Path) -> None:
    client = FakeClient()
    client.add_source_image("sha256:" + "5" * 64, "mics-repro:cpu-9666647e987b")
    results = planted_results(bare_host / "results", docker=True)
    request = bundle.BundleRequest(env_id="cpu", out=bare_host / "bundles" / "cpu", results=results)
    scrubber = Scrubber.from_host(paths={"<repo>": str(bundle.REPO_ROOT)})
    result = bundle.make_bundle(request, client, scrubber, say=lambda _line: None)
    files = text_files(result.folder)
    for name in ("manifest.json", "README.md", "ISSUE_COMMENT.md", "report/REPORT.md", "report/report.html"):
        assert name in files
    found = {name: survivors(text) for name, text in files.items() if survivors(text)}
    assert found == {}
    assert result.archive is not None and survivors(result.archive.read_bytes().decode("latin-1")) == []
    comment = files["ISSUE_COMMENT.md"]  # collect_env is quoted there: scrubbed, its evidence kept
    assert "<jwt>" in comment and "torch 2.1.0+cu121" in comment and COMMIT in comment


def test_report_md_and_html_built_on_this_host_hold_no_secret(tmp_path: Path, bare_host: Path) -> None:
    from repro.report import build_report

    folder = planted_results(tmp_path / "results", docker=False)
    paths = build_report([folder], tmp_path / "report")
    for path in (paths.markdown, paths.html, paths.data):
        text = Path(path).read_text()
        assert survivors(text) == [], path.name
    markdown = Path(paths.markdown).read_text()
    assert "--steps 20" in markdown  # the command is still shown, its secrets replaced
    assert str(folder) in Path(paths.html).read_text()  # a local report keeps its own paths


def bisect_folder(tmp_path: Path) -> Path:
    out = tmp_path / "bisect-1"
    run = out / "cpu" / "runs" / "mics-replica-fixed"
    run.mkdir(parents=True)
    stack = 'Current thread 0x02 (most recent call first):\n  File "deepspeed/comm/torch.py", line 206\n'
    (run / "record.json").write_text(json.dumps({"stacks": {"0": stack + LOG, "1": stack}}))

    def probe(version: str, outcome: str, verdict: str, record: str | None = None) -> dict[str, Any]:
        versions = {"python": "3.11.7", "torch": "2.13.0", "deepspeed": "0.19.3"}
        return probe_entry(
            version, outcome, verdict, record, reason=f"{outcome}: {LOG}", env="cpu", versions=versions
        )

    bad = probe("0.19.3", "hung", "bad", "cpu/runs/mics-replica-fixed/record.json")
    good = probe("0.19.2", "clean", "good")
    data = bisect_entry(
        "cpu", "0.19.3", "0.19.2", (bad, good), probes=[good, bad], repro_command=COMMAND, command=COMMAND
    )
    (out / "bisect.json").write_text(json.dumps(data))
    return out


def test_issue_md_holds_no_secret(tmp_path: Path) -> None:
    folder = bisect_folder(tmp_path)
    text = issue.write(folder, clean_host()).read_text()
    assert survivors(text) == []
    assert "0.19.3" in text and "--steps 20" in text  # the evidence is still there


def test_a_custom_commands_working_directory_travels_without_its_secrets(tmp_path: Path) -> None:
    work = tmp_path / "proj"
    work.mkdir()
    (work / "run.sh").write_text(
        f"#!/bin/sh\npython train.py --password {S['option_password']} --api-key {S['option_api_key']} "
        "--steps 20 --world-size 4\n"
    )
    (work / "secrets.yaml").write_text(f"hub:\n  password: {S['yaml_password']}\n  token: {S['hf']}\n")
    (work / "ds_config.json").write_text(json.dumps({"auth": {"password": S["json_password"]}, "steps": 20}))
    copy_workdir(work, tmp_path / "bundle" / "workdir", clean_host())
    files = text_files(tmp_path / "bundle")
    assert {name: survivors(text) for name, text in files.items() if survivors(text)} == {}
    assert "--steps 20 --world-size 4" in files["workdir/run.sh"]
    scan(tmp_path / "bundle", clean_host())  # and the final check passes on what is left


# ---- the leak check fails closed ------------------------------------------------------------------


@pytest.mark.parametrize("secret", ["openai", "google", "gitlab", "anthropic", "jwt"])
def test_the_bundle_scan_refuses_a_file_that_escaped_the_scrubber(tmp_path: Path, secret: str) -> None:
    (tmp_path / "late.txt").write_text(f"written after scrubbing: {SECRETS[secret]}\n")
    with pytest.raises(BundleError) as err:  # LeakError, a kind of BundleError
        scan(tmp_path, clean_host())
    assert "late.txt" in err.value.render() and SECRETS[secret] not in err.value.render()
    assert err.value.exit_code == 19


def test_html_that_hides_a_value_behind_entities_is_refused_not_written(
    tmp_path: Path, bare_host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value the scrubber cannot see whole in the escaped HTML (&quot;a b&quot;) is found as a
    reader would see it; the report is refused with exit 19 and no report.html is written."""
    import repro.report.build as build
    from repro.cli.main import main

    folder = planted_results(tmp_path / "results", docker=False)
    real = build.render_html

    def leaky(*args: Any) -> str:
        return real(*args) + "<pre>--password &quot;a w0rd pass phrase&quot;</pre>"

    monkeypatch.setattr(build, "render_html", leaky)
    out = tmp_path / "report"
    assert main(["report", "--results", str(folder), "--out", str(out)]) == 19
    assert not (out / "report.html").exists() and not (out / "REPORT.md").exists()


def test_the_working_directorys_code_still_runs_only_its_literal_secrets_go(tmp_path: Path) -> None:
    """In source code an unquoted value is an expression (`key: str`, `os.environ[...]`): the bundle's
    workdir must still run in verify-bundle; a secret written as a literal is replaced."""
    work = tmp_path / "proj"
    work.mkdir()
    code = (
        "import os\n"
        "def fetch(key: str, session: str | None = None, retries: int = 3) -> dict[str, str]:\n"
        "    api_key = os.environ['HF_API_KEY']\n"
        "    if key == api_key:\n"
        "        return {key: session for key in ('a', 'b')}\n"
        "    return {}\n"
    )
    (work / "train.py").write_text(code + f"PASSWORD = '{S['json_password']}'\nHUB = '{S['hf']}'\n")
    copy_workdir(work, tmp_path / "bundle" / "workdir", clean_host())
    copied = (tmp_path / "bundle" / "workdir" / "train.py").read_text()
    assert copied.startswith(code)
    assert survivors(copied) == [] and "PASSWORD = '<secret>'" in copied
    scan(tmp_path / "bundle", clean_host())


def test_the_leak_exit_code_is_no_other_errors() -> None:
    import repro.upstream.patchgen
    import repro.upstream.pr.regression  # noqa: F401 - both define error classes of their own
    from repro.core.errors import LeakError, ReproError

    def kinds(cls: type[ReproError]) -> list[type[ReproError]]:
        return [k for sub in cls.__subclasses__() for k in (sub, *kinds(sub))]

    same = [k.__name__ for k in kinds(ReproError) if k.exit_code == 19 and not issubclass(k, LeakError)]
    assert LeakError.exit_code == 19 and same == []


def test_a_file_named_after_a_token_is_refused(tmp_path: Path) -> None:
    (tmp_path / "workdir").mkdir()
    (tmp_path / "workdir" / f"cache-{S['hf']}.txt").write_text("nothing secret inside\n")
    with pytest.raises(BundleError) as err:
        scan(tmp_path, clean_host())
    assert "<hf-token>" in err.value.render() and S["hf"] not in err.value.render()
