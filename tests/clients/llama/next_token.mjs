// Runs a GGUF file in llama.cpp (node-llama-cpp 3.21.1, CPU, fp32 KV cache, no flash attention)
// on fixed token ids and prints JSON: the next-token probability distribution at every prompt
// position (softmax of llama.cpp's logits, as node-llama-cpp computes it), a greedy
// continuation and each tensor's type. Token ids go in directly, so the tokenizer plays no part in the numbers.
//
//   node next_token.mjs CLIENT_DIR MODEL.gguf '[ids...]' N_GREEDY
//
// CLIENT_DIR holds node_modules/node-llama-cpp (scripts/install-llama-client.sh).
import path from "node:path";
import {pathToFileURL} from "node:url";

const [clientDir, modelPath, idsJson, nGreedyText] = process.argv.slice(2);
const prompt = JSON.parse(idsJson);
const nGreedy = Number(nGreedyText);
const {getLlama, LlamaLogLevel} = await import(
  pathToFileURL(path.join(clientDir, "node_modules", "node-llama-cpp", "dist", "index.js")).href);

const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const contextSize = prompt.length + nGreedy;
const context = await model.createContext({
  contextSize,
  batchSize: contextSize,
  sequences: 1,
  flashAttention: false,
  experimentalKvCacheKeyType: "F32",
  experimentalKvCacheValueType: "F32",
  swaFullCache: true,
});
const sequence = context.getSequence();

const toArray = (probabilities) => {
  const out = [];
  for (const [token, p] of probabilities) out[token] = p;
  for (let i = 0; i < out.length; i++) if (out[i] === undefined) out[i] = 0;
  return out;
};

// Every prompt position asks for its distribution; the last one also picks the next token.
const items = prompt.map((token, i) => [token, {
  generateNext: {probabilities: true, token: i === prompt.length - 1},
}]);
const results = await sequence.controlledEvaluate(items);
const probs = results.map((r) => toArray(r.next.probabilities));
let token = results[results.length - 1].next.token;
const greedy = [token];
while (greedy.length < nGreedy) {
  // No sampling options: node-llama-cpp's sampler is llama.cpp's greedy one (argmax).
  const [r] = await sequence.controlledEvaluate([[token, {generateNext: {token: true}}]]);
  token = r.next.token;
  greedy.push(token);
}
process.stdout.write(JSON.stringify({
  architecture: model.fileInfo.metadata.general.architecture,
  vocab: model.fileInfo.metadata.tokenizer?.ggml?.tokens?.length ?? null,
  // Each tensor's ggml type as the GGUF reader read it (F32 0, BF16 30).
  tensor_types: Object.fromEntries((model.fileInfo.tensorInfo ?? []).map((t) => [t.name, t.ggmlType])),
  probs,
  greedy,
}) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
