"""A GRPO trainer that reads batches from the trajectory API (see example-trainer docs)."""
