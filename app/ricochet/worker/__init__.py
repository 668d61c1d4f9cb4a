"""The worker: one session that consumes the main queue, runs jobs and settles them, and
pauses on failure spikes.

Imports service and everything below it; never ops or monitor.
"""
