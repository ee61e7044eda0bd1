"""The weights fetcher against a store that attacks it (#25).

What is promised (`hostile_store.broken_promises`): a folder whose index pages link out of
it, to themselves and back up is fetched, exit 0, with exactly its own files, nothing
outside the target folder, each index page read once and no file outside the folder
requested; a tar.gz bomb is refused, exit 1 naming the bound, having written no more than
--max-unpacked-bytes; a zip of more than MAX_FILES members is refused before it writes a
file; each within 60 s.
"""

from __future__ import annotations

from pathlib import Path

from reliability.hostile_store import Plan, broken_promises, run, summary
from reliability.soaked import soaked


def test_a_hostile_store_writes_nothing_outside_and_nothing_unbounded(tmp_path: Path) -> None:
    plan = soaked(Plan())
    report = run(tmp_path, plan)
    broken = broken_promises(report, plan)
    print(summary(report))
    assert not broken, f"{broken}\n{summary(report)}"
