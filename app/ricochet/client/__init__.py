"""The application's side: enqueueing jobs. The arguments made into a message (pure), the async
Client and the SyncClient for threads and forking servers.

Imports broker, the base modules and delivery.failed (the room the worker keeps in a frame
for a job's properties, which bounds the headers a job may take).
"""
