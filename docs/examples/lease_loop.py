"""A trainer's loop over leased batches: nothing is lost if the trainer dies mid-step."""

import httpx


def train_on(batch: list[dict]) -> None:
    """Stand-in for one optimizer step over the batch's groups."""
    assert all(len(group["tokens"]) == len(group["scores"]) for group in batch)


def run_trainer(api: str, steps: int) -> int:
    with httpx.Client(base_url=api, timeout=60) as client:
        client.post("/register", json={
            "wandb_group": None, "wandb_project": None, "batch_size": 16, "max_token_len": 2048,
            "checkpoint_dir": "checkpoints", "save_checkpoint_interval": 100,
            "starting_step": 0, "num_steps": steps,
        }).raise_for_status()
        done = 0
        while done < steps:
            leased = client.post("/batch", json={"lease_seconds": 600, "wait_seconds": 5}).json()
            if leased["batch"] is None:
                continue  # no batch yet: environments are still producing
            train_on(leased["batch"])
            client.post(f"/batch/{leased['batch_id']}/ack").raise_for_status()
            done += 1
        return client.get("/status").json()["current_step"]
