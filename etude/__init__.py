"""etude: reinforcement learning for coding agents, in sandboxes and from real use."""

__version__ = "0.1.0"
