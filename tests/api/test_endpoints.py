"""Every reference endpoint answers with Atropos's paths, shapes and status strings."""

from __future__ import annotations

from fastapi.testclient import TestClient

from atroposlib.wire import ITEM_KEYS
from tests.conftest import env_registration, group, registration, start_run


def test_root_and_unregistered_defaults(client: TestClient) -> None:
    assert client.get("/").json() == {"message": "AtroposLib API"}
    assert client.get("/info").json() == {"batch_size": -1, "max_token_len": -1}
    assert client.get("/wandb_info").json() == {"group": None, "project": None}
    status = client.get("/status").json()
    assert status["current_step"] == 0 and status["queue_size"] == 0
    assert client.get("/batch").json() == {
        "status": "error", "message": "Trainer not registered. Call /register first.", "batch": []
    }


def test_register_returns_big_integer_uuid_and_first_registration_wins(client: TestClient) -> None:
    first = client.post("/register", json=registration(32))
    assert first.status_code == 200
    uuid = first.json()["uuid"]
    assert isinstance(uuid, int) and first.json()["uuid_str"] == str(uuid)
    again = client.post("/register", json=registration(64)).json()
    assert again["registered"] == "existing" and again["config_mismatch"] == ["batch_size"]
    assert again["config_mismatch_values"] == {"batch_size": {"stored": 32, "requested": 64}}
    assert client.get("/info").json() == {"batch_size": 32, "max_token_len": 2048}
    assert client.get("/wandb_info").json() == {"group": "group", "project": "project"}


def test_a_registration_of_empty_batches_is_refused_and_the_api_stays_unregistered(client: TestClient) -> None:
    for size in (0, -4):
        refused = client.post("/register", json=registration(size))
        assert refused.status_code == 422 and "batch_size" in refused.text
    assert client.get("/info").json() == {"batch_size": -1, "max_token_len": -1}


def test_register_replace(client: TestClient) -> None:
    client.post("/register", json=registration(32))
    client.post("/scored_data", json=group(8))
    replaced = client.post("/register?replace=true", json=registration(16, starting_step=5)).json()
    assert replaced["registered"] == "replaced"
    assert client.get("/info").json()["batch_size"] == 16
    status = client.get("/status").json()
    assert (status["current_step"], status["queue_size"]) == (5, 1)


def test_register_accepts_null_wandb_and_rejects_missing_fields(client: TestClient) -> None:
    assert client.post("/register", json=registration(wandb_group=None, wandb_project=None)).status_code == 200
    bad = client.post("/register", json={"batch_size": 4})
    assert bad.status_code == 422
    body = bad.json()
    assert body["error"]["code"] == "validation_error" and isinstance(body["detail"], list)
    assert "wandb_group" in body["error"]["message"]


def test_env_registration_is_gated_until_first_batch_poll(client: TestClient) -> None:
    client.post("/register", json=registration())
    assert client.post("/register-env", json=env_registration("gsm8k")).json() == {"status": "wait for trainer to start"}
    assert client.get("/batch").json() == {"batch": None}
    first = client.post("/register-env", json=env_registration("gsm8k")).json()
    assert first == {
        "status": "success", "env_id": 0, "wandb_name": "gsm8k_0", "checkpoint_dir": "checkpoints/run",
        "starting_step": 0, "checkpoint_interval": 10, "num_steps": 100,
    }
    second = client.post("/register-env", json=env_registration("gsm8k")).json()
    assert (second["env_id"], second["wandb_name"]) == (1, "gsm8k_1")
    assert client.post("/register-env", json=env_registration("math")).json()["wandb_name"] == "math_0"


def test_register_env_validation(client: TestClient) -> None:
    start_run(client)
    for bad in ({"desired_name": None}, {"group_size": 0}, {"min_batch_allocation": 1.5}):
        response = client.post("/register-env", json=env_registration("x") | bad)
        assert response.status_code == 422, bad
    assert client.post("/register-env", json=env_registration(weight=None)).json()["status"] == "success"


def test_packing_warning_on_registration(client: TestClient) -> None:
    client.post("/register", json=registration(12))
    client.get("/batch")
    response = client.post("/register-env", json=env_registration("x", 8)).json()
    assert any("not a multiple" in w for w in response["warnings"])


def test_disconnect_env(client: TestClient) -> None:
    start_run(client)
    assert client.post("/disconnect-env", json={"env_id": 0}).json() == {"status": "success"}
    failure = client.post("/disconnect-env", json={"env_id": 5}).json()
    assert failure["status"] == "failure" and "5" in failure["error"]
    assert client.post("/disconnect-env", json={"env_id": -1}).json()["status"] == "failure"


def test_four_groups_make_one_batch_in_submission_order(client: TestClient) -> None:
    start_run(client, 32)
    for score in range(4):
        assert client.post("/scored_data", json=group(8, env_id=0, score=score)).json() == {"status": "received"}
    response = client.get("/batch")
    assert response.headers["cache-control"] == "no-store"
    batch = response.json()["batch"]
    assert [item["scores"][0] for item in batch] == [0, 1, 2, 3]
    assert all(set(item) == set(ITEM_KEYS) and item["advantages"] is None for item in batch)
    assert client.get("/status").json()["current_step"] == 1
    assert client.get("/batch").json() == {"batch": None}


