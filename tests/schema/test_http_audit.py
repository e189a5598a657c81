"""The GraphQL over HTTP spec, audited by the GraphQL foundation's own tool: graphql-http's ``serverAudits`` (npm,
under node: ``tests/js``) against production's ASGI app (``build_asgi``) on a real uvicorn. Any error or warning
fails; the notices (SHOULD/MAY the spec leaves open) are printed."""

from __future__ import annotations

import json
import subprocess

from tests.js import NODE_DIR, require_node
from tests.schema.conftest import Hosted
from tests.support.served import served_app
from tests.support.servers import serve_in_thread


def test_the_graphql_over_http_audit_finds_no_error_and_no_warning(shop_hosted: Hosted) -> None:
    require_node()
    with serve_in_thread(served_app(shop_hosted), log_level="warning") as url:
        run = subprocess.run(
            ["node", "audit.mjs", f"{url}/graphql"], cwd=NODE_DIR, capture_output=True, text=True, timeout=120
        )
    assert run.returncode == 0, run.stderr
    results = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(results) > 40  # every audit ran
    failed = [r for r in results if r["status"] in ("error", "warn")]
    print("\n".join(f"notice {r['id']}: {r['name']}: {r['reason']}" for r in results if r["status"] == "notice"))
    assert not failed, json.dumps(failed, indent=1)
