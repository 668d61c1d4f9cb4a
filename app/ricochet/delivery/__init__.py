"""What happens to one delivery, decided without I/O: the facts read from its headers, the
retry decision, and the failed copy with its headers and traceback.

Imports broker and the base modules.
"""
