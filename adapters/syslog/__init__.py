"""Syslog: the bot's audit log to a syslog receiver (rsyslog, syslog-ng, a SIEM's collector)
as RFC 5424 messages over TCP (RFC 6587 octet counting), optionally TLS (RFC 5425).

    client = SyslogClient(SyslogConfig(host="logs.example", tls=True, ca_file=...))
    client.send(events)   # DeliveryError unless the receiver read the whole batch
"""

from typing import TYPE_CHECKING

from adapters.lazy import exports

if TYPE_CHECKING:
    from adapters.syslog.client import SyslogClient, tls_context
    from adapters.syslog.config import SyslogConfig
    from adapters.syslog.rfc5424 import APP_NAME, frame, message

__getattr__ = exports(__name__, {
    "adapters.syslog.client": ("SyslogClient", "tls_context"),
    "adapters.syslog.config": ("SyslogConfig",),
    "adapters.syslog.rfc5424": ("APP_NAME", "frame", "message"),
})

__all__ = ["APP_NAME", "SyslogClient", "SyslogConfig", "frame", "message", "tls_context"]
