// Encodes files with @huggingface/tokenizers (the independent JavaScript implementation of
// tokenizer.json), for lockstep's tokenizer test. Prints a JSON array: each file's ids.
// usage: node hf_encode.mjs MODULE_DIR TOKENIZER.json FILE...
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [moduleDir, tokenizerPath, ...files] = process.argv.slice(2);
const { Tokenizer } = await import(pathToFileURL(`${moduleDir}/dist/tokenizers.mjs`).href);
const tokenizer = new Tokenizer(JSON.parse(readFileSync(tokenizerPath, "utf8")), {});
const ids = files.map((f) => tokenizer.encode(readFileSync(f, "utf8"), { add_special_tokens: false }).ids);
process.stdout.write(JSON.stringify(ids));
