"""`tfctl`: the one command-line entry point (composition root; may import every service)."""
