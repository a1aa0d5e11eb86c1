"""Whatever JSON a producer sends, reading it as a notification either gives enqueue's
arguments or refuses it with an ``ApiError`` naming a field: nothing else escapes."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notifier.api import bodies
from notifier.api.bodies import ApiError
from notifier.delivery.checks import payload_depth

NOW = datetime(2026, 12, 2, tzinfo=UTC)

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
documents = (
    st.dictionaries(
        st.sampled_from(sorted(bodies.FIELDS)) | st.text(max_size=12), values, max_size=8
    )
    | values
)


@settings(max_examples=500)
@given(documents)
def test_any_document_is_read_or_refused_by_field(doc: object) -> None:
    try:
        found = bodies.notification(doc, now=NOW)
    except ApiError as exc:
        refused: ApiError | None = exc
    else:
        refused = None
    if refused is not None:
        assert 400 <= refused.status < 500
        assert refused.code
        assert refused.field is None or isinstance(refused.field, str)
        return
    assert isinstance(found["channel"], str)
    assert found["channel"]
    assert set(found) <= bodies.FIELDS - {"delay_seconds", "idempotency_key"}
    assert 1 <= found["max_attempts"] <= 100


@settings(max_examples=300)
@given(st.binary(max_size=200) | documents.map(lambda d: json.dumps(d).encode()))
def test_any_body_is_json_or_a_400(body: bytes) -> None:
    try:
        bodies.read_json(body)
    except ApiError as exc:
        status = exc.status
    else:
        status = 400
    assert status == 400


def test_a_request_hash_does_not_depend_on_spelling() -> None:
    a = json.loads('{"b": 1, "a": [1, 2], "c": {"y": 1, "x": 2}}')
    b = json.loads('{"c": {"x": 2, "y": 1}, "a": [1, 2], "b": 1}')
    assert bodies.request_hash(a) == bodies.request_hash(b)
    assert bodies.request_hash(a) != bodies.request_hash({**a, "b": 2})


def test_a_request_hash_is_the_one_stored_hashes_were_made_with() -> None:
    # api_requests keeps these hashes for good: a replay after an upgrade must match them.
    doc = {"to": "ü@example.com", "channel": "email", "payload": {"n": 1.5, "b": [True, None]}}
    canonical = '{"channel":"email","payload":{"b":[true,null],"n":1.5},"to":"ü@example.com"}'
    assert bodies.request_hash(doc) == hashlib.sha256(canonical.encode()).digest()


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_the_canonical_spelling_is_json_dumps_own(doc: object) -> None:
    # The encoder made once must spell every parsed body as json.dumps with the same arguments
    # does: stored hashes were made with it.
    dumped = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert bodies.canonical(doc) == dumped
    assert bodies.request_hash(doc) == hashlib.sha256(dumped.encode()).digest()


#: Values whose strings are made of what shapes JSON: quotes, backslashes, brackets.
shapes = st.recursive(
    st.text(alphabet='"\\[]{}/né', max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='"\\]}', max_size=4), inner)
    ),
    max_leaves=12,
)


@settings(max_examples=1000)
@given(values | shapes)
def test_the_nesting_count_is_the_depth(doc: object) -> None:
    for text in (json.dumps(doc, ensure_ascii=False), json.dumps(doc, indent=1)):
        assert bodies._nesting(text.encode()) == payload_depth(doc)


def test_brackets_in_strings_neither_hide_levels_nor_add_them() -> None:
    deep = bodies.MAX_JSON_DEPTH + 1
    hidden = '{"body": "' + "]" * deep + '", "payload": ' + "[" * deep + "]" * deep + "}"
    with pytest.raises(ApiError) as refused:
        bodies.read_json(hidden.encode())
    assert refused.value.code == "too_deep"
    shallow = {"body": "[" * 500 + '{"\\"', "subject": "\\" * 3 + '"]'}
    assert bodies.read_json(json.dumps(shallow).encode()) == shallow
