"""The Slack fake's file uploads with slack_sdk's own files_upload_v2 (getUploadURLExternal, the
POST to the upload URL the fake serves, completeUploadExternal into a thread), and Slack's
errors. Runs its own fake on a free port: no lab needed."""
from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from tests.lab.fixture import REPO

BOT_TOKEN = "xoxb-files-test-0123456789"
CHANNEL = "C0RUNBOOK"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = (tmp_path / "slack.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "slackapi", "--port", str(port), "--bot-token", BOT_TOKEN,
         "--app-token", "xapp-files-test-0123456789"],
        cwd=REPO / "deploy" / "lab", stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(f"{url}/_lab/health", timeout=1).read()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, \
                    (tmp_path / "slack.log").read_text()
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def lab_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return bytes(answer.read())


def test_files_upload_v2_lands_in_the_thread_with_its_bytes(fake: str) -> None:
    client = WebClient(token=BOT_TOKEN, base_url=f"{fake}/api/", timeout=5)
    root = client.chat_postMessage(channel=CHANNEL, text="execution 7")["ts"]
    answer = client.files_upload_v2(channel=CHANNEL, thread_ts=root, content=PNG,
                                    filename="fairshare-review-7.png", title="the chart")
    shared = answer["file"]
    assert shared["name"] == "fairshare-review-7.png" and shared["mimetype"] == "image/png"
    assert shared["title"] == "the chart" and shared["size"] == len(PNG)
    assert shared["shares"] == {"public": {CHANNEL: [{"ts": root}]}}
    files = json.loads(lab_get(f"{fake}/_lab/files"))
    assert [(f["id"], f["channel"], f["thread_ts"], f["completed"]) for f in files] == [
        (shared["id"], CHANNEL, root, True)]
    assert files[0]["sha256"] == hashlib.sha256(PNG).hexdigest()
    assert lab_get(f"{fake}/_lab/files/content?id={shared['id']}") == PNG
    methods = [c["method"] for c in json.loads(lab_get(f"{fake}/_lab/calls"))]
    assert methods == ["chat.postMessage", "files.getUploadURLExternal",
                       "files.completeUploadExternal"]


def test_slacks_errors(fake: str) -> None:
    client = WebClient(token=BOT_TOKEN, base_url=f"{fake}/api/", timeout=5)

    def error(call: object) -> str:
        with pytest.raises(SlackApiError) as caught:
            call()  # type: ignore[operator]
        return str(caught.value.response["error"])

    assert error(lambda: client.api_call("files.getUploadURLExternal",
                                         params={"filename": "a.png"})) == "invalid_arguments"
    pending = client.files_getUploadURLExternal(filename="a.png", length=3)
    # not uploaded yet: nothing to complete
    assert error(lambda: client.files_completeUploadExternal(
        files=[{"id": pending["file_id"]}], channel_id=CHANNEL)) == "file_not_found"
    assert error(lambda: client.files_completeUploadExternal(
        files=[{"id": "FNOSUCH"}], channel_id=CHANNEL)) == "file_not_found"
    request = urllib.request.Request(pending["upload_url"], data=b"abc", method="POST")
    assert pending["upload_url"].startswith(f"{fake}/upload/v1/")  # served by the fake
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.read() == b"OK - 3"
    assert error(lambda: client.files_completeUploadExternal(
        files=[{"id": pending["file_id"]}], channel_id="CNOSUCH")) == "channel_not_found"
    assert error(lambda: client.files_completeUploadExternal(
        files=[{"id": pending["file_id"]}], channel_id=CHANNEL,
        thread_ts="1.000001")) == "invalid_thread_ts"
    client.files_completeUploadExternal(files=[{"id": pending["file_id"]}], channel_id=CHANNEL)
    assert error(lambda: client.files_completeUploadExternal(
        files=[{"id": pending["file_id"]}], channel_id=CHANNEL)) == "file_not_found"  # twice
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(urllib.request.Request(f"{fake}/upload/v1/nosuchkey",
                                                      data=b"x", method="POST"), timeout=5)
    assert missing.value.code == 404
    missing.value.close()
