"""The operator process: kopf's handlers feed a child cache and a keyed work queue; the controller runs one pass per
job (read, plan, apply, write status once, emit events); a periodic resync corrects what the watches missed."""
