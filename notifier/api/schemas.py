"""The schemas of the API's OpenAPI document (``openapi.py``): the bodies it takes and gives."""

from __future__ import annotations

from typing import Any

from notifier.api.bodies import MAX_IDEMPOTENCY_KEY

TEXT = {"type": ["string", "null"]}
TIME = {"type": ["string", "null"], "format": "date-time"}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


SCHEMAS: dict[str, Any] = {
    "NewNotification": {
        "type": "object",
        "additionalProperties": False,
        "required": ["channel"],
        "description": "A row of the producer contract (README). Give `to`, or `profile`.",
        "properties": {
            "channel": {"type": "string", "examples": ["email"]},
            "to": {**TEXT, "description": "the address, URL, phone number or token"},
            "profile": {**TEXT, "description": "your id for the person (docs/people.md)"},
            "subject": TEXT,
            "body": TEXT,
            "payload": {"type": ["object", "null"]},
            "template": TEXT,
            "locale": TEXT,
            "category": TEXT,
            "guard": TEXT,
            "send_at": TIME,
            "delay_seconds": {"type": ["number", "null"], "minimum": 0},
            "expires_at": TIME,
            "max_attempts": {"type": ["integer", "null"], "minimum": 1, "maximum": 100},
            "priority": {"type": ["integer", "null"], "minimum": -1000, "maximum": 1000},
        },
    },
    "BatchItem": {
        "allOf": [ref("NewNotification")],
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
            "idempotency_key": TEXT,
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
                        "idempotency_key": TEXT,
                        "replayed": {"type": "boolean"},
                        "error": ref("ErrorDetail"),
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
            "profile": TEXT,
            "category": TEXT,
            "status": {"enum": ["pending", "processing", "sent", "dead", "cancelled"]},
            "attempts": {"type": "integer"},
            "max_attempts": {"type": "integer"},
            "idempotency_key": TEXT,
            "next_attempt_at": TIME,
            "created_at": TIME,
            "updated_at": TIME,
            "sent_at": TIME,
            "last_error": TEXT,
            "provider": TEXT,
            "delivery_status": TEXT,
            "delivery_at": TIME,
            "campaign_id": {"type": ["integer", "null"]},
            "parent_id": {"type": ["integer", "null"]},
            "history": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "attempt": {"type": "integer"},
                        "at": TIME,
                        "outcome": {"type": "string"},
                        "error": TEXT,
                        "provider": TEXT,
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
            "field": TEXT,
        },
    },
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": ref("ErrorDetail")},
    },
    "Status": {"type": "object", "properties": {"status": {"type": "string"}}},
    "ProfileUpdate": {
        "type": "object",
        "additionalProperties": False,
        "description": "What is given is set, the rest kept (docs/people.md).",
        "properties": {
            "email": TEXT,
            "phone": TEXT,
            "push_tokens": {"type": ["array", "null"], "items": {"type": "string"}},
            "locale": TEXT,
            "time_zone": TEXT,
            "fields": {"type": ["object", "null"]},
            "quiet_hours": {**TEXT, "examples": ["22:00-07:00"]},
        },
    },
    "Profile": {
        "type": "object",
        "required": ["id", "preferences"],
        "properties": {
            "id": {"type": "string"},
            "email": TEXT,
            "phone": TEXT,
            "push_tokens": {"type": "array", "items": {"type": "string"}},
            "locale": TEXT,
            "time_zone": TEXT,
            "fields": {"type": "object"},
            "quiet_start": TEXT,
            "quiet_end": TEXT,
            "created_at": TIME,
            "updated_at": TIME,
            "preferences": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "category": {"type": "string"},
                        "channel": {"type": "string"},
                        "enabled": {"type": "boolean"},
                        "source": {"type": "string"},
                        "at": TIME,
                    },
                },
            },
        },
    },
    "Preferences": {
        "type": "object",
        "additionalProperties": False,
        "required": ["preferences"],
        "properties": {
            "preferences": {
                "type": "array",
                "minItems": 1,
                "maxItems": 200,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["category", "channel", "enabled"],
                    "properties": {
                        "category": {"type": "string"},
                        "channel": {"type": "string"},
                        "enabled": {"type": "boolean"},
                    },
                },
            }
        },
    },
    "Campaign": {
        "type": "object",
        "required": ["name", "status"],
        "properties": {
            "name": {"type": "string"},
            "status": {"type": "string"},
            "channel": {"type": "string"},
            "category": {"type": "string"},
            "audience": {"type": "string"},
            "recipients": {"type": "integer"},
            "notifications": {"type": "integer"},
            "by_status": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
    },
}
