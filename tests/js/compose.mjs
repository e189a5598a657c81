// Apollo Federation's own composition (@apollo/composition, what the router's supergraph is made with): compose
// subgraphs from SDL files and print one JSON line: {errors: [...], hints: n, supergraph: "<SDL>" | null}.
//   node compose.mjs iqgraph=http://iqgraph:8000/graphql@iqgraph.graphql reviews=http://reviews/graphql@reviews.graphql
import { readFileSync } from 'node:fs';
import { composeServices } from '@apollo/composition';
import { parse } from 'graphql';

const services = process.argv.slice(2).map((arg) => {
  const [name, rest] = arg.split(/=(.*)/s);
  const at = rest.lastIndexOf('@');
  return { name, url: rest.slice(0, at), typeDefs: parse(readFileSync(rest.slice(at + 1), 'utf8')) };
});
const result = composeServices(services);
console.log(JSON.stringify({
  errors: (result.errors ?? []).map((e) => e.message),
  hints: (result.hints ?? []).length,
  supergraph: result.supergraphSdl ?? null,
}));
