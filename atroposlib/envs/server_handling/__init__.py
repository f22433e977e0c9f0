"""Clients of inference servers: one backend per server type, and the manager that routes
an environment's requests across them."""
