"""ddpjob worker: torchrun entrypoint, checkpoint library, progress reporter, example trainer, local runner."""
