// safetensors (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length
// N, N bytes of JSON header, then the tensors' bytes, in the dtypes of lockstep/tensor.h.
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>

#include "lockstep/state.h"
#include "state/internal.h"

namespace lockstep {
namespace {
using state_internal::Json;
using state_internal::SafetensorsEntry, state_internal::SafetensorsHeader;

static_assert(std::endian::native == std::endian::little, "lockstep assumes little-endian");
constexpr std::string_view kMetadataKey = "__metadata__";

// The safetensors reference implementation refuses headers over 100 MB; so does lockstep, so that
// a damaged length cannot make a header-only read allocate the size of a whole file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::vector<uint8_t> Serialize(std::span<const NamedTensor> tensors,
                               const std::map<std::string, std::string>& metadata,
                               std::string_view what) {
  std::vector<TensorShape> shapes;
  uint64_t data_size = 0;
  for (const NamedTensor& t : tensors) {
    const std::string tensor_what = fmt::format("{}: tensor '{}'", what, t.name);
    const uint64_t count = state_internal::ElementCount(t.shape, tensor_what);
    if (count != static_cast<uint64_t>(t.data.elements())) {
      Fail("{}: shape [{}] has {} elements but the data has {}", tensor_what,
           fmt::join(t.shape, ", "), count, t.data.elements());
    }
    shapes.push_back({t.name, t.shape, t.data.dtype()});
    data_size += t.data.bytes().size();
  }
  const std::string header = state_internal::SafetensorsHeaderBytes(shapes, metadata, what);
  std::vector<uint8_t> bytes(header.begin(), header.end());
  bytes.reserve(header.size() + data_size);
  for (const NamedTensor& t : tensors) {
    const auto* data = reinterpret_cast<const uint8_t*>(t.data.bytes().data());
    bytes.insert(bytes.end(), data, data + t.data.bytes().size());
  }
  return bytes;
}

std::map<std::string, std::string> ParseMetadata(const Json& value, std::string_view what) {
  if (!value.is_object()) {
    Fail("{}: \"{}\" must be an object of strings, got {}", what, kMetadataKey, ShownJson(value));
  }
  std::map<std::string, std::string> metadata;
  for (const auto& [key, entry] : value.items()) {
    if (!entry.is_string()) {
      Fail("{}: \"{}\" entry \"{}\" must be a string, got {}", what, kMetadataKey, key,
           ShownJson(entry));
    }
    metadata.emplace(key, entry.get<std::string>());
  }
  return metadata;
}

// One header entry, validated on its own; the offsets are checked together afterwards.
SafetensorsEntry ParseEntry(const std::string& name, const Json& info, uint64_t data_size,
                            std::string_view file, SafetensorsDtypes accept) {
  const std::string what = fmt::format("{}: tensor '{}'", file, name);
  if (name.empty()) Fail("{}: a tensor has an empty name", file);
  RequireKeys(info, {"dtype", "shape", "data_offsets"}, what);
  const Json& dtype_name = info["dtype"];
  const auto info_of = std::ranges::find_if(Dtypes(), [&](const DtypeInfo& d) {
    return dtype_name.is_string() && dtype_name.get_ref<const std::string&>() == d.safetensors;
  });
  if (accept == SafetensorsDtypes::kF32 && dtype_name != "F32") {
    Fail("{}: dtype {} is not supported (lockstep reads F32 only here)", what,
         ShownJson(dtype_name));
  }
  if (info_of == Dtypes().end()) {
    std::vector<std::string_view> names;
    for (const DtypeInfo& d : Dtypes()) names.push_back(d.safetensors);
    Fail("{}: dtype {} is not supported (lockstep reads {})", what, ShownJson(dtype_name),
         fmt::join(names, ", "));
  }
  const Json& shape = info["shape"];
  if (!shape.is_array()) Fail("{}: shape must be an array, got {}", what, ShownJson(shape));
  SafetensorsEntry entry{.name = name, .shape = {}, .dtype = info_of->dtype, .begin = 0, .end = 0};
  for (const Json& dim : shape) {
    const uint64_t d = AsU64(dim, what + ": shape entry");
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      Fail("{}: shape entry {} is too large", what, d);
    }
    entry.shape.push_back(static_cast<int64_t>(d));
  }
  const Json& offsets = info["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    Fail("{}: data_offsets must be [begin, end], got {}", what, ShownJson(offsets));
  }
  entry.begin = AsU64(offsets[0], what + ": data_offsets[0]");
  entry.end = AsU64(offsets[1], what + ": data_offsets[1]");
  if (entry.begin > entry.end || entry.end > data_size) {
    Fail("{}: data_offsets [{}, {}] out of range (the data section holds {} bytes)", what,
         entry.begin, entry.end, data_size);
  }
  const uint64_t count = state_internal::ElementCount(entry.shape, what);
  const auto size = static_cast<uint64_t>(info_of->size);
  if (count > std::numeric_limits<uint64_t>::max() / size ||
      count * size != entry.end - entry.begin) {
    Fail("{}: shape [{}] needs {} bytes of {} but data_offsets [{}, {}] span {}", what,
         fmt::join(entry.shape, ", "), count * size, info_of->safetensors, entry.begin, entry.end,
         entry.end - entry.begin);
  }
  return entry;
}
}  // namespace

