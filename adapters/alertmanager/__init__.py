"""Alertmanager: alerts and silences over its HTTP API v2, and the ``alertmanager.silence``
/ ``alertmanager.expire_silence`` actions.

    config = AlertmanagerConfig(url="http://alertmanager:9093")
    actions = AlertmanagerActions(config).all()
"""

from typing import TYPE_CHECKING

from adapters.lazy import exports

if TYPE_CHECKING:
    from adapters.alertmanager.actions import (
        ACTION_CLASSES,
        BOT_AUTHOR,
        AlertmanagerActions,
        ExpireSilenceAction,
        ExpireSilenceArguments,
        SilenceAction,
        SilenceArguments,
    )
    from adapters.alertmanager.adapter import ADAPTER
    from adapters.alertmanager.backend import (
        Alert,
        AlertmanagerBackend,
        AlertmanagerError,
        AlertmanagerUnavailable,
        HttpAlertmanagerBackend,
        Matcher,
        MatchersLike,
        Silence,
        format_time,
        matchers_from,
        parse_time,
    )
    from adapters.alertmanager.config import AlertmanagerConfig

__getattr__ = exports(__name__, {
    "adapters.alertmanager.actions": (
        "ACTION_CLASSES", "BOT_AUTHOR", "AlertmanagerActions", "ExpireSilenceAction",
        "ExpireSilenceArguments", "SilenceAction", "SilenceArguments",
    ),
    "adapters.alertmanager.adapter": ("ADAPTER",),
    "adapters.alertmanager.backend": (
        "Alert", "AlertmanagerBackend", "AlertmanagerError", "AlertmanagerUnavailable",
        "HttpAlertmanagerBackend", "Matcher", "MatchersLike", "Silence", "format_time",
        "matchers_from", "parse_time",
    ),
    "adapters.alertmanager.config": ("AlertmanagerConfig",),
})

__all__ = [
    "ACTION_CLASSES",
    "ADAPTER",
    "BOT_AUTHOR",
    "Alert",
    "AlertmanagerActions",
    "AlertmanagerBackend",
    "AlertmanagerConfig",
    "AlertmanagerError",
    "AlertmanagerUnavailable",
    "ExpireSilenceAction",
    "ExpireSilenceArguments",
    "HttpAlertmanagerBackend",
    "Matcher",
    "MatchersLike",
    "Silence",
    "SilenceAction",
    "SilenceArguments",
    "format_time",
    "matchers_from",
    "parse_time",
]
