"""The Bolt app: the ``/runbook`` command and the buttons, acknowledged at once.

Every listener acknowledges first and hands the work to a pool of its own, so a
slow plan (Prometheus, Slurm) never holds up the next acknowledgement; in HTTP mode
commands and buttons skip Bolt's dispatch (``Listeners.acknowledged``). The work
is one line of the chat grammar given to ``commands.handle``: a button is the
command it stands for (Approve on execution 12 is ``approve 12``). A Slack user not in
``slack.users`` is refused every line but the reading ones first (``Identities.refusal``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from slack_bolt import App
from slack_bolt.context.respond import Respond

from bot.service import Service
from bot.surfaces.chat import commands
from bot.surfaces.chat.ids import is_id
from bot.surfaces.chat.reply import Reply
from bot.surfaces.slack import deliveries
from bot.surfaces.slack.identity import Identities
from bot.surfaces.slack.secrets import SlackSecrets
from kit.errors import Refused

log = logging.getLogger(__name__)
ACK_THREADS = 32  # Bolt's pool only acknowledges; the work runs in the surface's own pool
# Work waits for a pause of QUIET seconds in the acknowledgements, PATIENCE at most: _paced
QUIET = 0.01
PATIENCE = 0.25
COMMAND = "/runbook"
BUTTONS = ("approve", "deny", "cancel", "run_proposal", "dismiss_proposal", "confirm_yes",
           "confirm_no")


class Listeners:
    def __init__(self, service: Service, client: Any, identities: Identities, work: Executor,
                 changed: Callable[[], None]) -> None:
        self.service = service
        self.client = client
        self.identities = identities
        self.work = work
        self.changed = changed  # tells the progress poster to look now
        self.last_ack = 0.0  # time.monotonic() of the last acknowledged()
        self.burst = threading.Lock()  # held by the one piece of work running in a burst

    def acknowledged(self, body: Any) -> bool:
        """Hand a ``/runbook`` command or a click on one of BUTTONS, already acknowledged
        (HTTP mode: bot.surfaces.slack.surface), to the work pool as Bolt's dispatch would
        hand it to the listener, matched as Bolt matches; False for any other request.
        Quick: it runs on the HTTP server's event loop."""
        if not isinstance(body, dict) or "ssl_check" in body:  # Bolt answers that one itself
            return False
        if body.get("command") == COMMAND and "type" not in body:  # not an event's shape
            url = body.get("response_url")
            respond = Respond(response_url=url, proxy=self.client.proxy,
                              ssl=self.client.ssl) if url else None
            self.last_ack = time.monotonic()
            self.work.submit(self._guard, self._command, body, respond)
            return True
        actions = body.get("actions")
        if (body.get("type") == "block_actions" and isinstance(actions, list) and actions
                and isinstance(actions[0], dict) and actions[0].get("action_id") in BUTTONS):
            self.last_ack = time.monotonic()
            self.work.submit(self._guard, self._button, body, actions[0])
            return True
        return False

    # --- the slash command ------------------------------------------------------------

    def command(self, ack: Any, body: dict[str, Any], respond: Any) -> None:
        ack()
        self.work.submit(self._guard, self._command, body, respond)

    def _command(self, body: dict[str, Any], respond: Any) -> None:
        person = self.identities.who(body["user_id"])
        line = body.get("text", "")
        refusal = self.identities.refusal(person, line)
        reply = (Reply(refusal, ok=False) if refusal is not None
                 else commands.handle(self.service, line, person.name))
        respond(text=_as_code(reply.text), response_type="ephemeral", replace_original=False)
        if reply.execution_id is not None:
            self.changed()

    # --- buttons ------------------------------------------------------------------------

    def button(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        ack()
        self.work.submit(self._guard, self._button, body, action)

    def _button(self, body: dict[str, Any], action: dict[str, Any]) -> None:
        person = self.identities.who(body["user"]["id"])
        line, problem = self._line_for(action)
        text = (self.identities.refusal(person, line) or problem
                or commands.handle(self.service, line, person.name).text)
        channel = (body.get("channel") or {}).get("id") or (body.get("container") or {}).get(
            "channel_id")
        if channel:
            self.client.chat_postEphemeral(channel=channel, user=body["user"]["id"], text=text)
        self.changed()

    def _line_for(self, action: dict[str, Any]) -> tuple[str, str | None]:
        """The chat command a button stands for, and why it no longer applies (or None)."""
        name, value = action.get("action_id", ""), str(action.get("value", ""))
        head, _, tail = value.partition(":")
        if not is_id(head):
            return "", f"this button carries no valid ID ({value[:40]!r})"
        if name == "approve":  # the hash in the approval's own compare-and-set, no check first
            if not tail:
                return "", "this button carries no plan hash: look at the request again"
            return f"approve {head} {tail}", None
        if name == "deny":
            line = f'deny {head} "denied from Slack"'
            try:
                current = self.service.get(int(head)).plan_hash
            except Refused as exc:
                return line, str(exc)
            if tail != current:
                return line, (f"execution {head}: the plan changed since this message was "
                              "posted; look at the new plan before deciding")
            return line, None
        if name in ("confirm_yes", "confirm_no"):
            # ID:STEP:PLAN_HASH (ID:STEP on a button posted before the plan was added)
            step, _, plan_hash = tail.partition(":")
            answer = "yes" if name == "confirm_yes" else "no"
            return (f"confirm {head} {answer}" + (f" step={step}" if step else "")
                    + (f" plan={plan_hash}" if plan_hash else "")), None
        lines = {"cancel": f"cancel {head}", "run_proposal": f"proposal run {head}",
                 "dismiss_proposal": f"proposal dismiss {head}"}
        if name not in lines:
            return "", f"unknown button {name[:40]!r}"
        return lines[name], None

    def _guard(self, work: Callable[..., None], body: dict[str, Any], *args: Any) -> None:
        """After the acknowledgement: act once per delivery, and log a failure, never lose
        it silently. (The redelivery check reads the database, so it stays off the ack path.)"""
        try:
            with self._paced():
                key = deliveries.key_of(body)
                if key is not None and not deliveries.first_time(self.service.db, key):
                    log.info("ignored a redelivered Slack request (%s)",
                             key.partition(":")[0])
                    return
                work(body, *args)
        except Exception:
            log.exception("Slack request failed after it was acknowledged")

    @contextmanager
    def _paced(self) -> Iterator[None]:
        """Acknowledgements first. The work's CPU would hold up the next acknowledgements,
        which Slack needs within 3 s, while an answer at response_url may come later: during
        a burst, work waits for a pause of QUIET in them (PATIENCE at most), then, while they
        keep coming, runs one at a time. 50 commands at once on two cores, with the work:
        acknowledged in 20-70 ms (median) that way, 60-160 ms without."""
        deadline = time.monotonic() + PATIENCE
        while (now := time.monotonic()) < deadline and now - self.last_ack < QUIET:
            time.sleep(QUIET)
        while time.monotonic() - self.last_ack < QUIET:
            if self.burst.acquire(timeout=QUIET):
                try:
                    yield
                finally:
                    self.burst.release()
                return
        yield


def build_app(service: Service, secrets: SlackSecrets, client: Any, listeners: Listeners) -> App:
    app = App(
        client=client,
        signing_secret=secrets.signing_secret or "",
        request_verification_enabled=secrets.mode == "http",
        process_before_response=False,
        listener_executor=ThreadPoolExecutor(ACK_THREADS, thread_name_prefix="slack-ack"),
        logger=log,
    )

    app.command(COMMAND)(listeners.command)
    for action_id in BUTTONS:
        app.action(action_id)(listeners.button)
    return app


def _as_code(text: str) -> str:
    return "```" + text.replace("```", "'''") + "```" if "\n" in text else text
