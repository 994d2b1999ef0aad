"""Pure builders of a job's children: its pods (with the injected runtime and the gang's labels), Service, claim,
NetworkPolicy, PodGroup and the namespace's worker identity, as plain dicts."""
