"""Namespaces of the environment command line (``--env.group_size``, ``--openai.base_url``)."""

ENV_NAMESPACE = "env"
OPENAI_NAMESPACE = "openai"
SERVER_MANAGER_NAMESPACE = "server"
NAMESPACE_SEP = "."
