// A Megatron indexed dataset to import: the input is the .idx, then the .bin after the first
// "\n--bin--\n" (none: an empty .bin). The import must refuse or succeed, never crash or hang.
#include "fuzz/fuzz_target.h"
#include "lockstep/data.h"

LOCKSTEP_FUZZ_TARGET({
  const std::filesystem::path dir = lockstep::fuzz::Scratch();
  constexpr std::string_view kSplit = "\n--bin--\n";
  const size_t split = text.find(kSplit);
  lockstep::WriteFileSynced(dir / "corpus.idx", text.substr(0, split));
  lockstep::WriteFileSynced(dir / "corpus.bin", split == std::string_view::npos
                                                    ? std::string_view()
                                                    : text.substr(split + kSplit.size()));
  lockstep::WriteFileSynced(dir / "tokenizer.json", "{}");
  std::filesystem::remove_all(dir / "out");
  lockstep::data::ImportMegatron(dir / "corpus", dir / "out",
                                 lockstep::data::FileVocabulary(dir / "tokenizer.json", 1000, 999),
                                 /*max_shard_tokens=*/4096);
})
