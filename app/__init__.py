"""Node lifecycle, settings, cluster membership, peer client, ASGI server and CLI.."""
