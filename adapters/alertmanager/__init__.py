"""Alertmanager: alerts and silences over its HTTP API v2, and the ``alertmanager.silence``
/ ``alertmanager.expire_silence`` actions.

    config = AlertmanagerConfig(url="http://alertmanager:9093")
    actions = AlertmanagerActions(config).all()
"""
