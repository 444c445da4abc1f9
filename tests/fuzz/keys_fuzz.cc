#include <fstream>

#include "fuzz/fuzz_target.h"
#include "lockstep/state.h"

// The key readers: a signing key file and a public key file (read from a scratch file, as the
// commands read them), and a --trusted-keys list.
LOCKSTEP_FUZZ_TARGET({
  const std::filesystem::path file = lockstep::fuzz::Scratch() / "key";
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  try {
    (void)lockstep::ReadSigningKey(file);
  } catch (const lockstep::Error&) {
  }
  try {
    (void)lockstep::ReadPublicKey(file);
  } catch (const lockstep::Error&) {
  }
  (void)lockstep::ParseTrustedKeys(text, "fuzz");
})
