"""Security: client authentication (JWT, API keys) and its gate in front of the app, peer request
signing, and TLS.
"""
