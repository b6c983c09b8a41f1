"""Writes every PromQL expression of a Grafana dashboard as a Prometheus
recording rule, so that `promtool check rules` parses each one.

Grafana's own variables are replaced by values of their kind first
(`$__rate_interval` by a duration, `$instance` by a regex), since
Prometheus knows none of them.

Usage: dashboard_promql.py DASHBOARD.json RULES.yml
"""

import json
import sys
from typing import Any

# What Grafana puts in place of its variables, as Prometheus would see it.
SUBSTITUTES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "$instance": ".*",
    "$cluster": ".*",
}


def expressions(panels: list[Any]) -> list[tuple[str, str]]:
    """Each query's expression with its panel's title, rows' panels too."""
    found: list[tuple[str, str]] = []
    for panel in panels:
        for target in panel.get("targets", []):
            found.append((str(panel.get("title", "")), str(target["expr"])))
        found.extend(expressions(panel.get("panels", [])))
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        dashboard = json.load(f)
    lines = ["groups:", "- name: dashboard", "  rules:"]
    for i, (title, expr) in enumerate(expressions(dashboard["panels"])):
        for name, value in SUBSTITUTES.items():
            expr = expr.replace(name, value)
        # A JSON string is a YAML double-quoted string.
        lines.append(f"  # {json.dumps(title)}")
        lines.append(f"  - record: dashboard:query_{i}")
        lines.append(f"    expr: {json.dumps(expr)}")
    with open(argv[2], "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
