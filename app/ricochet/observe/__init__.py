"""What the processes tell the world: Prometheus metrics, the consumer's spans, alert
decisions and the webhook that delivers them.

Imports handlers, delivery, broker and the base modules.
"""
