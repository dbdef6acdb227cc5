"""The batching engine: the scheduler loop over a slot engine, its choices, events and prefix caching; no HTTP."""
