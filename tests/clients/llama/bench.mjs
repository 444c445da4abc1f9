// Times generation in llama.cpp (node-llama-cpp 3.21.1, CPU, fp32 KV cache, no flash attention)
// on a GGUF file: a prompt of fixed token ids prefilled, then greedy decoding one token at a time,
// at each thread count and batch size asked for, and prints one JSON object. The other half of
// scripts/bench-generate.sh (lockstep's half is bench/bench_generate.cc).
//
//   node bench.mjs CLIENT_DIR MODEL.gguf PROMPT DECODE THREADS BATCHES [REPS]
//
// THREADS and BATCHES are comma-separated lists (e.g. 1,2 and 1,8); REPS (default 2) timed runs of
// each, the best kept, after one untimed warm-up. A batch of B is B sequences of one context
// (node-llama-cpp's `sequences`): their evaluations, started together, go into one llama_decode
// per step (node-llama-cpp batches what is queued in the same cycle). Each sequence gets the same
// prompt; the speed does not depend on the ids. CLIENT_DIR holds node_modules/node-llama-cpp
// (scripts/install-llama-client.sh).
import path from "node:path";
import {performance} from "node:perf_hooks";
import {pathToFileURL} from "node:url";

const [clientDir, modelPath, promptText, decodeText, threadsText, batchesText, repsText] =
  process.argv.slice(2);
const promptLen = Number(promptText);
const decodeLen = Number(decodeText);
const threadList = threadsText.split(",").map(Number);
const batchList = batchesText.split(",").map(Number);
const reps = Number(repsText ?? 2);
const {getLlama, LlamaLogLevel} = await import(
  pathToFileURL(path.join(clientDir, "node_modules", "node-llama-cpp", "dist", "index.js")).href);

// maxThreads 0: a context's `threads` is the number of threads used, not a hint.
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error,
                              maxThreads: 0});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const vocab = model.fileInfo.metadata[model.fileInfo.metadata.general.architecture]?.vocab_size ??
  model.fileInfo.metadata.tokenizer?.ggml?.tokens?.length ?? 256;
// A fixed pseudo-random prompt of ids below 256 (every exported vocabulary has them).
const prompt = [];
for (let i = 0, s = 12345; i < promptLen; i++) {
  s = (s * 1103515245 + 12345) % 2147483648;
  prompt.push(s % 256);
}

async function generate(sequences, nPrompt, nDecode) {
  const prefillStart = performance.now();
  const first = await Promise.all(sequences.map((seq) => seq.controlledEvaluate(
    prompt.slice(0, nPrompt).map((t, i) => [t, {generateNext: {token: i === nPrompt - 1}}]))));
  const prefill = (performance.now() - prefillStart) / 1000;
  let tokens = first.map((r) => r[r.length - 1].next.token);
  const decodeStart = performance.now();
  for (let step = 0; step < nDecode; step++) {
    // No sampling options: llama.cpp's greedy sampler (argmax) picks each next token.
    const out = await Promise.all(sequences.map((seq, i) =>
      seq.controlledEvaluate([[tokens[i], {generateNext: {token: true}}]])));
    tokens = out.map(([r]) => r.next.token);
  }
  const decode = (performance.now() - decodeStart) / 1000;
  for (const seq of sequences) await seq.clearHistory();
  return {prefill, decode};
}

const runs = [];
for (const threads of threadList) {
  for (const batch of batchList) {
    const context = await model.createContext({
      contextSize: promptLen + decodeLen + 1,  // per sequence
      batchSize: batch * promptLen,            // a whole batch's prompts in one llama_decode
      sequences: batch,
      threads: {ideal: threads, min: threads},
      flashAttention: false,
      experimentalKvCacheKeyType: "F32",
      experimentalKvCacheValueType: "F32",
      swaFullCache: true,
    });
    const sequences = [];
    for (let i = 0; i < batch; i++) sequences.push(context.getSequence());
    await generate(sequences, Math.min(8, promptLen), 2);  // warm-up
    let best = {prefill: Infinity, decode: Infinity};
    for (let r = 0; r < reps; r++) {
      const t = await generate(sequences, promptLen, decodeLen);
      best = {prefill: Math.min(best.prefill, t.prefill), decode: Math.min(best.decode, t.decode)};
    }
    runs.push({
      threads,
      batch,
      context_threads: context.currentThreads ?? threads,
      prefill_seconds: best.prefill,
      prefill_tokens_per_second: batch * promptLen / best.prefill,
      decode_seconds: best.decode,
      decode_tokens_per_second: batch * decodeLen / best.decode,
      decode_ms_per_step: best.decode / decodeLen * 1000,
    });
    await context.dispose();
  }
}
process.stdout.write(JSON.stringify({
  runtime: "llama.cpp via node-llama-cpp 3.21.1 (CPU, F32 weights and KV cache, no flash attention)",
  llama_cpp_build: llama.llamaCppRelease ?? null,
  architecture: model.fileInfo.metadata.general.architecture,
  vocab,
  prompt_tokens: promptLen,
  decode_tokens: decodeLen,
  reps,
  runs,
}) + "\n");
await model.dispose();
await llama.dispose();
