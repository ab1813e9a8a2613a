"""File uploads as slack_sdk's files_upload_v2 makes them: files.getUploadURLExternal (an upload
URL this server serves), a POST of the bytes there, files.completeUploadExternal (shared into
a channel or thread). The journal keeps every file, its bytes and where it was shared."""
from __future__ import annotations

import base64
import hashlib
import json
import secrets
from typing import TYPE_CHECKING, Any

from .methods import METHODS, ApiError, Call, required, resolve, text_arg
from .plumbing import BadRequest
from .workspace import BOT_USER

if TYPE_CHECKING:
    from .server import Handler

Obj = dict[str, Any]
UPLOAD_PATH = "/upload/v1/"
MAX_BYTES = 1 << 30  # Slack's limit: 1 GB per file


def get_upload_url_external(call: Call) -> Obj:
    required(call.args, "filename", "length")
    filename = text_arg(call.args, "filename")
    try:
        length = int(str(call.args["length"]))
    except ValueError:
        raise ApiError("invalid_arguments", ["[ERROR] length must be an integer"]) from None
    if not filename or not 0 < length <= MAX_BYTES:
        raise ApiError("invalid_arguments", ["[ERROR] filename and a positive length are "
                                             "required"])
    file_id = "F" + secrets.token_hex(5).upper()
    key = secrets.token_urlsafe(18)
    with call.journal.lock:
        call.journal.files[file_id] = {
            "id": file_id, "name": filename, "length": length, "key": key,
            "alt_txt": call.args.get("alt_txt"), "uploaded": False, "content": "",
            "completed": False, "title": None, "channel": None, "thread_ts": None}
    return {"ok": True, "upload_url": f"http://{call.host}{UPLOAD_PATH}{key}",
            "file_id": file_id}


def upload(req: Handler, key: str) -> None:
    """POST of the bytes to an upload URL: 200 "OK - LENGTH", as files.slack.com answers."""
    data = req.read_body()
    journal = req.server.journal
    with journal.lock:
        entry = next((f for f in journal.files.values() if f["key"] == key), None)
        if entry is None or req.command != "POST":
            raise BadRequest(404, "no such upload URL")
        if entry["completed"]:
            raise BadRequest(400, "the upload was already completed")
        entry.update(uploaded=True, content=base64.b64encode(data).decode(),
                     size=len(data), sha256=hashlib.sha256(data).hexdigest())
    req.server.touch()
    req.send_text(200, f"OK - {len(data)}")


def complete_upload_external(call: Call) -> Obj:
    required(call.args, "files")
    try:
        wanted = json.loads(text_arg(call.args, "files"))
    except ValueError:
        raise ApiError("invalid_arguments", ["[ERROR] files must be a JSON array"]) from None
    if not isinstance(wanted, list) or not wanted or not all(
            isinstance(f, dict) and f.get("id") for f in wanted):
        raise ApiError("invalid_arguments", ["[ERROR] files must name each file's id"])
    cid = resolve(call, names=False, users=False, arg="channel_id") \
        if call.args.get("channel_id") else None
    thread_ts = text_arg(call.args, "thread_ts") or None
    if cid is not None and BOT_USER not in call.ws.members(cid):
        raise ApiError("not_in_channel")
    if thread_ts and (cid is None or call.ws.find(cid, thread_ts) is None):
        raise ApiError("invalid_thread_ts")
    with call.journal.lock:
        entries = [call.journal.files.get(str(f["id"])) for f in wanted]
        if any(e is None or not e["uploaded"] or e["completed"] for e in entries):
            raise ApiError("file_not_found")
        shared = []
        for entry, asked in zip(entries, wanted, strict=True):
            assert entry is not None
            entry.update(completed=True, title=asked.get("title") or entry["name"],
                         channel=cid, thread_ts=thread_ts,
                         initial_comment=call.args.get("initial_comment"))
            shared.append(file_object(entry))
    return {"ok": True, "files": shared}


def file_object(entry: Obj) -> Obj:
    name = str(entry["name"])
    shares = {"public": {entry["channel"]: [{"ts": entry["thread_ts"] or ""}]}} \
        if entry.get("channel") else {}
    return {"id": entry["id"], "name": name, "title": entry.get("title") or name,
            "mimetype": "image/png" if name.endswith(".png") else "application/octet-stream",
            "filetype": name.rsplit(".", 1)[-1] if "." in name else "binary",
            "size": entry.get("size", 0), "user": BOT_USER, "shares": shares,
            "channels": [entry["channel"]] if entry.get("channel") else []}


# Registered here (this module imports methods, not the other way round).
METHODS.update({
    "files.getUploadURLExternal": (get_upload_url_external, frozenset({"bot"})),
    "files.completeUploadExternal": (complete_upload_external, frozenset({"bot"})),
})


# --- /_lab/ views: what tests read ------------------------------------------------------------

def list_files(req: Handler, query: dict[str, str]) -> None:
    with req.server.journal.lock:
        files = [{k: v for k, v in f.items() if k not in ("content", "key")}
                 for f in req.server.journal.files.values()]
    req.send_json(200, files)


def file_content(req: Handler, query: dict[str, str]) -> None:
    with req.server.journal.lock:
        entry = req.server.journal.files.get(query.get("id", ""))
        data = base64.b64decode(entry["content"]) if entry and entry["uploaded"] else None
    if data is None:
        raise BadRequest(404, f"no uploaded file {query.get('id')!r}")
    req.send_body(200, data, "application/octet-stream")
