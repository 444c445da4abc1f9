// Shared helpers for the state tests: a scratch directory, a small deterministic training
// state, and error expectations.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "common/scratch_dir.h"
#include "lockstep/state.h"
#include "state/internal.h"  // the safetensors header, for files too large to write

namespace lockstep::test {

// COMPLETE's entry for a checkpoint file holding `bytes` (docs/formats/checkpoint.md): a tensor
// file's TensorFileDigest, meta.json's BLAKE2b. A tensor file that does not parse gets its
// BLAKE2b: readers refuse it while computing its digest, before comparing.
inline nlohmann::json CompleteEntry(const std::string& name, std::span<const uint8_t> bytes) {
  if (name.ends_with(".safetensors")) {
    Digest digest;
    try {
      digest = TensorFileDigest(bytes, name);
    } catch (const Error&) {
      digest = Blake2b256(bytes);
    }
    return {{"digest", ToHex(digest)}, {"size", bytes.size()}};
  }
  return {{"blake2b", ToHex(Blake2b256(bytes))}, {"size", bytes.size()}};
}

// Replaces a checkpoint file and updates its COMPLETE entry, as a forger would: the damage
// then has to be caught by the file's own parser or by the state hash.
inline void Forge(const std::filesystem::path& dir, const std::string& name,
                  const std::string& text) {
  WriteFileSynced(dir / name, text);
  nlohmann::json complete = nlohmann::json::parse(ReadFileText(dir / "COMPLETE"));
  const auto bytes = std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  complete["files"][name] = CompleteEntry(name, bytes);
  WriteFileSynced(dir / "COMPLETE", complete.dump(2) + "\n");
}

// `text` with the first `from` replaced by `to` (a test failure when there is none).
inline std::string Replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}


// Two parameters with moments and gradients whose values cover the awkward cases: negative
// zero, a subnormal, large and small magnitudes.
struct SampleState {
  struct Arrays {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> param, m, v, grad;
  };
  std::vector<Arrays> arrays;
  StepState state;

  SampleState() {
    arrays.push_back(MakeArrays("embed.weight", {4, 3}, 1));
    arrays.push_back(MakeArrays("final_norm.gain", {3}, 2));
    arrays[0].param[5] = -0.0f;
    arrays[1].grad[2] = std::bit_cast<float>(uint32_t{0x00000003});  // subnormal
    state.step = 7;
    state.optimizer_step = 6;
    state.lr = 3e-4f;
    state.grad_norm = 1.25f;
    state.clip_factor = 0.8f;
    state.skipped = false;
    for (size_t i = 0; i < state.tokens_digest.size(); ++i) state.tokens_digest[i] = uint8_t(i);
    state.rng_seed = 1234;
    state.rng_counter = 99;
    state.data_cursor = 56;
    state.spike = {.total_skips = 1, .recent_skips = {3}};
    state.prev_hash.fill(0xab);
    state.descriptor = "{\"config\":\"tiny\",\"contract\":1,\"note\":\"caf\xc3\xa9\"}";  // UTF-8
  }

  std::vector<TensorState> Tensors() const {
    std::vector<TensorState> tensors;
    for (const Arrays& a : arrays) tensors.push_back({a.name, a.shape, a.param, a.m, a.v, a.grad, {}});
    return tensors;
  }

 private:
  static Arrays MakeArrays(std::string name, std::vector<int64_t> shape, int seed) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    Arrays a{std::move(name), std::move(shape), {}, {}, {}, {}};
    for (int64_t i = 0; i < count; ++i) {
      const float x = static_cast<float>(i + 1) * 0.37f * static_cast<float>(seed);
      a.param.push_back(x - 1.5f);
      a.m.push_back(x * 1e-3f);
      a.v.push_back(x * x * 1e-6f);
      a.grad.push_back(-x * 0.125f);
    }
    return a;
  }
};

// A checkpoint tensor file (docs/formats/checkpoint.md) of `tensors` with its header written and
// its data never: a sparse file of the full size, for a checkpoint too large to hold. Returns the
// file's size.
inline uint64_t WriteSparseTensorFile(const std::filesystem::path& path, const std::string& content,
                                      uint64_t step, std::span<const TensorShape> tensors) {
  const std::map<std::string, std::string> metadata = {
      {"content", content},
      {"format", "lockstep-checkpoint"},
      {"format_version", std::to_string(kCheckpointFormatVersion)},
      {"step", std::to_string(step)}};
  const std::string header =
      state_internal::SafetensorsHeaderBytes(tensors, metadata, path.filename().string());
  uint64_t size = header.size();
  for (const TensorShape& t : tensors) {
    uint64_t count = sizeof(float);
    for (const int64_t d : t.shape) count *= static_cast<uint64_t>(d);
    size += count;
  }
  WriteFileSynced(path, header);
  std::filesystem::resize_file(path, size);
  return size;
}

}  // namespace lockstep::test
