// The reference subscription clients a dashboard developer uses, graphql-ws (over the ws package: node 20 has no
// global WebSocket) and graphql-sse, following the same subscription on one node. Prints "ready <client>" once each
// has its first event, then, once each has received `count` events (or after `seconds`), one JSON line:
// {"ws": [data, ...], "sse": [data, ...]}.
//   node live_clients.mjs http://127.0.0.1:8000/graphql '<subscription>' '{"keys": ["c0"]}' 4 30
import { createClient as createWsClient } from 'graphql-ws';
import { createClient as createSseClient } from 'graphql-sse';
import WebSocket from 'ws';

const [url, query, variablesJson, countArg, secondsArg] = process.argv.slice(2);
const variables = JSON.parse(variablesJson);
const count = Number(countArg);
const received = { ws: [], sse: [] };
const clients = {
  ws: createWsClient({ url: url.replace(/^http/, 'ws'), webSocketImpl: WebSocket, retryAttempts: 0 }),
  sse: createSseClient({ url, retryAttempts: 0 }),
};

function follow(name) {
  return new Promise((resolve, reject) => {
    let unsubscribe = () => {};
    unsubscribe = clients[name].subscribe({ query, variables }, {
      next: (result) => {
        if (result.errors) return reject(new Error(`${name}: ${JSON.stringify(result.errors)}`));
        received[name].push(result.data);
        if (received[name].length === 1) console.log(`ready ${name}`);
        if (received[name].length >= count) { unsubscribe(); resolve(); }
      },
      error: (error) => reject(new Error(`${name}: ${error instanceof Error ? error.message : JSON.stringify(error)}`)),
      complete: () => resolve(),
    });
  });
}

const timer = setTimeout(() => { console.log(JSON.stringify(received)); process.exit(3); }, Number(secondsArg) * 1000);
try {
  await Promise.all([follow('ws'), follow('sse')]);
} finally {
  clearTimeout(timer);
  clients.ws.terminate();
  clients.sse.dispose();
}
console.log(JSON.stringify(received));
process.exit(0);
