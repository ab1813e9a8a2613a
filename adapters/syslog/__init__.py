"""Syslog: the bot's audit log to a syslog receiver (rsyslog, syslog-ng, a SIEM's collector)
as RFC 5424 messages over TCP (RFC 6587 octet counting), optionally TLS (RFC 5425).

    client = SyslogClient(SyslogConfig(host="logs.example", tls=True, ca_file=...))
    client.send(events)   # DeliveryError unless the receiver read the whole batch
"""
