"""Block Kit checks for posted messages: the limits Slack enforces that a bot can trip over.

Slack answers `invalid_blocks_format` when `blocks` is not a JSON array and `invalid_blocks`
with `response_metadata.messages` such as
`[ERROR] must be less than 3001 characters [json-pointer:/blocks/1/text/text]` when a block
breaks the schema. Checked here: at most 50 blocks; every block an object with a known `type`;
block_id at most 255 characters and unique; section text (3000) and fields (at most 10, 2000
each); header plain_text (150); context (1..10 elements); actions (1..25 elements); buttons
(plain_text text 75, action_id 255 and unique within the block, value 2000, url 3000, style
primary|danger). Slack also adds a `block_id` to blocks without one and `"emoji": true` to
plain_text objects; so does this.
"""
from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

MAX_BLOCKS = 50
BLOCK_TYPES = {"section", "divider", "header", "context", "actions", "image", "input",
               "rich_text", "markdown", "file", "video", "context_actions", "table"}
ELEMENT_TYPES = {"button", "checkboxes", "datepicker", "datetimepicker", "image",
                 "multi_static_select", "multi_external_select", "multi_users_select",
                 "multi_conversations_select", "multi_channels_select", "overflow",
                 "radio_buttons", "static_select", "external_select", "users_select",
                 "conversations_select", "channels_select", "timepicker", "workflow_button",
                 "rich_text_input", "plain_text_input", "email_text_input", "number_input",
                 "url_text_input", "file_input", "feedback_buttons", "icon_button"}
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="


class NotJson(Exception):
    """A JSON argument that does not parse."""


def json_arg(value: Any) -> Any:
    """blocks/attachments/metadata: a JSON string in forms, already parsed in JSON bodies."""
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            return json.loads(value)
        except ValueError:
            raise NotJson(value) from None
    return value


def _block_id(seed: str, index: int) -> str:
    digest = hashlib.sha256(f"{seed}/{index}".encode()).digest()
    return "".join(B64[b % 64] for b in digest[:5])


def _too_long(limit: int, ptr: str) -> str:
    return f"[ERROR] must be less than {limit + 1} characters [json-pointer:{ptr}]"


def _missing(field: str, ptr: str) -> str:
    return f"[ERROR] missing required field: {field} [json-pointer:{ptr}]"


def _text(obj: Any, ptr: str, limit: int, errors: list[str], plain_only: bool = False) -> None:
    if not isinstance(obj, dict):
        errors.append(f"[ERROR] expected object [json-pointer:{ptr}]")
        return
    allowed = ("plain_text",) if plain_only else ("plain_text", "mrkdwn")
    if obj.get("type") not in allowed:
        errors.append(f"[ERROR] must be a valid enum value [json-pointer:{ptr}/type]")
    text = obj.get("text")
    if not isinstance(text, str):
        errors.append(_missing("text", ptr))
    elif not text:
        errors.append(f"[ERROR] must be more than 0 characters [json-pointer:{ptr}/text]")
    elif len(text) > limit:
        errors.append(_too_long(limit, f"{ptr}/text"))
    if obj.get("type") == "plain_text":
        obj.setdefault("emoji", True)


def _element(el: Any, ptr: str, errors: list[str], action_ids: set[str]) -> None:
    if not isinstance(el, dict) or el.get("type") not in ELEMENT_TYPES:
        errors.append(f"[ERROR] failed to match all allowed schemas [json-pointer:{ptr}]")
        return
    action_id = el.get("action_id")
    if isinstance(action_id, str):
        if len(action_id) > 255:
            errors.append(_too_long(255, f"{ptr}/action_id"))
        if action_id in action_ids:
            errors.append(f"[ERROR] action_id must be unique within the block: {action_id} "
                          f"[json-pointer:{ptr}/action_id]")
        action_ids.add(action_id)
    if el["type"] != "button":
        return
    if "text" not in el:
        errors.append(_missing("text", ptr))
    else:
        _text(el["text"], f"{ptr}/text", 75, errors, plain_only=True)
    value = el.get("value")
    if value is not None and (not isinstance(value, str) or len(value) > 2000):
        errors.append(_too_long(2000, f"{ptr}/value"))
    url = el.get("url")
    if url is not None and (not isinstance(url, str) or len(url) > 3000):
        errors.append(_too_long(3000, f"{ptr}/url"))
    if el.get("style") not in (None, "primary", "danger"):
        errors.append(f"[ERROR] must be a valid enum value [json-pointer:{ptr}/style]")


