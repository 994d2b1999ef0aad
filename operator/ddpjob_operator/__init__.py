"""ddpjob operator: turns DDPJob objects into indexed worker pods, a rendezvous Service and a checkpoint volume."""
