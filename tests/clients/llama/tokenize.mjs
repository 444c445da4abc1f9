// Tokenizes texts with a GGUF file's vocabulary in llama.cpp (node-llama-cpp 3.21.1) and
// detokenizes the ids again; prints JSON: the tokenizer keys llama.cpp read and, per text, the
// ids and the decoded text. No context is created: only the vocabulary is used.
//
//   node tokenize.mjs CLIENT_DIR MODEL.gguf TEXTS.json SPECIAL
//
// TEXTS.json: a JSON array of strings. SPECIAL "true": texts of special (control) tokens are
// matched as those tokens (llama_tokenize's parse_special), as lockstep matches a tokenizer.json's
// added tokens; "false": they are text, as SentencePiece treats <s> and </s>.
import fs from "node:fs";
import path from "node:path";
import {pathToFileURL} from "node:url";

const [clientDir, modelPath, textsPath, specialText] = process.argv.slice(2);
const texts = JSON.parse(fs.readFileSync(textsPath, "utf8"));
const special = specialText === "true";
const {getLlama, LlamaLogLevel} = await import(
  pathToFileURL(path.join(clientDir, "node_modules", "node-llama-cpp", "dist", "index.js")).href);

const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const ggml = model.fileInfo.metadata.tokenizer?.ggml ?? {};
const results = texts.map((text) => {
  const ids = model.tokenize(text, special);
  return {ids: Array.from(ids), text: model.detokenize(ids, special)};
});
process.stdout.write(JSON.stringify({model: ggml.model ?? null, pre: ggml.pre ?? null, results}) + "\n");
await model.dispose();
await llama.dispose();
