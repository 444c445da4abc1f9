// Encoding speed of @huggingface/tokenizers (the JavaScript implementation of tokenizer.json) on
// the same files as lockstep's, for scripts/bench-tokenizer.sh. Prints a JSON array: for each
// file its bytes, ids, the SHA-256 of the ids as little-endian uint32 (a lockstep shard's .bin
// bytes, for a one-document dataset) and the best of REPS encodings' seconds (the file read and
// the tokenizer load not counted).
// usage: node bench.mjs MODULE_DIR TOKENIZER.json REPS FILE...
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [moduleDir, tokenizerPath, reps, ...files] = process.argv.slice(2);
const { Tokenizer } = await import(pathToFileURL(`${moduleDir}/dist/tokenizers.mjs`).href);
const tokenizer = new Tokenizer(JSON.parse(readFileSync(tokenizerPath, "utf8")), {});
const results = files.map((file) => {
  const bytes = readFileSync(file);
  const text = bytes.toString("utf8");
  let best = Infinity, ids = [];
  for (let r = 0; r < Number(reps); ++r) {
    const start = process.hrtime.bigint();
    ids = tokenizer.encode(text, { add_special_tokens: false }).ids;
    best = Math.min(best, Number(process.hrtime.bigint() - start) / 1e9);
  }
  const le = Buffer.alloc(4 * ids.length);
  ids.forEach((id, i) => le.writeUInt32LE(id, 4 * i));
  const sha256 = createHash("sha256").update(le).digest("hex");
  return { file, bytes: bytes.length, ids: ids.length, sha256, seconds: best };
});
process.stdout.write(JSON.stringify(results));
