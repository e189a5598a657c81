"""Load an app definition from ``module:attribute``, with errors that say what to fix."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from iqgraph.streaming.definitions import App


class AppLoadError(ValueError):
    """The --app reference does not name an App."""


def load_app(reference: str) -> App:
    """Return the App named by 'package.module:attribute' (the current directory is importable)."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        example = "iqgraph.examples.shop:app"
        raise AppLoadError(f"--app {reference!r} must look like 'package.module:attribute', e.g. {example}")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppLoadError(f"cannot import module {module_name!r} for --app: {exc}") from None
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        found = "nothing" if app is None else type(app).__name__
        raise AppLoadError(f"{reference} is {found}, not an iqgraph App (iqgraph.App)")
    return app