std::vector<uint8_t> SafetensorsBytes(std::span<const NamedTensor> tensors,
                                      const std::map<std::string, std::string>& metadata) {
  return Serialize(tensors, metadata, "safetensors");
}

void WriteSafetensors(const std::filesystem::path& path, std::span<const NamedTensor> tensors,
                      const std::map<std::string, std::string>& metadata) {
  StagedFile staged(path, OutputKind::kFile);
  staged.file().Write(Serialize(tensors, metadata, path.string()));
  staged.Commit();
}

SafetensorsFile ParseSafetensors(std::vector<uint8_t> bytes, const std::filesystem::path& path,
                                 SafetensorsDtypes accept) {
  const uint64_t header_size = state_internal::SafetensorsHeaderLength(
      std::span(bytes).first(std::min<size_t>(8, bytes.size())), bytes.size(), path);
  SafetensorsHeader header = state_internal::ParseSafetensorsHeader(
      std::string_view(reinterpret_cast<const char*>(bytes.data()) + 8, header_size),
      bytes.size() - 8 - header_size, path, accept);

  SafetensorsFile result;
  result.path_ = path;
  result.metadata_ = std::move(header.metadata);
  // The data starts 8-aligned (the canonical header is padded to a multiple of 8), so every
  // tensor of a file of 4-byte elements is aligned. A tensor after an odd-sized one (an i8
  // tensor of odd length before an f32 one) is not: then each tensor is copied to an offset
  // that is a multiple of 8.
  std::vector<uint64_t> at;
  const bool aligned = std::ranges::all_of(header.entries, [&](const SafetensorsEntry& e) {
    return (header.data_start + e.begin) % static_cast<uint64_t>(InfoOf(e.dtype).size) == 0;
  });
  if (aligned) {
    for (const SafetensorsEntry& e : header.entries) at.push_back(header.data_start + e.begin);
    result.bytes_ = std::move(bytes);
  } else {
    uint64_t size = 0;
    for (const SafetensorsEntry& e : header.entries) {
      at.push_back((size + 7) / 8 * 8);
      size = at.back() + (e.end - e.begin);
    }
    result.bytes_.resize(size);
    for (size_t i = 0; i < header.entries.size(); ++i) {
      const SafetensorsEntry& e = header.entries[i];
      std::memcpy(result.bytes_.data() + at[i], bytes.data() + header.data_start + e.begin,
                  e.end - e.begin);
    }
  }
  for (size_t i = 0; i < header.entries.size(); ++i) {
    SafetensorsEntry& e = header.entries[i];
    const int64_t elements = static_cast<int64_t>(e.end - e.begin) / InfoOf(e.dtype).size;
    result.tensors_.push_back(
        {.name = std::move(e.name),
         .shape = std::move(e.shape),
         .data = TensorView(e.dtype, result.bytes_.data() + at[i], elements)});
  }
  return result;
}

SafetensorsFile ReadSafetensors(const std::filesystem::path& path, SafetensorsDtypes accept) {
  return ParseSafetensors(ReadFileBytes(path), path, accept);
}

const NamedTensor& SafetensorsFile::Get(std::string_view name) const {
  for (const NamedTensor& t : tensors_) {
    if (t.name == name) return t;
  }
  Fail("{}: no tensor named '{}'", path_.string(), name);
}

