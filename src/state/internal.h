// Helpers shared by the state layer's formats. Every file lockstep reads is checked field by
// field, and every failure names the file (`what`), the field and the value.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/json.h"
#include "lockstep/state.h"

namespace lockstep::state_internal {

using Json = nlohmann::json;

// The element count of `shape`; fails naming `what` on a negative dimension or on overflow of
// the byte count (count × 4 must fit in 63 bits).
uint64_t ElementCount(const std::vector<int64_t>& shape, std::string_view what);

// ---- a tensor's four arrays, in StateArray (= state-hash) order ------------------------------
static_assert(static_cast<int>(StateArray::kGrad) + 1 == kStateArrayCount);
inline constexpr std::array<std::span<const float> TensorState::*, kStateArrayCount>
    kStateArrays = {&TensorState::param, &TensorState::m, &TensorState::v, &TensorState::grad};

// Fails naming the tensor when its name is empty or an array's size does not match its shape
// (a gradient may instead be known by its grad_digest alone).
void CheckTensorState(const TensorState& tensor);
// Whether a checked tensor's gradient elements are present (else grad_digest is its digest).
bool HasGradElements(const TensorState& tensor);
// `of_elements`, the digest of the tensor's gradient elements; fails naming the tensor when it
// has a grad_digest that differs.
Digest CheckedGradDigest(const TensorState& tensor, const Digest& of_elements);


// ---- safetensors headers (safetensors.cc) ----------------------------------------------------
struct SafetensorsEntry {
  std::string name;
  std::vector<int64_t> shape;
  Dtype dtype = Dtype::kF32;
  uint64_t begin = 0, end = 0;  // data_offsets: bytes from the start of the data section
};

struct SafetensorsHeader {
  uint64_t data_start = 0;                // 8 + the header's length: where the data begins
  std::vector<SafetensorsEntry> entries;  // in data order (ascending offsets)
  std::map<std::string, std::string> metadata;
};

// The header length stored in a file's first 8 bytes (`first_bytes`: the first
// min(8, file_size) bytes), checked against the file's size and the format's limit.
uint64_t SafetensorsHeaderLength(std::span<const uint8_t> first_bytes, uint64_t file_size,
                                 const std::filesystem::path& path);
// Validates the header JSON against a data section of `data_size` bytes: each dtype one
// `accept` allows, shape × element size == span, offsets contiguous and covering the data
// exactly, __metadata__ strings, the canonical form. The one validation behind
// ParseSafetensors and ReadSafetensorsHeader.
SafetensorsHeader ParseSafetensorsHeader(std::string_view json, uint64_t data_size,
                                         const std::filesystem::path& path,
                                         SafetensorsDtypes accept = SafetensorsDtypes::kF32);
// Reads and validates the header of `file`, whose size is `file_size`, without reading data.
SafetensorsHeader ReadSafetensorsHeader(const File& file, uint64_t file_size);
// The bytes in front of the data: the 8-byte length and the canonical JSON header (sorted keys,
// compact, padded with spaces to a multiple of 8), for data laid out in the given order. Fails
// naming `what` on empty, reserved or duplicate names and on bad shapes.
std::string SafetensorsHeaderBytes(std::span<const TensorShape> tensors,
                                   const std::map<std::string, std::string>& metadata,
                                   std::string_view what);

}  // namespace lockstep::state_internal
