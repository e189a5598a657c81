"""HTTP: the node's ASGI server (GraphQL, REST, internal endpoints, health and metrics) and the request
guard's limits.
"""