def _block(block: Any, ptr: str, errors: list[str]) -> None:
    kind = block.get("type")
    if kind == "section":
        if "text" not in block and "fields" not in block:
            errors.append(f"[ERROR] must provide either text or fields [json-pointer:{ptr}]")
        if "text" in block:
            _text(block["text"], f"{ptr}/text", 3000, errors)
        fields = block.get("fields")
        if fields is not None:
            if not isinstance(fields, list) or len(fields) > 10:
                errors.append(f"[ERROR] no more than 10 items allowed [json-pointer:{ptr}/fields]")
            else:
                for i, field in enumerate(fields):
                    _text(field, f"{ptr}/fields/{i}", 2000, errors)
        if "accessory" in block:
            _element(block["accessory"], f"{ptr}/accessory", errors, set())
    elif kind == "header":
        _text(block.get("text"), f"{ptr}/text", 150, errors, plain_only=True)
    elif kind == "context":
        elements = block.get("elements")
        if not isinstance(elements, list) or not 1 <= len(elements) <= 10:
            errors.append(f"[ERROR] must have 1 to 10 items [json-pointer:{ptr}/elements]")
        else:
            for i, el in enumerate(elements):
                if isinstance(el, dict) and el.get("type") in ("plain_text", "mrkdwn"):
                    _text(el, f"{ptr}/elements/{i}", 3000, errors)
    elif kind == "actions":
        elements = block.get("elements")
        if not isinstance(elements, list) or not 1 <= len(elements) <= 25:
            errors.append(f"[ERROR] must have 1 to 25 items [json-pointer:{ptr}/elements]")
        else:
            ids: set[str] = set()
            for i, el in enumerate(elements):
                _element(el, f"{ptr}/elements/{i}", errors, ids)


def check_blocks(value: Any, seed: str) -> tuple[list[Any], list[str]]:
    """(normalised blocks, error messages). `seed` makes generated block_ids stable."""
    if not isinstance(value, list):
        raise NotJson(value)
    blocks = copy.deepcopy(value)
    errors: list[str] = []
    if len(blocks) > MAX_BLOCKS:
        errors.append(f"[ERROR] no more than {MAX_BLOCKS} items allowed [json-pointer:/blocks]")
    seen: set[str] = set()
    for i, block in enumerate(blocks):
        ptr = f"/blocks/{i}"
        if not isinstance(block, dict):
            errors.append(f"[ERROR] expected object [json-pointer:{ptr}]")
            continue
        if block.get("type") not in BLOCK_TYPES:
            errors.append(f"[ERROR] failed to match all allowed schemas [json-pointer:{ptr}]")
            continue
        block_id = block.get("block_id")
        if block_id is None:
            block["block_id"] = _block_id(seed, i)
        elif not isinstance(block_id, str) or not 0 < len(block_id) <= 255:
            errors.append(_too_long(255, f"{ptr}/block_id"))
        elif block_id in seen:
            errors.append(f"[ERROR] duplicate block_id: {block_id} [json-pointer:{ptr}/block_id]")
        seen.add(str(block["block_id"]))
        _block(block, ptr, errors)
    return blocks, errors


def buttons(blocks: list[Any]) -> list[dict[str, Any]]:
    """Every button of a message: {block_id, action_id, value, text, style, url}."""
    found = []
    for block in blocks or []:
        if not isinstance(block, dict):
            continue
        elements = list(block.get("elements") or []) if block.get("type") == "actions" else []
        if isinstance(block.get("accessory"), dict):
            elements.append(block["accessory"])
        for el in elements:
            if isinstance(el, dict) and el.get("type") == "button":
                text = el.get("text") or {}
                found.append({"block_id": block.get("block_id"), "action_id": el.get("action_id"),
                              "value": el.get("value"), "text": text.get("text", ""),
                              "style": el.get("style"), "url": el.get("url")})
    return found
