// The data layer's tokenizer implementations, behind data::OpenTokenizer.
#pragma once

#include <filesystem>
#include <memory>

#include "lockstep/data.h"

namespace lockstep::data {

// A Hugging Face tokenizer.json of byte-level BPE (bpe.cc).
std::unique_ptr<Tokenizer> OpenHfTokenizer(const std::filesystem::path& path);

}  // namespace lockstep::data
