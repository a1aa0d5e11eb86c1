"""The API's OpenAPI 3.1 document: served at ``/openapi.json`` and kept in ``docs/openapi.json``
(a test fails when the two differ: ``notifier api --print-openapi > docs/openapi.json``)."""

from __future__ import annotations

from typing import Any

from notifier.api.bodies import MAX_IDEMPOTENCY_KEY

VERSION = "1.0.0"

_TEXT = {"type": ["string", "null"]}
_TIME = {"type": ["string", "null"], "format": "date-time"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


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

SCHEMAS: dict[str, Any] = {
    "NewNotification": {
        "type": "object",
        "additionalProperties": False,
        "required": ["channel"],
        "description": "A row of the producer contract (README). Give `to`, or `profile`.",
        "properties": {
            "channel": {"type": "string", "examples": ["email"]},
            "to": {**_TEXT, "description": "the address, URL, phone number or token"},
            "profile": {**_TEXT, "description": "your id for the person (docs/people.md)"},
            "subject": _TEXT,
            "body": _TEXT,
            "payload": {"type": ["object", "null"]},
            "template": _TEXT,
            "locale": _TEXT,
            "category": _TEXT,
            "guard": _TEXT,
            "send_at": _TIME,
            "delay_seconds": {"type": ["number", "null"], "minimum": 0},
            "expires_at": _TIME,
            "max_attempts": {"type": ["integer", "null"], "minimum": 1, "maximum": 100},
            "priority": {"type": ["integer", "null"], "minimum": -1000, "maximum": 1000},
        },
    },
    "BatchItem": {
        "allOf": [_ref("NewNotification")],
        "properties": {
            "idempotency_key": {"type": ["string", "null"], "maxLength": MAX_IDEMPOTENCY_KEY}
        },
    },
    "Batch": {
        "type": "object",
        "additionalProperties": False,
        "required": ["notifications"],
        "properties": {
            "notifications": {
                "type": "array",
                "minItems": 1,
                "description": "Each item a BatchItem, checked on its own: one that is not (or"
                " that notifier could not send) is refused in its result, the others written.",
                "items": {},
            }
        },
    },
    "Created": {
        "type": "object",
        "required": ["id", "idempotency_key", "replayed"],
        "properties": {
            "id": {"type": "integer"},
            "idempotency_key": _TEXT,
            "replayed": {"type": "boolean"},
        },
    },
    "BatchResults": {
        "type": "object",
        "required": ["results"],
        "properties": {
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", "status"],
                    "properties": {
                        "index": {"type": "integer"},
                        "status": {"enum": ["created", "replayed", "refused"]},
                        "id": {"type": "integer"},
                        "idempotency_key": _TEXT,
                        "replayed": {"type": "boolean"},
                        "error": _ref("ErrorDetail"),
                    },
                },
            }
        },
    },
    "Notification": {
        "type": "object",
        "required": ["id", "channel", "status", "attempts", "history"],
        "properties": {
            "id": {"type": "integer"},
            "channel": {"type": "string"},
            "profile": _TEXT,
            "category": _TEXT,
            "status": {"enum": ["pending", "processing", "sent", "dead", "cancelled"]},
            "attempts": {"type": "integer"},
            "max_attempts": {"type": "integer"},
            "idempotency_key": _TEXT,
            "next_attempt_at": _TIME,
            "created_at": _TIME,
            "updated_at": _TIME,
            "sent_at": _TIME,
            "last_error": _TEXT,
            "provider": _TEXT,
            "delivery_status": _TEXT,
            "delivery_at": _TIME,
            "campaign_id": {"type": ["integer", "null"]},
            "parent_id": {"type": ["integer", "null"]},
            "history": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "attempt": {"type": "integer"},
                        "at": _TIME,
                        "outcome": {"type": "string"},
                        "error": _TEXT,
                        "provider": _TEXT,
                        "duration_ms": {"type": ["integer", "null"]},
                    },
                },
            },
        },
    },
    "Cancelled": {
        "type": "object",
        "required": ["id", "status"],
        "properties": {"id": {"type": "integer"}, "status": {"const": "cancelled"}},
    },
    "CancelByKey": {
        "type": "object",
        "additionalProperties": False,
        "required": ["idempotency_key"],
        "properties": {
            "idempotency_key": {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY}
        },
    },
    "ErrorDetail": {
        "type": "object",
        "required": ["code", "message", "field"],
        "properties": {
            "code": {"type": "string", "examples": ["invalid_field"]},
            "message": {"type": "string"},
            "field": _TEXT,
        },
    },
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": _ref("ErrorDetail")},
    },
    "Status": {"type": "object", "properties": {"status": {"type": "string"}}},
}

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
