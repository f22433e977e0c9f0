"""Local inference without a GPU or internet: a vLLM runtime in its own virtual
environment, a bundled model prepared for it, and a service wrapper.

* `runtime` - installs and describes the vLLM runtime (``atropos-vllm install``);
* `prepare_model` - turns the bundled SmolLM2 GGUF (or any model) into an HF folder
  (``atropos-prepare-model``);
* `vllm_service` - starts vLLM's OpenAI server on a model and stops it (``atropos-vllm serve``);
* `quickstart` - the README's main job (``atropos-quickstart``);
* `cpu` - the CPU's name and flags, and the dtype vLLM is fast in on it;
* `token_progress` - a bar of generated tokens read from vLLM's ``/metrics``;
* `signals` - SIGINT, SIGTERM and SIGHUP as exceptions, so every tool cleans up;
* `help_format` - ``--help`` with every flag's default;
* `gc_freeze` - what a command's imports made, out of the garbage collector's scans.
"""
