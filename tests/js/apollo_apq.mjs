// Apollo Client (@apollo/client 4) with its persisted-queries link, as an app sets it up, against a node's /graphql:
// the same query twice. Prints one JSON line: both answers, and every HTTP request the client sent (method, URL,
// body, status), so the test can see the APQ exchange: hash only, not found, with the document, then hash only
// over GET.
//   node apollo_apq.mjs http://127.0.0.1:8000/graphql customer-0001
import { createHash } from 'node:crypto';
import { ApolloClient, HttpLink, InMemoryCache, gql } from '@apollo/client';
import { PersistedQueryLink } from '@apollo/client/link/persisted-queries';

const [uri, key] = process.argv.slice(2);
const requests = [];
async function recorded(url, options) {
  const request = { method: options.method, url: String(url), body: options.body ? JSON.parse(options.body) : null };
  requests.push(request);
  const response = await fetch(url, options);
  request.status = response.status;
  return response;
}
const sha256 = (text) => createHash('sha256').update(text).digest('hex');
const link = new PersistedQueryLink({ sha256, useGETForHashedQueries: true }).concat(new HttpLink({ uri, fetch: recorded }));
const client = new ApolloClient({ link, cache: new InMemoryCache() });
const QUERY = gql`query OrderCount($key: String!) { orderCount { get(key: $key) } }`;
const answers = [];
for (let i = 0; i < 2; i++) {
  const { data, error } = await client.query({ query: QUERY, variables: { key }, fetchPolicy: 'network-only' });
  answers.push({ data, error: error ? String(error) : null });
}
console.log(JSON.stringify({ answers, requests }));
