"""deploy/'s Grafana dashboard and Prometheus alert rules: well formed, and every metric they name is
one the server's /metrics really exports (read from the server's own registry, not from a list)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from common.settings import Settings
from common.startup import PHASES, StartupState
from server.core.services import Services

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "warmpool-dashboard.json"
RULES = DEPLOY / "prometheus" / "warmpool-alerts.yaml"

# The sample names each metric type is exposed under (the exposition format's suffixes; prometheus_client
# names a counter's family without its _total).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}
# Grafana's interval variables stand where PromQL wants a duration; any duration parses the same.
GRAFANA_DURATION = re.compile(r"\$\{?(__rate_interval|__interval|__range)(_ms|_s)?\}?")
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*\w+\)$", re.DOTALL)


def parse(expr: str) -> promql_parser.Expr:
    """The PromQL AST of a dashboard or rule expression (Grafana's interval variables filled in)."""
    return promql_parser.parse(GRAFANA_DURATION.sub("5m", expr))


def metric_names(expr: str) -> set[str]:
    """Every metric name a PromQL expression selects: named selectors and {__name__="..."} alike."""
    found: set[str] = set()

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                found.add(node.name)
            found.update(m.value for m in node.matchers.matchers if m.name == "__name__")

    promql_parser.walk(parse(expr), visit)
    return found


def dashboard_expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable (label_values' selector)."""
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            match = LABEL_VALUES.match(query)
            assert match, f"variable {variable['name']!r}: expected label_values(selector, label), got {query!r}"
            yield f"variable {variable['name']!r}", match["selector"]


def rule_expressions(rules: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for group in rules["groups"]:
        for rule in group["rules"]:
            yield f"rule {rule.get('alert') or rule.get('record')!r}", rule["expr"]


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included; rows themselves are not panels."""
    for panel in panels:
        if panel["type"] == "row":
            yield from _panels(panel.get("panels", []))
        else:
            yield panel


def unknown_metrics(expressions: Iterator[tuple[str, str]], exported: set[str]) -> dict[str, set[str]]:
    """where -> the metric names it uses that the server does not export (empty when all are)."""
    unknown: dict[str, set[str]] = {}
    for where, expr in expressions:  # a panel has several targets: gather them all
        missing = metric_names(expr) - exported
        if missing:
            unknown.setdefault(where, set()).update(missing)
    return unknown


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """The sample names the registry behind GET /metrics exposes (built as the server builds it),
    from each family's name and type, so labelled metrics not yet observed count too."""
    with ThreadPoolExecutor(1) as executor:
        svc = Services(settings=Settings(), startup=StartupState(), executor=executor)
        families = list(svc.metrics.registry.collect())
    names: set[str] = set()
    for family in families:
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
        names.update(sample.name for sample in family.samples)
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return loaded


def test_exported_names_come_from_the_registry_with_their_suffixes(exported: set[str]) -> None:
    """The reference set is the server's own: histogram, counter and gauge sample names, and no
    suffix a type does not have (a gauge has no _total)."""
    assert {
        "warmpool_request_duration_seconds_bucket",
        "warmpool_request_duration_seconds_count",
        "warmpool_engine_restarts_total",
        "warmpool_ready",
    } <= exported
    assert "warmpool_ready_total" not in exported
    assert "warmpool_engine_restarts" not in exported


def test_extractor_finds_metrics_everywhere_and_nothing_else() -> None:
    """Selectors inside functions, aggregations, binary operations, subqueries and {__name__=...}
    count; function names, label names, grouping labels and Grafana variables do not."""
    expr = (
        'histogram_quantile(0.99, sum by (le, route) (rate(a_bucket{job=~"$job"}[$__rate_interval])))'
        ' / on (instance) group_left max_over_time(b[1h:5m]) + {__name__="c"} * ignoring (x) count(d offset 5m)'
    )
    assert metric_names(expr) == {"a_bucket", "b", "c", "d"}


def test_dashboard_parses_and_every_panel_has_a_query(dashboard: dict[str, Any]) -> None:
    """The dashboard is JSON with panels, each with at least one PromQL target that parses, all on the
    templated data source, so it imports into any Grafana with any Prometheus data source name."""
    panels = list(_panels(dashboard["panels"]))
    assert panels
    assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in dashboard["templating"]["list"])
    for panel in panels:
        assert panel.get("targets"), f"panel {panel['title']!r} has no target"
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            parse(target["expr"])
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"]), "panel ids must be unique"


def test_rule_file_has_the_prometheus_rule_structure(rules: dict[str, Any]) -> None:
    """groups -> rules, each an alert with a parsing expr, a severity label and a summary and description."""
    assert rules["groups"]
    alerts = []
    for group in rules["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            alerts.append(rule["alert"])
            parse(rule["expr"])
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
            if "for" in rule:
                assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
    assert len(alerts) == len(set(alerts)), "alert names must be unique"


def test_every_metric_on_the_dashboard_is_exported(dashboard: dict[str, Any], exported: set[str]) -> None:
    """No panel or variable queries a metric the server does not export (it would draw nothing)."""
    assert unknown_metrics(dashboard_expressions(dashboard), exported) == {}


def test_every_metric_in_the_alert_rules_is_exported(rules: dict[str, Any], exported: set[str]) -> None:
    """No alert watches a metric the server does not export (it could never fire)."""
    assert unknown_metrics(rule_expressions(rules), exported) == {}


def test_a_mistyped_metric_is_caught(dashboard: dict[str, Any], exported: set[str]) -> None:
    """The check is not vacuous: one misspelt metric in the first target of a panel with several targets
    (in a copy of the dashboard) is reported, by panel: the panel's later targets do not hide it."""
    broken = json.loads(json.dumps(dashboard))
    panel = next(p for p in _panels(broken["panels"]) if len(p["targets"]) > 1)
    first = panel["targets"][0]
    (name,) = metric_names(first["expr"])
    first["expr"] = first["expr"].replace(name, name + "_typo")
    assert unknown_metrics(dashboard_expressions(broken), exported) == {f"panel {panel['title']!r}": {name + "_typo"}}


def test_readiness_and_engines_up_gauges_follow_the_startup_state() -> None:
    """warmpool_ready is 1 exactly while the server is serving (what /health/ready answers 200 on) and
    warmpool_engines_up is the engine phase's count of warm engines: the readiness alerts rely on both."""
    startup = StartupState()
    with ThreadPoolExecutor(1) as executor:
        registry = Services(settings=Settings(), startup=startup, executor=executor).metrics.registry

        def read() -> tuple[float | None, float | None]:
            up = registry.get_sample_value("warmpool_engines_up", {"model": ""})  # no model configured here
            return registry.get_sample_value("warmpool_ready"), up

        starting = read()
        for phase in PHASES:
            startup.start(phase)
            startup.done(phase)
        startup.update("engine", up=2)
        startup.engine_up = True
        serving = (startup.serving, *read())
        startup.draining = True
        draining = (startup.serving, *read())
    assert starting == (0.0, 0.0)
    assert serving == (True, 1.0, 2.0)
    assert draining == (False, 0.0, 2.0)
