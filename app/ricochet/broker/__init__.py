"""The broker side: the AMQP adapter over aiormq/pamqp, connecting, confirmed publishing,
the topology (its plan as data, the diff with what the broker holds, and declaring it), queue
depths and the management API.

Imports only the base modules (errors, log, names, settings, tracing).
"""
