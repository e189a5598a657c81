"""Owner-side fields: the calls routed to a key's owner (through the executor), the runner that runs a
user function there, and the read-only views of the partition's stores it is given.
"""
