"""Huge prompts and settings past their bounds to text-generation, among neighbours (#25).

What is promised (`long_prompt.broken_promises`): a 16 MB and a 60 MB prompt each get 400
naming the model's limit (max_element_bytes) within 3 s of being sent, upload included,
before anything is queued; 20 stop strings and max_new_tokens 3000000000 get 400 as fast; a
temperature of 1e-38 gets its 200; every neighbour gets a 200 (no 504 under a 5 s
deadline); the model server's RSS grows by at most 100 MiB.
"""

from __future__ import annotations

from pathlib import Path

from reliability.long_prompt import Plan, broken_promises, run, summary
from reliability.soaked import soaked


def test_a_huge_prompt_is_refused_before_it_costs_the_model_anything(tmp_path: Path) -> None:
    plan = soaked(Plan())
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken}\n{summary(report)}"
