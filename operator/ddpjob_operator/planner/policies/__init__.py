"""Run policies, one small pure module each: restart, success, ttl, suspend, deadline, stuck."""
