"""Pure decisions, no I/O: the checkpoint interval, spot or on-demand under a deadline.

The runner and ``orchestrator simulate`` call the same functions, so a replay of
a year of spot traces is the same code that decides for a real job.
"""
