"""The operator's Prometheus metrics (registry) and the figures over all jobs computed at scrape time (jobstats)."""
