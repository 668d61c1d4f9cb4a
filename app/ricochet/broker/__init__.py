"""The broker side: the AMQP adapter over aiormq/pamqp, connecting, confirmed publishing,
the topology (every queue name and argument), queue depths and the management API.

Imports only the base modules (errors, log, settings, tracing).
"""
