"""``python -m ddpjob_operator.cli``: the ``ddpjob`` command line."""

from ddpjob_operator.cli.app import app

app()
