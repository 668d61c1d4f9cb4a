"""The monitor: reads failures from the events queue, logs and alerts on them, watches the
failed queue's depth.

Imports ops, service and everything below it; never worker.
"""