namespace state_internal {

uint64_t SafetensorsHeaderLength(std::span<const uint8_t> first_bytes, uint64_t file_size,
                                 const std::filesystem::path& path) {
  if (file_size < 8) {
    Fail("{}: {} bytes, too short for a safetensors file (the header length alone is 8)",
         path.string(), file_size);
  }
  uint64_t header_size;
  std::memcpy(&header_size, first_bytes.data(), 8);
  if (header_size > file_size - 8) {
    Fail("{}: header length {} exceeds the {} bytes that follow it", path.string(), header_size,
         file_size - 8);
  }
  if (header_size > kMaxHeaderBytes) {
    Fail("{}: header length {} exceeds the safetensors limit of {} bytes", path.string(),
         header_size, kMaxHeaderBytes);
  }
  return header_size;
}

SafetensorsHeader ParseSafetensorsHeader(std::string_view json, uint64_t data_size,
                                         const std::filesystem::path& path,
                                         SafetensorsDtypes accept) {
  const std::string file = path.string();
  const Json header = ParseJsonStrict(json, file + ": header");
  if (!header.is_object())
    Fail("{}: header must be a JSON object, got {}", file, ShownJson(header));

  SafetensorsHeader result{.data_start = 8 + json.size(), .entries = {}, .metadata = {}};
  for (const auto& [name, info] : header.items()) {
    if (name == kMetadataKey) {
      result.metadata = ParseMetadata(info, file);
    } else {
      result.entries.push_back(ParseEntry(name, info, data_size, file, accept));
    }
  }
  // File order is data order; the name breaks ties between empty tensors.
  std::sort(result.entries.begin(), result.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  uint64_t covered = 0;
  for (const SafetensorsEntry& e : result.entries) {
    if (e.begin != covered) {
      Fail("{}: tensor '{}' data_offsets [{}, {}] {} (the previous tensor ends at {})", file,
           e.name, e.begin, e.end,
           e.begin < covered ? "overlap the previous tensor" : "leave a gap", covered);
    }
    covered = e.end;
  }
  if (covered != data_size) {
    Fail("{}: the tensors cover {} bytes but the data section holds {}", file, covered, data_size);
  }
  // One form only: the header bytes must be those lockstep writes for these tensors, so that
  // no two files with the same tensors differ (docs/formats/checkpoint.md, "Tensor files").
  std::vector<TensorShape> shapes;
  for (const SafetensorsEntry& e : result.entries) shapes.push_back({e.name, e.shape, e.dtype});
  const std::string canonical = SafetensorsHeaderBytes(shapes, result.metadata, file);
  if (std::string_view(canonical).substr(8) != json) {
    Fail("{}: the header is not in canonical form (compact JSON, keys sorted by byte, "
         "\"__metadata__\" only when non-empty, spaces to a multiple of 8 bytes: "
         "docs/formats/checkpoint.md); its {} bytes differ from the canonical {} for the same "
         "tensors",
         file, json.size(), canonical.size() - 8);
  }
  return result;
}

SafetensorsHeader ReadSafetensorsHeader(const File& file, uint64_t file_size) {
  std::array<uint8_t, 8> length_bytes{};
  const auto first = std::span(length_bytes).first(std::min<uint64_t>(8, file_size));
  file.ReadAt(0, first);
  const uint64_t header_size = SafetensorsHeaderLength(first, file_size, file.path());
  std::string json(header_size, '\0');
  file.ReadAt(8, std::span(reinterpret_cast<uint8_t*>(json.data()), json.size()));
  return ParseSafetensorsHeader(json, file_size - 8 - header_size, file.path());
}

std::string SafetensorsHeaderBytes(std::span<const TensorShape> tensors,
                                   const std::map<std::string, std::string>& metadata,
                                   std::string_view what) {
  Json header = Json::object();
  std::set<std::string_view> names;
  uint64_t data_size = 0;
  for (const TensorShape& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) {
      Fail("{}: invalid tensor name '{}' (empty or reserved)", what, t.name);
    }
    if (!names.insert(t.name).second) Fail("{}: duplicate tensor name '{}'", what, t.name);
    const DtypeInfo& info = InfoOf(t.dtype);
    const uint64_t bytes = static_cast<uint64_t>(info.size) *
                           ElementCount(t.shape, fmt::format("{}: tensor '{}'", what, t.name));
    header[t.name] = {{"dtype", info.safetensors},
                      {"shape", t.shape},
                      {"data_offsets", {data_size, data_size + bytes}}};
    data_size += bytes;
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;

  std::string text;
  try {
    text = header.dump();  // nlohmann::json keeps object keys sorted: the bytes are canonical
  } catch (const Json::exception& e) {
    Fail("{}: cannot encode the header (tensor names and metadata must be UTF-8): {}", what,
         e.what());
  }
  // The format allows trailing spaces in the header; padding to 8 aligns the data.
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const uint64_t header_size = text.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &header_size, 8);
  return bytes + text;
}

}  // namespace state_internal
}  // namespace lockstep
