"""Load an app definition from ``module:attribute``, with errors that say what to fix."""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path

from iqgraph.stores import UserError
from iqgraph.streaming.definitions import App


class AppLoadError(UserError, ValueError):
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
    except UserError:
        raise  # already says what to fix (a DefinitionError: in the app's definition)
    except Exception as exc:  # the user's module failed while it ran: where, and why, in one line
        where = _where(exc, module_name)
        raise AppLoadError(f"module {module_name!r} failed to load: {where}{type(exc).__name__}: {exc}") from None
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        found = "nothing" if app is None else type(app).__name__
        raise AppLoadError(f"{reference} is {found}, not an iqgraph App (iqgraph.App)")
    return app


def _where(exc: BaseException, module_name: str) -> str:
    """Return 'file:line: ' of the user's line an exception came from (a SyntaxError's own place).

    The innermost frame outside iqgraph and the import machinery: the user's module, or what it called.
    """
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}: "
    ours = str(Path(__file__).resolve().parents[1])
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(("<frozen", ours)) and "importlib" not in f.filename
    ]
    return f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else f"in {module_name}: "
