#include <fstream>

#include "fuzz/fuzz_target.h"
#include "lockstep/data.h"

// A SentencePiece model file (read from a scratch file, as `data tokenize --tokenizer` and the
// exports read it): its pieces, types and options (data::ReadSentencePieceModel), then the
// tokenizer made from it encoding and decoding a text with non-ASCII characters.
LOCKSTEP_FUZZ_TARGET({
  const std::filesystem::path file = lockstep::fuzz::Scratch() / "tokenizer.model";
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  try {
    (void)lockstep::data::ReadSentencePieceModel(file);
  } catch (const lockstep::Error&) {
  }
  const std::unique_ptr<lockstep::data::Tokenizer> tokenizer = lockstep::data::OpenTokenizer(file);
  const std::vector<uint32_t> ids = tokenizer->Encode("na\xc3\xafve <s> text\n  x", "fuzz text");
  (void)tokenizer->Decode(ids);
})
