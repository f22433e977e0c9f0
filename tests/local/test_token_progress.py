"""Generated-token progress read from vLLM's /metrics: parsing and the shrinking budget."""

from __future__ import annotations

from atroposlib.local.token_progress import GenerationCounters, parse_metrics, rollouts_postfix, token_budget

METRICS = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="smollm2"} 1500.0
vllm:generation_tokens_total{engine="1",model_name="smollm2"} 500.0
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_bucket{engine="0",le="1.0",model_name="smollm2"} 0.0
vllm:request_generation_tokens_sum{engine="0",model_name="smollm2"} 900.0
vllm:request_generation_tokens_count{engine="0",model_name="smollm2"} 10.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smollm2"} 54.0
vllm:num_requests_waiting{engine="0",model_name="smollm2"} 0.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="smollm2"} 7000.0
"""


def test_counters_are_summed_over_engines() -> None:
    counters = parse_metrics(METRICS)
    assert counters == GenerationCounters(generated_tokens=2000, finished_rollouts=10, finished_tokens=900,
                                          running=54, waiting=0)
    assert parse_metrics("") == GenerationCounters()


def test_counts_since_the_start_of_the_job() -> None:
    start = GenerationCounters(generated_tokens=500, finished_rollouts=4, finished_tokens=400)
    job = parse_metrics(METRICS).since(start)
    assert (job.generated_tokens, job.finished_rollouts, job.finished_tokens, job.running) == (1500, 6, 500, 54)


def test_the_budget_shrinks_as_rollouts_stop_early() -> None:
    planned, max_tokens = 64, 128
    assert token_budget(GenerationCounters(), planned, max_tokens) == 64 * 128
    # 10 rollouts finished with 300 tokens in all: the other 54 may still take 128 each
    midway = GenerationCounters(generated_tokens=2000, finished_rollouts=10, finished_tokens=300, running=54)
    assert token_budget(midway, planned, max_tokens) == 300 + 54 * 128
    done = GenerationCounters(generated_tokens=5000, finished_rollouts=64, finished_tokens=5000)
    assert token_budget(done, planned, max_tokens) == 5000


def test_rollouts_sampled_again_extend_the_budget() -> None:
    # all planned rollouts finished, 3 more (to replace unusable ones) are running
    extra = GenerationCounters(generated_tokens=6100, finished_rollouts=64, finished_tokens=6000, running=3)
    assert token_budget(extra, 64, 128) == 6000 + 3 * 128


def test_rollouts_beyond_the_plan_are_shown_apart() -> None:
    assert rollouts_postfix(12, 64) == "rollouts 12/64"
    assert rollouts_postfix(64, 64) == "rollouts 64/64"
    assert rollouts_postfix(66, 64) == "rollouts 64/64 (+2 extra)"
