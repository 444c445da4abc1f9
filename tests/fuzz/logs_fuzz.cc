// Line logs read from a path: state_hashes.jsonl and signatures.jsonl; the first byte picks.
#include "fuzz/fuzz_target.h"
#include "lockstep/state.h"

LOCKSTEP_FUZZ_TARGET({
  if (text.empty()) return 0;
  const std::filesystem::path path = lockstep::fuzz::Scratch() / "log.jsonl";
  lockstep::WriteFileSynced(path, text.substr(1));
  if (text[0] % 2 == 0) {
    (void)lockstep::ReadStateHashLines(path, lockstep::TornLine::kDrop);
  } else {
    const lockstep::SignedChain chain = lockstep::ReadSignedChain(path);
    (void)lockstep::VerifySignedChain(chain, nullptr);
  }
})
