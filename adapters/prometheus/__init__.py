"""Prometheus: queries over prometheus-api-client (imported on first use), PromQL escaping
and the ``prom.wait`` action.

    backend = PrometheusApiBackend(PrometheusConfig(url="http://prometheus:9090"))
    backend.query(build('DCGM_FI_DEV_GPU_TEMP{hostname="$node"}', node=node))  # template.py
"""

from typing import TYPE_CHECKING

from adapters.lazy import exports

if TYPE_CHECKING:
    from adapters.prometheus.actions import (
        ACTION_CLASSES,
        PrometheusActions,
        WaitAction,
        WaitArguments,
    )
    from adapters.prometheus.adapter import ADAPTER
    from adapters.prometheus.backend import (
        PrometheusApiBackend,
        PrometheusBackend,
        PrometheusError,
        PrometheusRejected,
        PrometheusUnavailable,
        Sample,
        Series,
    )
    from adapters.prometheus.config import PrometheusConfig
    from adapters.prometheus.promql import (
        Expectation,
        escape_label_value,
        format_value,
        label_matcher,
        selector,
        series_text,
    )
    from adapters.prometheus.verdict import (
        Verdict,
        judge,
        listing,
    )

__getattr__ = exports(__name__, {
    "adapters.prometheus.actions": (
        "ACTION_CLASSES", "PrometheusActions", "WaitAction", "WaitArguments",
    ),
    "adapters.prometheus.adapter": ("ADAPTER",),
    "adapters.prometheus.backend": (
        "PrometheusApiBackend", "PrometheusBackend", "PrometheusError", "PrometheusRejected",
        "PrometheusUnavailable", "Sample", "Series",
    ),
    "adapters.prometheus.config": ("PrometheusConfig",),
    "adapters.prometheus.promql": (
        "Expectation", "escape_label_value", "format_value", "label_matcher", "selector",
        "series_text",
    ),
    "adapters.prometheus.verdict": ("Verdict", "judge", "listing"),
})

__all__ = [
    "ACTION_CLASSES",
    "ADAPTER",
    "Expectation",
    "PrometheusActions",
    "PrometheusApiBackend",
    "PrometheusBackend",
    "PrometheusConfig",
    "PrometheusError",
    "PrometheusRejected",
    "PrometheusUnavailable",
    "Sample",
    "Series",
    "Verdict",
    "WaitAction",
    "WaitArguments",
    "escape_label_value",
    "format_value",
    "judge",
    "label_matcher",
    "listing",
    "selector",
    "series_text",
]
