"""The application's side: enqueueing jobs. The arguments made into a message (pure), the async
Client and the SyncClient for threads and forking servers.

Imports broker and the base modules.
"""
