"""GraphiQL that works offline: the page and its assets are served by the node itself, never by a CDN.

The page is Strawberry's GraphiQL (with the explorer plugin) rewritten to load React, GraphiQL and the
plugin from ``STATIC_URL`` under the page's own path. ``build_asgi`` mounts ``graphiql_mount()`` there;
``GraphQLApp.render_graphql_ide`` answers a browser's GET /graphql with ``graphiql_html``. The vendored
files, their versions and how to update them: static/graphiql/README.md.
"""

from __future__ import annotations

import html
from pathlib import Path
from string import Template

from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

#: The directory the package's static files install to (package-data ``static/**/*``).
STATIC_DIR = Path(__file__).parent / "static"

#: Where the static files are mounted, relative to the GraphQL endpoint's path.
STATIC_URL = "/static"

#: The GraphiQL assets the page loads, in load order, with their subresource integrity (sha384): the same
#: files Strawberry's template loads from unpkg, so its hashes and these agree.
STYLESHEETS = {
    "graphiql.min.css": "sha384-Mq3vbRBY71jfjQAt/DcjxUIYY33ksal4cgdRt9U/hNPvHBCaT2JfJ/PTRiPKf0aM",
    "plugin-explorer.css": "sha384-5DFJlDPW2tSATRbM8kzoP1j194jexLswuNmClWoRr2Q0x7R68JIQzPHZ02Faktwi",
}
SCRIPTS = {
    "react.production.min.js": "sha384-tMH8h3BGESGckSAVGZ82T9n90ztNXxvdwvdM6UoR56cYcf+0iGXBliJ29D+wZ/x8",
    "react-dom.production.min.js": "sha384-bm7MnzvK++ykSwVJ2tynSE5TRdN+xL418osEVF2DE/L/gfWHj91J2Sphe582B1Bh",
    "graphiql.min.js": "sha384-HbRVEFG0JGJZeAHCJ9Xm2+tpknBQ7QZmNlO/DgZtkZ0aJSypT96YYGRNod99l9Ie",
    "plugin-explorer.umd.js": "sha384-2oonKe47vfHIZnmB6ZZ10vl7T0Y+qrHQF2cmNTaFDuPshpKqpUMGMc9jgj9MLDZ9",
}

# The endpoint is the page's own URL without its query string. "q" (not "query") carries the editor's
# query: a GET with "query" is a GraphQL request, not the IDE. Headers stay out of the URL and storage.
_PAGE = Template("""<!doctype html>
<html lang="en">
  <head>
    <meta charset="utf-8" />
    <title>iqgraph GraphiQL</title>
    <link rel="icon" href="data:," />
    <style>
      body { height: 100%; margin: 0; width: 100%; overflow: hidden; }
      #graphiql { height: 100vh; display: flex; }
      .graphiql-explorer-actions select { margin-left: 4px; }
    </style>
$stylesheets
$scripts
  </head>
  <body>
    <div id="graphiql" class="graphiql-container">Loading...</div>
    <script>
      const DEFAULT_QUERY = "# iqgraph: run with Ctrl-Enter.\\n# Docs and explorer: left.\\n\\n" +
        "{\\n  node {\\n    id\\n    state\\n  }\\n}\\n";
      const parameters = new URLSearchParams(window.location.search);
      const endpoint = window.location.origin + window.location.pathname;
      // subscriptions over graphql-transport-ws (GraphiQL bundles graphql-ws); the headers typed in GraphiQL
      // become connection_init's payload, which is how a websocket authenticates
      const fetcher = GraphiQL.createFetcher({ url: endpoint, subscriptionUrl: endpoint.replace(/^http/, "ws") });

      function keepInURL(name, value) {
        if (value) { parameters.set(name, value); } else { parameters.delete(name); }
        const search = parameters.toString();
        history.replaceState(null, "", search ? "?" + search : window.location.pathname);
      }

      function IqGraphiQL() {
        const [query, setQuery] = React.useState(parameters.get("q") || DEFAULT_QUERY);
        const [variables, setVariables] = React.useState(parameters.get("variables") || undefined);
        const explorer = React.useMemo(() => GraphiQLPluginExplorer.explorerPlugin(), []);
        return React.createElement(GraphiQL, {
          fetcher: fetcher,
          plugins: [explorer],
          query: query,
          variables: variables,
          onEditQuery: (value) => { setQuery(value); keepInURL("q", value); },
          onEditVariables: (value) => { setVariables(value); keepInURL("variables", value); },
          defaultEditorToolsVisibility: true,
          isHeadersEditorEnabled: true,
          shouldPersistHeaders: false,
          inputValueDeprecation: true,
        });
      }

      ReactDOM.createRoot(document.getElementById("graphiql")).render(React.createElement(IqGraphiQL));
    </script>
  </body>
</html>
""")


def graphiql_html(endpoint_path: str) -> str:
    """Return the GraphiQL page of the endpoint at endpoint_path, loading its assets from below it."""
    base = html.escape(f"{endpoint_path.rstrip('/')}{STATIC_URL}/graphiql/", quote=True)
    stylesheets = (
        f'    <link rel="stylesheet" href="{base}{name}" integrity="{sri}" />' for name, sri in STYLESHEETS.items()
    )
    scripts = (f'    <script src="{base}{name}" integrity="{sri}"></script>' for name, sri in SCRIPTS.items())
    return _PAGE.substitute(stylesheets="\n".join(stylesheets), scripts="\n".join(scripts))


def graphiql_mount(endpoint_path: str = "/graphql") -> Mount:
    """Return the route serving the package's static files below the endpoint at endpoint_path."""
    return Mount(f"{endpoint_path.rstrip('/')}{STATIC_URL}", app=StaticFiles(directory=STATIC_DIR), name="graphiql")
