"""Worker processes (RICOCHET_PROCESSES > 1): the parent that runs N of them, restarts them and
serves the HTTP endpoints for all, and what makes each one today's worker stopped by its parent.

Imports worker, service and everything below them.
"""
