"""Kueue, the planner's side: the Workload of a queued job and what its admission means for the pods (pure)."""
