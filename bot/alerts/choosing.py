"""Which runbook an alert proposes: its rule's, or the XID table's for the alert's XID
(``remediation.xid``: reset, reboot, swap or none); and a repeat offender's alert proposes
swap-gpu instead, marked as repeat."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bot.config import AlertRule
from bot.runbooks import templating
from bot.service import Service, repeat_text
from kit.errors import Refused

SWAP = "swap-gpu"
# what each entry of the XID table proposes: the runbook and the parameters it adds
XID_RUNBOOKS: dict[str, tuple[str, dict[str, str]]] = {
    "reset": ("reset-gpu", {"method": "reset"}),
    "reboot": ("reset-gpu", {"method": "reboot"}),
    "swap": (SWAP, {}),
}


@dataclass(frozen=True)
class Choice:
    runbook: str
    params: dict[str, str]
    note: str | None = None  # shown with the proposal: why this runbook (repeat offender)
    xid: int | None = None  # the XID the table answered (an ``xid:`` rule)


class NothingToDo(Exception):
    """The XID table says ``none`` for this alert's XID: no proposal."""


def choose(service: Service, rule: AlertRule, labels: dict[str, str],
           params: dict[str, str]) -> Choice:
    """Refused when the XID cannot be read or is not in the table; NothingToDo for none."""
    if rule.xid is None:
        assert rule.runbook is not None  # the configuration asks for one or the other
        choice = Choice(rule.runbook, params)
    else:
        choice = _by_xid(service, rule.xid, labels, params)
    return _repeat(service, choice)


def _by_xid(service: Service, template: str, labels: dict[str, str],
            params: dict[str, str]) -> Choice:
    shown = str(templating.render(template, {"labels": labels})).strip()
    if not re.fullmatch(r"[0-9]{1,3}", shown):
        raise Refused(f"the alert's XID {shown[:20]!r} is not a number from 1 to 999")
    xid = int(shown)
    action = service.config.remediation.action_for(xid)
    if action is None:
        raise Refused(f"XID {xid} is not in the XID table (remediation.xid in the "
                      "configuration): add it as reset, reboot, swap or none")
    if action == "none":
        raise NothingToDo(f"XID {xid}: the XID table says none (the application's error)")
    runbook, extra = XID_RUNBOOKS[action]
    return Choice(runbook, {**params, **extra}, note=f"XID {xid}: {action} (remediation.xid)",
                  xid=xid)


def _repeat(service: Service, choice: Choice) -> Choice:
    """A node that needed ``remediation.repeat.remediations`` remediations within
    ``days`` gets swap-gpu, not another drain, reset or resume."""
    node = choice.params.get("node")
    if not node or choice.runbook == SWAP:
        return choice
    wanted = service.runbooks().get(choice.runbook)
    if wanted is None or wanted.runbook.remediation is None:
        return choice
    found = service.repeat_offences(node)
    if not found:
        return choice
    offence = repeat_text(node, found, service.config.remediation.repeat.days)
    gpu = choice.params.get("gpu")
    if gpu is None:  # swap-gpu needs the GPU: propose what was asked, marked
        return Choice(choice.runbook, choice.params,
                      note=f"repeat: {offence}; the alert names no GPU, so no swap-gpu",
                      xid=choice.xid)
    reason = choice.params.get("reason") or f"{choice.runbook} asked again"
    swap = {"node": node, "gpu": gpu, "reason": f"repeat offender: {reason}"[:150]}
    return Choice(SWAP, swap, note=f"repeat: {offence}; swap-gpu instead of {choice.runbook}",
                  xid=choice.xid)
