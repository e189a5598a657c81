/*
 * A small GraphQL over WebSocket client (the graphql-transport-ws protocol, as schema/asgi.py serves it at
 * /graphql), written for the pages a node serves: no dependency, no build step, nothing from a CDN.
 *
 *   const live = IqGraphLive.connect("ws://host:port/graphql", {
 *     payload: { Authorization: "Bearer <token>" },  // optional: connection_init's credentials
 *     onStatus: (status, detail) => { ... },           // "connecting" | "live" | "closed"
 *   });
 *   const stop = live.subscribe({ query, variables }, {
 *     next: (result) => { ... },      // each ExecutionResult: { data } or { data, errors }
 *     error: (errors) => { ... },     // the operation failed (its GraphQL errors); it is over
 *     complete: () => { ... },        // the server ended the operation
 *   });
 *   stop();                           // complete it from this side
 *
 * The protocol: connection_init (with the payload) → connection_ack; subscribe {id, payload} → next* then
 * complete or error; complete from the client ends an operation; ping → pong both ways. A socket that
 * closes (other than by close()) is opened again after a backoff, and every operation still running is
 * subscribed again: its first events are then the values now (a resubscription starts with a snapshot).
 * A close code of 4401/4403 (refused credentials) is final: reconnecting would be refused again.
 */
(function (global) {
  "use strict";

  const PROTOCOL = "graphql-transport-ws";
  const FINAL_CLOSE_CODES = [4400, 4401, 4403, 4409, 4429];
  const PING_EVERY_MS = 20000;

  function connect(url, options) {
    const settings = Object.assign({ payload: null, onStatus: () => {}, retryMs: [500, 1000, 2000, 5000] }, options);
    const operations = new Map(); // id -> { request, sink }
    let socket = null;
    let acknowledged = false;
    let closedByUs = false;
    let attempts = 0;
    let nextId = 1;
    let pinger = null;

    function send(message) {
      socket.send(JSON.stringify(message));
    }

    function start(id) {
      send({ id: id, type: "subscribe", payload: operations.get(id).request });
    }

    function open() {
      settings.onStatus("connecting");
      acknowledged = false;
      socket = new WebSocket(url, PROTOCOL);
      socket.onopen = () => send({ type: "connection_init", payload: settings.payload || {} });
      socket.onmessage = (event) => receive(JSON.parse(event.data));
      socket.onclose = (event) => closed(event.code, event.reason);
    }

    function receive(message) {
      const operation = message.id === undefined ? null : operations.get(message.id);
      switch (message.type) {
        case "connection_ack":
          acknowledged = true;
          attempts = 0;
          settings.onStatus("live");
          operations.forEach((_, id) => start(id));
          pinger = setInterval(() => send({ type: "ping" }), PING_EVERY_MS);
          break;
        case "ping":
          send({ type: "pong", payload: message.payload });
          break;
        case "pong":
          break;
        case "next":
          if (operation) operation.sink.next(message.payload);
          break;
        case "error":
          if (operation) {
            operations.delete(message.id);
            operation.sink.error(message.payload);
          }
          break;
        case "complete":
          if (operation) {
            operations.delete(message.id);
            operation.sink.complete();
          }
          break;
        default:
          socket.close(4400, "unexpected message " + message.type);
      }
    }

    function closed(code, reason) {
      clearInterval(pinger);
      socket = null;
      if (closedByUs || FINAL_CLOSE_CODES.includes(code)) {
        settings.onStatus("closed", code + " " + reason);
        operations.forEach((operation) => operation.sink.error([{ message: "closed: " + code + " " + reason }]));
        operations.clear();
        return;
      }
      const wait = settings.retryMs[Math.min(attempts, settings.retryMs.length - 1)];
      attempts += 1;
      settings.onStatus("connecting", "closed " + code + "; again in " + wait + " ms");
      setTimeout(open, wait);
    }

    function subscribe(request, sink) {
      const id = String(nextId++);
      const full = Object.assign({ next: () => {}, error: () => {}, complete: () => {} }, sink);
      operations.set(id, { request: request, sink: full });
      if (socket && acknowledged) start(id);
      return () => {
        if (operations.delete(id) && socket && acknowledged) send({ id: id, type: "complete" });
      };
    }

    function close() {
      closedByUs = true;
      if (socket) socket.close(1000, "closed by the page");
    }

    open();
    return { subscribe: subscribe, close: close };
  }

  /** Return the websocket URL of the node's /graphql, from the page's own location. */
  function endpoint(path) {
    const scheme = global.location.protocol === "https:" ? "wss:" : "ws:";
    return scheme + "//" + global.location.host + (path || "/graphql");
  }

  /** Return connection_init's credentials from the page's fragment (#token=… or #apiKey=…; never sent in URLs). */
  function credentials() {
    const fragment = new URLSearchParams(global.location.hash.replace(/^#/, ""));
    if (fragment.get("token")) return { Authorization: "Bearer " + fragment.get("token") };
    if (fragment.get("apiKey")) return { "x-api-key": fragment.get("apiKey") };
    return null;
  }

  global.IqGraphLive = { connect: connect, endpoint: endpoint, credentials: credentials };
})(window);
