"""Errors as the real API server sends them: `Status` objects with reason and code."""
from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


class ApiError(Exception):
    """An error answered as a metav1.Status body with the same HTTP code."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def body(self) -> Obj:
        return status_body("Failure", self.code, self.message, self.reason, self.details)


def status_body(status: str, code: int, message: str = "", reason: str = "",
                details: Obj | None = None) -> Obj:
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": status}
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def _details(name: str, group: str, resource: str) -> Obj:
    details: Obj = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = resource
    return details


def qualified(group: str, resource: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(group: str, resource: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{qualified(group, resource)} "{name}" not found',
                    _details(name, group, resource))


def already_exists(group: str, resource: str, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{qualified(group, resource)} "{name}" already exists',
                    _details(name, group, resource))


def conflict(group: str, resource: str, name: str) -> ApiError:
    return ApiError(
        409, "Conflict",
        f'Operation cannot be fulfilled on {qualified(group, resource)} "{name}": the object has '
        "been modified; please apply your changes to the latest version and try again",
        _details(name, group, resource))


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 Invalid; causes are (field, reason type, message) like field.ErrorList."""
    text = ", ".join(f"{f}: {m}" for f, _, m in causes)
    gk = f"{kind}.{group}" if group else kind
    details = {"name": name, **({"group": group} if group else {}), "kind": kind,
               "causes": [{"reason": r, "message": m, "field": f} for f, r, m in causes]}
    return ApiError(422, "Invalid", f'{gk} "{name}" is invalid: {text}', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed(verb: str, group: str, resource: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                    {"group": group, "kind": resource} if group else {"kind": resource})


def unsupported_media(accepted: list[str]) -> ApiError:
    return ApiError(415, "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types "
                    "include: " + ", ".join(accepted))


def internal(message: str) -> ApiError:
    return ApiError(500, "InternalError",
                    f"Internal error occurred: {message}",
                    {"causes": [{"message": message}]})
