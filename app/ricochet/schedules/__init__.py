"""Recurring jobs, decided without I/O: a schedule as registered and checked, when its
occurrences fall (every, or cron on a zone's wall clock), and what a new leader enqueues to
catch up.

Imports only the base modules (and cronsim, zoneinfo).
"""
