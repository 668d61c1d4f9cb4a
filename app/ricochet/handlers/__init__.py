"""The job author's side: Job, Router, the invoker that runs a handler with its timeout, and
the bundled example handler.

Imports delivery, broker and the base modules.
"""
