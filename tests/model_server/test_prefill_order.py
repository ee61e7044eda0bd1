"""The order in which the token loop prefills waiting prompts: shortest first, but never a
prompt passed over for good, and never ahead of a sequence whose cache waits on the CPU."""

from __future__ import annotations

from types import SimpleNamespace

from carpool_model_server.prefill_alone import PATIENCE_S, waiting_order


def waiting(name: str, tokens: int, waited_s: float, offloaded: bool = False) -> SimpleNamespace:
    return SimpleNamespace(
        name=name,
        remaining_prefill_tokens=[0] * tokens,
        created_time=100.0 - waited_s,
        is_cpu_offloaded=offloaded,
    )


def test_shorter_prompts_go_first_until_a_longer_one_has_waited_its_patience() -> None:
    candidates = [
        waiting("restored", 100, 0.0, offloaded=True),
        waiting("long, waited", 300, PATIENCE_S + 0.5),
        waiting("medium", 50, 0.1),
        waiting("longer, waited longer", 400, PATIENCE_S + 1.0),
        waiting("short", 5, 0.0),
    ]
    order = [state.name for state in waiting_order(candidates, now=100.0)]
    assert order == ["restored", "longer, waited longer", "long, waited", "short", "medium"]
