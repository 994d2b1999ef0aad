"""The ``ddpjob`` command line (``ddpjob operator``, ``ddpjob run``, the views) and the local runner.

``ddpjob_operator.cli:app`` is the console script's entry point; it stays importable from here."""

from ddpjob_operator.cli.app import app

__all__ = ["app"]
