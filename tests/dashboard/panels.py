"""The dashboard's panels and their PromQL, with Grafana's variables substituted.

Grafana fills `$namespace` and `$model` from the variables and `$__rate_interval` from the scrape
interval; `substitute` does the same so that a query can run straight against Prometheus.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "dashboards" / "carpool.json"

# Panels that only have data on a CUDA model server.
CUDA_ONLY = frozenset({"GPU memory"})
# Panels with data only from a model that generates text: test_generation_panels.py runs one.
GENERATION = frozenset(
    {
        "Generated tokens per second",
        "Time to first token",
        "Inter-token latency",
        "Sequences running and waiting",
        "KV cache use",
    }
)


@dataclass(frozen=True)
class Query:
    legend: str
    expr: str


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str
    unit: str
    queries: tuple[Query, ...]


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


def panels(dashboard: dict[str, Any]) -> list[Panel]:
    """Every panel with queries, rows flattened, in dashboard order."""
    found: list[Panel] = []
    for panel in dashboard["panels"]:
        nested = panel.get("panels", []) if panel["type"] == "row" else [panel]
        for inner in nested:
            targets = inner.get("targets", [])
            if not targets:
                continue
            queries = tuple(Query(t.get("legendFormat", ""), t["expr"]) for t in targets)
            unit = inner.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
            found.append(Panel(inner["title"], inner["type"], unit, queries))
    return found


def substitute(expr: str, *, namespace: str = ".*", model: str = ".*", rate: str = "10s") -> str:
    """The query as Grafana sends it, for the given variable values.

    The local test has no Kubernetes service discovery, hence no `namespace` label: `.*` (All)
    matches the empty label, as it does in Grafana.
    """
    return (
        expr.replace("$__rate_interval", rate)
        .replace("$namespace", namespace)
        .replace("$model", model)
    )
