"""The API's OpenAPI 3.1 document: served at ``/openapi.json`` and kept in ``docs/openapi.json``
(a test fails when the two differ: ``notifier api --print-openapi > docs/openapi.json``)."""

from __future__ import annotations

from typing import Any

from notifier.api.bodies import MAX_IDEMPOTENCY_KEY
from notifier.api.schemas import SCHEMAS
from notifier.api.schemas import ref as _ref

VERSION = "1.0.0"


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref("Error")}}}


def _ok(description: str, schema: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": _ref(schema)}},
    }
    if headers:
        answer["headers"] = headers
    return answer


_RETRY_AFTER = {"Retry-After": {"schema": {"type": "string"}, "description": "seconds"}}
_COMMON = {
    "401": _error("no key, or not a valid one"),
    "429": {**_error("over the key's rate: wait Retry-After seconds"), "headers": _RETRY_AFTER},
    "503": {**_error("the database or Redis did not answer"), "headers": _RETRY_AFTER},
}
_BODY_ERRORS = {
    "400": _error("not JSON, too deep, or a malformed header"),
    "413": _error("the body is over NOTIFIER_API_MAX_BODY_BYTES"),
    "415": _error("not application/json"),
}
_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "At most one row for this key, ever: a repeat with the same body is answered"
    " as the first was (Idempotent-Replayed: true), one with another body is refused (422).",
    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY},
}
_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 1, "maximum": 999_999_999_999_999_999},
}

_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}


_REPLAYED = {"Idempotent-Replayed": {"schema": {"const": "true"}}}

PATHS: dict[str, Any] = {
    "/v1/notifications": {
        "post": {
            "operationId": "createNotification",
            "summary": "Write one notification",
            "parameters": [_IDEMPOTENCY_KEY],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("NewNotification")}},
            },
            "responses": {
                "201": _ok("written, or replayed for a repeated key", "Created", _REPLAYED),
                **_BODY_ERRORS,
                "403": _error("the key may not write this (read-only, channel, category)"),
                "409": {
                    **_error("the key's first request is under way, or the key is in use"),
                    "headers": _RETRY_AFTER,
                },
                "422": _error("not a notification notifier could send, or a reused key"),
                **_COMMON,
            },
        },
        "get": {
            "operationId": "getNotificationByKey",
            "summary": "Read one of the key's notifications by its idempotency key",
            "parameters": [
                {
                    "name": "idempotency_key",
                    "in": "query",
                    "required": True,
                    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
                }
            ],
            "responses": {
                "200": _ok("the notification and its history", "Notification"),
                "400": _error("no or a malformed idempotency_key"),
                "404": _error("this key wrote no such notification"),
                **_COMMON,
            },
        },
    },
    "/v1/notifications/batch": {
        "post": {
            "operationId": "createNotifications",
            "summary": "Write up to NOTIFIER_API_MAX_BATCH notifications, each on its own",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("Batch")}},
            },
            "responses": {
                "200": _ok("each item's result, in order", "BatchResults"),
                **_BODY_ERRORS,
                "403": _error("a read-only key"),
                "422": _error("not a batch"),
                **_COMMON,
            },
        },
    },
    "/v1/notifications/cancel": {
        "post": {
            "operationId": "cancelNotificationByKey",
            "summary": "Cancel one of the key's notifications by its idempotency key",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("CancelByKey")}},
            },
            "responses": {
                "200": _ok("cancelled", "Cancelled"),
                **_BODY_ERRORS,
                "403": _error("a read-only key"),
                "404": _error("this key wrote no such notification"),
                "409": _error("sent, dead or cancelled already"),
                "422": _error("not a cancel request"),
                **_COMMON,
            },
        },
    },
    "/v1/notifications/{id}": {
        "get": {
            "operationId": "getNotification",
            "summary": "Read one of the key's notifications",
            "parameters": [_ID],
            "responses": {
                "200": _ok("the notification and its history", "Notification"),
                "404": _error("this key wrote no such notification"),
                **_COMMON,
            },
        },
    },
    "/v1/notifications/{id}/cancel": {
        "post": {
            "operationId": "cancelNotification",
            "summary": "Cancel one of the key's notifications unless it is final",
            "parameters": [_ID],
            "responses": {
                "200": _ok("cancelled", "Cancelled"),
                "403": _error("a read-only key"),
                "404": _error("this key wrote no such notification"),
                "409": _error("sent, dead or cancelled already"),
                **_COMMON,
            },
        },
    },
    "/v1/profiles/{name}": {
        "get": {
            "operationId": "getProfile",
            "summary": "Read a person's profile and preferences",
            "parameters": [_NAME],
            "responses": {
                "200": _ok("the profile", "Profile"),
                "404": _error("no such profile"),
                **_COMMON,
            },
        },
        "put": {
            "operationId": "putProfile",
            "summary": "Create a profile, or set what is given of it",
            "parameters": [_NAME],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("ProfileUpdate")}},
            },
            "responses": {
                "200": _ok("the profile as stored", "Profile"),
                **_BODY_ERRORS,
                "403": _error("a read-only key"),
                "404": _error("not a profile id"),
                "422": _error("not a profile notifier could store"),
                **_COMMON,
            },
        },
    },
    "/v1/profiles/{name}/preferences": {
        "put": {
            "operationId": "putPreferences",
            "summary": "Set a person's preferences (recorded with source producer)",
            "parameters": [_NAME],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("Preferences")}},
            },
            "responses": {
                "200": _ok("the profile with its preferences", "Profile"),
                **_BODY_ERRORS,
                "403": _error("a read-only key"),
                "404": _error("no such profile"),
                "422": _error("not a list of preferences"),
                **_COMMON,
            },
        }
    },
    "/v1/campaigns/{name}": {
        "get": {
            "operationId": "getCampaign",
            "summary": "A campaign's status and counts",
            "parameters": [_NAME],
            "responses": {
                "200": _ok("the campaign", "Campaign"),
                "404": _error("no such campaign"),
                **_COMMON,
            },
        }
    },
    "/health": {
        "get": {
            "operationId": "health",
            "summary": "The process is alive",
            "security": [],
            "responses": {"200": _ok("alive", "Status")},
        }
    },
    "/ready": {
        "get": {
            "operationId": "ready",
            "summary": "The database and Redis answer",
            "security": [],
            "responses": {
                "200": _ok("ready", "Status"),
                "503": {**_error("not ready"), "headers": _RETRY_AFTER},
            },
        }
    },
}


def document() -> dict[str, Any]:
    """The whole document, as served."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "notifier",
            "version": VERSION,
            "description": "Write, read and cancel notifications over HTTP (docs/api.md).",
        },
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"key": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"key": []}],
        "paths": PATHS,
    }
