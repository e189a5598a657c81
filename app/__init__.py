"""The node: settings, lifecycle, cluster membership, store queries, peer client, ASGI server and CLI.

Light names are exported here; ``app.node``, ``app.http.server`` and ``app.dev.run`` start Spark and servers
and are imported where they are used.
"""

from iqgraph.app.loading import AppLoadError, load_app
from iqgraph.app.settings import Settings, SettingsError, load_settings

__all__ = ["AppLoadError", "Settings", "SettingsError", "load_app", "load_settings"]
