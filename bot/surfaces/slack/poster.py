"""Plans, progress and proposals in the channel: what the database says, kept up to date.

It decides nothing: it reads the bot's state (through the store's queries and the command
paths) and posts it, keeping its own record of what it posted (bot.store.chatrecord); see
``Poster``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

from bot import commands
from bot.execution import confirming, executions
from bot.execution.executions import Execution
from bot.schedule import windows
from bot.service import Service
from bot.store import audit, chatrecord, checkpoints, queries
from bot.store.checkpoints import Checkpoint
from bot.store.words import Kind
from bot.surfaces.slack import blocks, deliveries
from bot.surfaces.slack.blocks import Message
from kit.canonical import canonical

log = logging.getLogger(__name__)
MAX_QUEUED_LINES = 500
LINES_PER_REPLY = 40
# Executions that ended shortly before the poster started (a restart, a new leader) still
# get their message; older ones do not flood the channel when Slack is first switched on.
LOOKBACK_SECONDS = 300.0


class Poster:
    """One root message per execution, posted when it is requested (from any surface:
    Slack, the CLI, a schedule, an alert) and updated with ``chat.update`` as its steps
    move; the engine's progress lines (``report``) and the final summary go to its thread.
    Each message has a row in ``chat_messages`` claimed before it is posted, so a restart or
    another replica never posts it twice. It runs in the leader only, next to the engine
    whose progress lines it receives.
    """

    def __init__(self, service: Service, client: Any, channel: str, poll_seconds: float) -> None:
        self.service = service
        self.client = client
        self.channel = channel
        self.poll_seconds = poll_seconds
        self._lines: dict[int, list[str]] = defaultdict(list)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._since = _iso(time.time() - LOOKBACK_SECONDS)

    # --- inputs ---------------------------------------------------------------------

    def report(self, execution_id: int, line: str) -> None:
        """The engine's progress line: goes to the execution's thread at the next tick."""
        with self._lock:
            queued = self._lines[execution_id]
            if len(queued) < MAX_QUEUED_LINES:
                queued.append(line)
        self._wake.set()

    def checkpoint(self, point: Checkpoint) -> None:
        """Post the audit log's head to the channel once (audit.checkpoint_chat): a record of
        it outside the database. The line after the words is what a checkpoint file holds."""
        line = checkpoints.as_line(point)
        self._post(f"checkpoint:{point.seq}:{point.hash[:16]}",
                   Message(f"audit checkpoint {line}",
                           [{"type": "section", "text": {"type": "mrkdwn", "text":
                             f"audit checkpoint `{line}`"}}]))

    def nudge(self) -> None:
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        last_prune = 0.0
        while not stop.is_set():
            try:
                self.tick()
                if time.monotonic() - last_prune > 3600:
                    deliveries.prune(self.service.db)
                    last_prune = time.monotonic()
            except Exception:  # Slack or the database hiccuped: try again next tick
                log.exception("posting progress to Slack failed; retrying")
            self._wake.wait(self.poll_seconds)
            self._wake.clear()
            stop.wait(min(0.2, self.poll_seconds))  # at most ~5 ticks/s: Slack's rate limits

    def tick(self) -> None:
        self._post_new_executions()
        self._update_executions()
        self._proposals()
        self._breaker()
        self._overdue_windows()

    # --- executions -----------------------------------------------------------------

    def _post_new_executions(self) -> None:
        with self.service.db.connect() as conn:
            ids = queries.execution_ids_since(conn, self._since)
        known = chatrecord.posted(self.service.db, "execution:%")
        for execution_id in ids:
            if f"execution:{execution_id}" not in known:
                self._post_root(execution_id)

    def _post_root(self, execution_id: int) -> None:
        ex, approvers, states = self._read(execution_id)
        message = blocks.progress_message(ex, approvers, states)
        self._post(f"execution:{execution_id}", message)

    def _update_executions(self) -> None:
        for subject, ts, rendered in self._open_messages("execution:%"):
            execution_id = int(subject.split(":")[1])
            ex, approvers, states = self._read(execution_id)
            message = blocks.progress_message(ex, approvers, states)
            if _digest(message) != rendered:
                self.client.chat_update(channel=self.channel, ts=ts, text=message.text,
                                        blocks=message.blocks)
                self._set(subject, rendered=_digest(message))
            self._questions(ex, ts)
            self._flush_lines(execution_id, ts)
            if ex.terminal:
                self._flush_lines(execution_id, ts)
                self.client.chat_postMessage(channel=self.channel, thread_ts=ts,
                                             text=self._summary(ex))
                self._charts(ex, ts)
                self._set(subject, final=1)

    def _read(self, execution_id: int) -> tuple[Execution, list[str], Any]:
        ex = self.service.get(execution_id)  # ends it first if its approval window passed
        with self.service.db.connect() as conn:
            return (ex, executions.approvals_for(conn, ex.id, ex.plan_hash),
                    executions.step_states_of(conn, ex.id))

    def _flush_lines(self, execution_id: int, ts: str) -> None:
        with self._lock:
            lines = self._lines.pop(execution_id, [])
        for start in range(0, len(lines), LINES_PER_REPLY):
            chunk = lines[start:start + LINES_PER_REPLY]
            self.client.chat_postMessage(channel=self.channel, thread_ts=ts,
                                         text="```" + "\n".join(chunk) + "```")

    def _summary(self, ex: Execution) -> str:
        with self.service.db.connect() as conn:
            events = list(audit.events(conn, execution_id=ex.id))
        checks = [e["data"] for e in events if e["kind"] == Kind.CHECK_EVALUATED]
        started = next((e["ts"] for e in events if e["kind"] == Kind.STARTED), None)
        duration = None
        if started and ex.finished_at:
            duration = (_parse(ex.finished_at) - _parse(started)).total_seconds()
        return blocks.summary_text(ex, checks, duration)

    def _charts(self, ex: Execution, root_ts: str) -> None:
        """A PNG a step wrote (its details' ``chart``: path, sha256; report.fairshare's),
        uploaded once into the thread (files_upload_v2); a file that is gone or changed since
        the step kept its hash is said in the thread instead."""
        with self.service.db.connect() as conn:
            finished = [e["data"] for e in audit.events(conn, execution_id=ex.id)
                        if e["kind"] == Kind.STEP_FINISHED]
        for data in finished:
            chart = (data.get("details") or {}).get("chart")
            if not isinstance(chart, dict) or chart.get("media_type") != "image/png":
                continue
            subject = f"file:{ex.id}:{data.get('step')}"
            if not self._claim(subject):
                continue
            path = Path(str(chart.get("path")))
            try:
                png = path.read_bytes()
            except OSError as exc:
                png, problem = b"", f"the chart {path} cannot be read ({exc.strerror})"
            else:
                problem = ("" if hashlib.sha256(png).hexdigest() == chart.get("sha256") else
                           f"the chart {path} changed since the step wrote it (sha256)")
            self._set(subject, ts=root_ts, final=1)  # once, even if Slack refuses it
            try:
                if not problem:
                    self.client.files_upload_v2(
                        channel=self.channel, thread_ts=root_ts, content=png,
                        filename=path.name, title=f"{ex.runbook} execution {ex.id}: {path.name}")
            except Exception as exc:  # the summary is posted already: say so, never repeat it
                log.exception("uploading %s to Slack failed", path)
                problem = f"uploading the chart {path} failed ({exc})"
            if problem:
                self.client.chat_postMessage(channel=self.channel, thread_ts=root_ts,
                                             text=f"{problem}: not uploaded")

    # --- questions a running step asks (chat.confirm) -------------------------------------

    def _questions(self, ex: Execution, root_ts: str) -> None:
        with self.service.db.connect() as conn:
            question = confirming.pending(conn, ex.id)
        if question is not None:
            subject = f"confirm:{ex.id}:{question.step_id}"
            message = blocks.confirm_message(ex.id, question.step_id, question.question,
                                             ex.plan_hash)
            self._post(subject, message, thread_ts=root_ts)
        for subject, ts, _ in self._open_messages(f"confirm:{ex.id}:%"):
            step_id = subject.split(":", 2)[2]
            with self.service.db.connect() as conn:
                row = queries.question(conn, ex.id, step_id)
            if row is not None and row["answer"] is not None:
                answered = blocks.answered_message(row["question"], row["answer"],
                                                   row["answered_by"] or "?")
                self.client.chat_update(channel=self.channel, ts=ts, text=answered.text,
                                        blocks=answered.blocks)
                self._set(subject, final=1)
            elif ex.terminal:
                self._set(subject, final=1)

    # --- proposals ----------------------------------------------------------------------

    def _proposals(self) -> None:
        with self.service.db.connect() as conn:
            open_ids = queries.open_proposal_ids(conn)
        for proposal_id in open_ids:
            proposal = commands.get_proposal(self.service, proposal_id)
            self._post(f"proposal:{proposal_id}", blocks.proposal_message(proposal))
        for subject, ts, rendered in self._open_messages("proposal:%"):
            proposal = commands.get_proposal(self.service, int(subject.split(":")[1]))
            message = blocks.proposal_message(proposal)
            if _digest(message) != rendered:
                self.client.chat_update(channel=self.channel, ts=ts, text=message.text,
                                        blocks=message.blocks)
                self._set(subject, rendered=_digest(message))
            # final once settled: a started proposal gets its execution a moment after
            if proposal.state != "open" and (proposal.state != "started"
                                             or proposal.execution_id is not None):
                self._set(subject, final=1)

    # --- the breaker ------------------------------------------------------------------------

    def _breaker(self) -> None:
        """Say once in the channel that the breaker tripped (whichever replica posts)."""
        tripped = commands.breaker_tripped(self.service)
        if tripped is None:
            return
        seq, reason = tripped
        text = (f":rotating_light: The breaker on automation tripped: {reason}. Alerts "
                "propose nothing and auto_run stops until an approver resets it "
                "(`/runbook breaker reset REASON`).")
        self._post(f"breaker:{seq}", Message(text, [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}}]))

    # --- windows past their end -------------------------------------------------------------

    def _overdue_windows(self) -> None:
        """Say once that a window passed its end and waits for runs inside it."""
        for window, waiting in commands.overdue_windows(self.service):
            text = ":hourglass: " + windows.overdue_text(window, waiting)
            self._post(f"window-overdue:{window.id}", Message(text, [
                {"type": "section", "text": {"type": "mrkdwn", "text": text}}]))

    # --- the chat_messages rows -------------------------------------------------------------

    def _claim(self, subject: str) -> bool:
        """The subject's row, ours to post; False when posted already (or by another replica)."""
        return chatrecord.claim(self.service.db, subject, self.channel)

    def _post(self, subject: str, message: Message, thread_ts: str | None = None) -> None:
        """Post once: claim the subject, post, remember the ts (or let go on failure)."""
        if not self._claim(subject):
            return  # posted already (or being posted by another replica)
        try:
            answer = self.client.chat_postMessage(channel=self.channel, text=message.text,
                                                  blocks=message.blocks, thread_ts=thread_ts)
        except Exception:
            chatrecord.let_go(self.service.db, subject)
            raise
        self._set(subject, ts=str(answer["ts"]), rendered=_digest(message))

    def _open_messages(self, pattern: str) -> list[tuple[str, str, str | None]]:
        return chatrecord.unsettled(self.service.db, pattern)

    def _set(self, subject: str, **values: Any) -> None:
        chatrecord.mark(self.service.db, subject, **values)


def _digest(message: Message) -> str:
    return hashlib.sha256(canonical([message.text, message.blocks]).encode()).hexdigest()


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch))


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.rstrip("Z"))
