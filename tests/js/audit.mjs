// The GraphQL over HTTP audit of the GraphQL foundation's graphql-http (serverAudits) against a server's URL.
// Prints one JSON line per audit: {id, name, status: "ok" | "warn" | "notice" | "error", reason}.
//   node audit.mjs http://127.0.0.1:8000/graphql
import { serverAudits } from 'graphql-http';

const url = process.argv[2];
if (!url) {
  console.error('usage: node audit.mjs <url of the /graphql endpoint>');
  process.exit(2);
}
for (const audit of serverAudits({ url })) {
  const result = await audit.fn();
  console.log(JSON.stringify({ id: audit.id, name: audit.name, status: result.status, reason: result.reason ?? null }));
}
