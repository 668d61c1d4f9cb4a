"""The operator's one-shot commands: replay, status, doctor and its checks, the report tables.

Imports service and everything below it; never worker or monitor.
"""
