"""What `kubectl ddpjob` (and `ddpjob describe` / `ddpjob list`) shows: the layers are the reads (kubectl.py, the
only I/O: it runs the user's kubectl, so any kubeconfig, context and auth plugin works), the facts derived from a
job's status (facts.py: goodput, time lost, ETA), and the text (describe.py, listing.py), all pure."""
