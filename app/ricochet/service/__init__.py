"""A long-running process: its lifecycle (signals, staying connected) and its HTTP endpoints.

Imports observe and everything below it.
"""
