// A Hugging Face tokenizer.json: opened, then used to encode and decode a fixed varied text.
#include "fuzz/fuzz_target.h"
#include "lockstep/data.h"

LOCKSTEP_FUZZ_TARGET({
  const std::filesystem::path path = lockstep::fuzz::Scratch() / "tokenizer.json";
  lockstep::WriteFileSynced(path, text);
  const auto tokenizer = lockstep::data::OpenTokenizer(path);
  const std::string_view sample = "Hello  world\t日本語 don't 123456 <|endoftext|> e\u0301\r\n";
  (void)tokenizer->Decode(tokenizer->Encode(sample, "sample"));
})
