"""The lab's Slack: a stdlib-only fake of Slack's Web API and Socket Mode.

Slack's servers cannot be reached from the lab, so this plays them for the bot (slack_sdk's
`WebClient(base_url="http://127.0.0.1:PORT/api/")` and its Socket Mode clients): the Web API
methods the bot uses, answered in Slack's shapes and with Slack's errors, a WebSocket endpoint
for Socket Mode, response_url endpoints, and control endpoints under /_lab/ for tests (what was
called, what the channel shows, faults to arm, envelopes to send). See deploy/lab/README.md,
section "Slack".
"""
