"""atroposlib: reinforcement learning environments for LLMs and the trajectory API between
environments and trainers. Compatible with Atropos 0.4.0 environment files and API clients.

Importing the package is cheap: subpackages load torch, wandb or gradio only when used.
"""

__version__ = "0.4.1"
