"""The only code that talks to the API server: the client (kopf's, behind kopf_compat), the rate limit, the pod
watch, the namespaces' worker identity, and leader election with its Lease I/O."""
