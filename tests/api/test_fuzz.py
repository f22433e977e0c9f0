"""No client input produces a 5xx: every operation in the OpenAPI schema is fuzzed."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atroposlib.api import ApiSettings, create_app
from tests.conftest import group, registration

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)

FIELD_VALUES = st.one_of(
    json_values, st.just([[1, 2]]), st.just([[]]), st.just([]), st.just(-1), st.just(2**64), st.just("x"),
)


def _operations() -> list[tuple[str, str]]:
    schema = create_app(ApiSettings(ephemeral=True)).openapi()
    return [(method.upper(), path) for path, ops in schema["paths"].items() for method in ops]


OPERATIONS = _operations()


@pytest.fixture(scope="module")
def fuzz_client() -> Any:
    with TestClient(create_app(ApiSettings(ephemeral=True, starvation_grace=0)), raise_server_exceptions=False) as client:
        client.post("/register", json=registration(8))
        client.get("/batch")
        client.post("/register-env", json={"max_token_length": 64, "desired_name": "f", "weight": 1, "group_size": 2})
        yield client


def _fill_path(path: str, value: str) -> str:
    return re.sub(r"\{[^}]+\}", value, path)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    operation=st.sampled_from(OPERATIONS),
    body=json_values,
    path_value=st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="/?#%\\"), min_size=1, max_size=10),
    query=st.dictionaries(st.sampled_from(["env_id", "since", "limit", "replace"]), st.text(max_size=6), max_size=2),
    gzipped=st.booleans(),
)
def test_arbitrary_json_never_5xx(fuzz_client: TestClient, operation: tuple[str, str], body: Any,
                                  path_value: str, query: dict[str, str], gzipped: bool) -> None:
    method, path = operation
    if path in ("/reset_data", "/reset"):
        return  # resetting is valid input; it would only make the rest of the run less interesting
    headers = {"Content-Type": "application/json"}
    content = json.dumps(body).encode()
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    response = fuzz_client.request(method, _fill_path(path, path_value), content=content, params=query, headers=headers)
    assert response.status_code < 500, (method, path, body, response.text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    endpoint=st.sampled_from(["/scored_data", "/scored_data_list"]),
    field=st.sampled_from(["tokens", "masks", "scores", "advantages", "messages", "env_id", "overrides",
                           "inference_logprobs", "distill_token_ids", "group_overrides", "submission_id"]),
    value=FIELD_VALUES,
)
def test_mutated_groups_never_5xx(fuzz_client: TestClient, endpoint: str, field: str, value: Any) -> None:
    body: Any = group(2, env_id=0)
    body[field] = value
    if endpoint == "/scored_data_list":
        body = [group(2, env_id=0), body]
    response = fuzz_client.post(endpoint, content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert response.status_code < 500, (field, value, response.text)
    assert fuzz_client.get("/batch").status_code == 200
    assert fuzz_client.get("/health").status_code == 200


@pytest.mark.parametrize("raw", [b"", b"{", b"\xff\xfe", b"null", b"[]", b'{"env_id": 1e400}', b"NaN"])
def test_malformed_bodies_are_4xx(fuzz_client: TestClient, raw: bytes) -> None:
    for method, path in OPERATIONS:
        if path in ("/reset_data", "/reset"):
            continue
        response = fuzz_client.request(method, _fill_path(path, "b-1"), content=raw)
        assert response.status_code < 500, (method, path, raw, response.text)
