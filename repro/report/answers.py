"""The report's answers, each a pure function of the merged records.

* per env (headline): does it reproduce, is it fixed by our patch   -> per_env.py
* MiCS logic or the ROCm environment?                                -> cause.py
* does upgrading torch/DeepSpeed resolve it?                         -> upgrade.py
* anything else found (hangs, crashes, env errors)                   -> findings.py
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from repro.report.cause import DEFAULT_GPU_ENV_HINT, CauseAnswer, CauseData, cause
from repro.report.findings import other_findings
from repro.report.merge import MergedResults
from repro.report.per_env import EnvAnswer, EnvAnswerData, env_answer
from repro.report.upgrade import UpgradeAnswer, UpgradeData, relation, upgrade
from repro.report.verdicts import Finding, FindingData

__all__ = ["DEFAULT_GPU_ENV_HINT", "Answers", "answer_all", "relation"]


# The three answers and the findings in report.json.
class AnswersData(TypedDict):
    headline: list[EnvAnswerData]
    cause: CauseData
    upgrade: UpgradeData
    findings: list[FindingData]


@dataclass(frozen=True)
class Answers:
    envs: tuple[EnvAnswer, ...]
    cause: CauseAnswer
    upgrade: UpgradeAnswer
    findings: tuple[Finding, ...]

    def to_dict(self) -> AnswersData:
        return {
            "headline": [e.to_dict() for e in self.envs],
            "cause": self.cause.to_dict(),
            "upgrade": self.upgrade.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
        }


def answer_all(merged: MergedResults, gpu_env_hint: Sequence[str] = DEFAULT_GPU_ENV_HINT) -> Answers:
    envs = tuple(env_answer(env, merged) for env in merged.envs.values())
    return Answers(
        envs=envs,
        cause=cause(merged, gpu_env_hint),
        upgrade=upgrade(envs),
        findings=tuple(other_findings(merged)),
    )