def test_batches_are_served_oldest_first_one_step_each(client: TestClient) -> None:
    start_run(client, 8)
    for score in range(3):
        client.post("/scored_data", json=group(8, env_id=0, score=score))
    served = [client.get("/batch").json()["batch"][0]["scores"][0] for _ in range(3)]
    assert served == [0, 1, 2]
    assert client.get("/status").json()["current_step"] == 3


def test_items_pass_through_unchanged(client: TestClient) -> None:
    start_run(client, 2)
    messages = [[{"role": "user", "content": [{"type": "text", "text": "hi"}], "extra": 1}],
                [{"role": "tool", "content": None, "reward": 0.5}]]
    submitted = group(2, env_id=None, advantages=[[0.5] * 4] * 2, messages=messages,
                      generation_params={"temperature": 0.7}, overrides=[{"sft": True}, {}],
                      group_overrides={"group_size": 2}, images=["abc"], unknown_field=3)
    submitted["scores"] = [1, 0]
    client.post("/scored_data", json=submitted)
    item = client.get("/batch").json()["batch"][0]
    assert item["messages"] == messages and item["scores"] == [1.0, 0.0]
    assert item["generation_params"] == {"temperature": 0.7} and item["images"] == ["abc"]
    assert "unknown_field" not in item and "submission_id" not in item


def test_messages_need_role_and_content(client: TestClient) -> None:
    bad = group(1, messages=[[{"role": "user"}]])
    response = client.post("/scored_data", json=bad)
    assert response.status_code == 422 and "content" in response.json()["error"]["message"]


def test_scored_data_list(client: TestClient) -> None:
    start_run(client, 16, envs=(("small", 2),))
    response = client.post("/scored_data_list", json=[group(2, env_id=0), group(2, env_id=0)]).json()
    assert response == {"status": "received", "groups_processed": 2}
    mixed = client.post("/scored_data_list", json=[group(1, env_id=0), group(2, env_id=0), group(1, env_id=0)]).json()
    assert mixed["buffered"] == 2 and mixed["last_buffer_size"] == 0 and mixed["groups_processed"] == 3


def test_scored_data_list_is_all_or_nothing(client: TestClient) -> None:
    start_run(client)
    bad = group(8)
    bad["scores"] = [1.0]
    response = client.post("/scored_data_list", json=[group(8), bad])
    assert response.status_code == 422 and "body.1.scores" in response.json()["error"]["message"]
    assert client.get("/status").json()["queue_size"] == 0


def test_latest_example(client: TestClient) -> None:
    default = client.get("/latest_example").json()
    assert default["generation_params"] == [] and default["tokens"] == []
    client.post("/scored_data", json=group(2, score=7))
    assert client.get("/latest_example").json()["scores"] == [7.0, 7.0]


def test_reset_data_is_plain_text_and_wipes_everything(client: TestClient) -> None:
    start_run(client)
    client.post("/scored_data", json=group(8))
    response = client.get("/reset_data")
    assert response.status_code == 200 and response.text == "Reset successful"
    assert response.headers["content-type"].startswith("text/plain")
    assert client.get("/info").json() == {"batch_size": -1, "max_token_len": -1}
    assert client.get("/status").json()["queue_size"] == 0
    assert client.get("/latest_example").json()["tokens"] == []
    assert client.get("/batch").json()["batch"] == []
    assert client.post("/reset").json() == {"status": "reset"}


def test_get_reset_can_be_disabled(make_client) -> None:
    client = make_client(disable_get_reset=True)
    response = client.get("/reset_data")
    assert response.status_code == 405 and response.json()["error"]["code"] == "method_disabled"


def test_status_env_forms_agree_and_do_not_mutate(client: TestClient) -> None:
    start_run(client, 32, envs=(("a", 4), ("b", 8)))
    client.post("/scored_data", json=group(8, env_id=0))
    body = client.request("GET", "/status-env", json={"env_id": 0}).json()
    assert body == client.get("/status-env?env_id=0").json() == client.post("/status-env", json={"env_id": 0}).json()
    assert body["max_group_size"] == 8 and body["self_queue_size"] == 1
    assert client.get("/envs").json()["envs"][0]["group_size"] == 4
    mismatch = client.request("GET", "/status-env?env_id=1", json={"env_id": 0})
    assert mismatch.status_code == 422


def test_status_env_errors_are_4xx(client: TestClient) -> None:
    assert client.get("/status-env?env_id=0").json()["error"]["code"] == "not_registered"
    start_run(client)
    missing = client.get("/status-env?env_id=9")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_env"
    assert client.get("/status-env?env_id=abc").status_code == 422
    assert client.get("/status-env").status_code == 422
    assert client.post("/status-env?env_id=0", content=b"\x0b").status_code == 422  # not JSON, not absent


def test_negative_weight_means_no_throttling(client: TestClient) -> None:
    start_run(client, envs=(("a", 8), ("b", 8)))
    client.post("/register-env", json=env_registration("c", weight=-1))
    assert client.get("/status-env?env_id=2").json()["env_weight"] == 1.0
    assert client.get("/status-env?env_id=0").json()["env_weight"] == 0.5


def test_unknown_paths_are_structured_404(client: TestClient) -> None:
    response = client.get("/nope")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_out_of_range_numbers_are_422(client: TestClient) -> None:
    start_run(client)
    assert client.post("/scored_data", json=group(8, env_id=2**64)).status_code == 422
    assert client.post("/register-env", content=b'{"max_token_length": 1, "desired_name": "x", "weight": Infinity, "group_size": 8}').status_code == 422
