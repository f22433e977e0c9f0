"""The OpenAPI document says what the server does: status codes, content types, auth,
the group schema of each validation level; methods and offline docs."""

from __future__ import annotations

import re
from typing import Any, Callable

import pytest
from fastapi.testclient import TestClient

from atroposlib.wire import TOKEN_ID_LIMIT

BODY_OPERATIONS = [
    ("post", "/scored_data"), ("post", "/scored_data_list"), ("post", "/register"), ("post", "/register-env"),
    ("post", "/disconnect-env"), ("post", "/heartbeat-env"), ("get", "/status-env"), ("post", "/status-env"),
    ("post", "/batch"),
]


def codes(schema: dict[str, Any], method: str, path: str) -> set[str]:
    return set(schema["paths"][path][method]["responses"])


def test_every_status_code_the_server_returns_is_documented(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    for method, path in BODY_OPERATIONS:
        assert {"400", "413", "422", "503"} <= codes(schema, method, path), (method, path)
    assert {"404", "409"} <= codes(schema, "post", "/scored_data") & codes(schema, "post", "/scored_data_list")
    assert {"404", "409"} <= codes(schema, "get", "/status-env") & codes(schema, "post", "/status-env")
    assert "404" in codes(schema, "post", "/heartbeat-env")
    assert "409" in codes(schema, "post", "/batch")
    assert {"404", "410"} <= codes(schema, "post", "/batch/{batch_id}/ack")
    assert {"404", "409"} <= codes(schema, "post", "/batch/{batch_id}/nack")
    assert "422" in codes(schema, "get", "/batches/served")
    assert {"400", "413"} <= codes(schema, "get", "/info")  # any request may carry a (gzip) body
    assert client.request("GET", "/info", content=b"junk", headers={"Content-Encoding": "gzip"}).status_code == 400
    assert "401" not in codes(schema, "post", "/scored_data") and "415" not in codes(schema, "post", "/scored_data")
    error = schema["paths"]["/heartbeat-env"]["post"]["responses"]["404"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/ErrorResponse"}


def test_plain_text_endpoints_document_their_content_type(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    for path in ("/metrics", "/reset_data"):
        assert list(schema["paths"][path]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    assert client.get("/metrics").headers["content-type"].startswith("text/plain")
    assert client.get("/reset_data").headers["content-type"].startswith("text/plain")


def test_api_key_documents_bearer_auth_and_401(make_client: Callable[..., TestClient]) -> None:
    client = make_client(api_key="k")
    response = client.get("/openapi.json")
    assert response.status_code == 200  # documentation needs no key
    schema = response.json()
    assert schema["components"]["securitySchemes"]["bearerAuth"] == {"type": "http", "scheme": "bearer"}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            public = (method, path) in {("get", "/"), ("get", "/health")}
            assert ("401" in operation["responses"]) is not public, (method, path)
            assert ("security" in operation) is not public, (method, path)


def test_settings_dependent_codes(make_client: Callable[..., TestClient]) -> None:
    strict = make_client(validation="strict").get("/openapi.json").json()
    for method, path in BODY_OPERATIONS:
        assert "415" in codes(strict, method, path), (method, path)
    assert "415" not in codes(strict, "get", "/status")
    disabled = make_client(disable_get_reset=True)
    assert "405" in codes(disabled.get("/openapi.json").json(), "get", "/reset_data")
    refused = disabled.get("/reset_data")
    assert refused.status_code == 405 and refused.headers["allow"] == ""


def test_group_schema_follows_the_validation_level(make_client: Callable[..., TestClient]) -> None:
    def group_schema(level: str) -> dict[str, Any]:
        return make_client(validation=level).get("/openapi.json").json()["components"]["schemas"]["ScoredData"]

    off, warn, strict = group_schema("off"), group_schema("warn"), group_schema("strict")
    assert "minItems" not in off["properties"]["tokens"]
    assert warn["properties"]["tokens"]["minItems"] == 1 and "minItems" not in warn["properties"]["tokens"]["items"]
    token = strict["properties"]["tokens"]["items"]["items"]
    assert (token["minimum"], token["maximum"]) == (0, TOKEN_ID_LIMIT - 1)
    assert strict["properties"]["tokens"]["items"]["minItems"] == 1
    message = warn["properties"]["messages"]["anyOf"][0]["items"]["items"]
    assert message["required"] == ["role", "content"]


@pytest.mark.parametrize("since", [str(2**64), str(-(2**64)), "99999999999999999999999", str(2**53)])
def test_out_of_range_since_is_422_not_500(client: TestClient, since: str) -> None:
    response = client.get("/batches/served", params={"since": since})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["query", "since"]


def test_options_and_405_name_the_real_methods(client: TestClient) -> None:
    for path, methods in (("/batch", "GET, POST"), ("/status-env", "GET, POST"), ("/batch/b-1/ack", "POST"),
                          ("/metrics", "GET")):
        options = client.options(path)
        assert options.status_code == 204 and options.headers["allow"] == f"{methods}, OPTIONS"
        wrong = client.put(path)
        assert wrong.status_code == 405 and wrong.headers["allow"] == methods
        assert wrong.json()["error"]["code"] == "method_not_allowed"
    assert client.options("/no/such/path").status_code == 404


def test_docs_are_served_from_the_package(make_client: Callable[..., TestClient]) -> None:
    client = make_client(api_key="k")
    for page in ("/docs", "/redoc"):
        html = client.get(page).text
        assets = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert assets and all(url.startswith("/docs-assets/") for url in assets), assets
        assert "http://" not in html and "https://" not in html.replace("https://github.com", "")
        for url in assets:
            asset = client.get(url)
            assert asset.status_code == 200 and len(asset.content) > 100, url
    assert client.get("/docs-assets/swagger-ui-bundle.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/info").status_code == 401
