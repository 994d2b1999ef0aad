"""Example training scripts that run under ``ddp-worker`` and ``ddpjob run``."""
