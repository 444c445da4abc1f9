// safetensors: round trip, byte determinism, and an error naming the file for every kind of
// malformed input.
#include <algorithm>
#include <bit>
#include <cstring>

#include "state/internal.h"
#include "state/state_fixtures.h"

namespace lockstep {
namespace {
using test::ExpectError;

class SafetensorsTest : public test::ScratchDirTest {};

const std::vector<float> kMatrix = {1.0f, -2.5f, 0.0f, -0.0f, 1e-40f, 3.0f};
const std::vector<float> kScalar = {42.0f};

std::vector<NamedTensor> SampleTensors() {
  // Deliberately not in name order: the data must be laid out in the given order.
  return {{"z.weight", {2, 3}, kMatrix}, {"a.scalar", {}, kScalar}, {"empty", {0, 4}, {}}};
}

// A file made of a hand-written header (padded as the writer pads) and `data_size` zero bytes.
std::vector<uint8_t> FileWithHeader(std::string header, size_t data_size) {
  header.resize((header.size() + 7) / 8 * 8, ' ');
  std::vector<uint8_t> bytes(8 + header.size() + data_size, 0);
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  std::memcpy(bytes.data() + 8, header.data(), header.size());
  return bytes;
}

void ExpectParseError(const std::vector<uint8_t>& bytes, std::initializer_list<std::string> words) {
  ExpectError([&] { ParseSafetensors(bytes, "bad.safetensors"); }, {"bad.safetensors"});
  ExpectError([&] { ParseSafetensors(bytes, "bad.safetensors"); }, words);
}

TEST_F(SafetensorsTest, RoundTripKeepsOrderShapesBitsAndMetadata) {
  const auto path = dir_ / "t.safetensors";
  const std::vector<NamedTensor> tensors = SampleTensors();
  const std::map<std::string, std::string> metadata = {{"step", "7"}, {"format", "x"}};
  WriteSafetensors(path, tensors, metadata);

  const SafetensorsFile file = ReadSafetensors(path);
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.metadata(), metadata);
  ASSERT_EQ(file.tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const NamedTensor& got = file.tensors()[i];
    EXPECT_EQ(got.name, tensors[i].name);
    EXPECT_EQ(got.shape, tensors[i].shape);
    EXPECT_EQ(got.data.dtype(), Dtype::kF32);
    ASSERT_EQ(got.data.elements(), tensors[i].data.elements());
    EXPECT_TRUE(std::ranges::equal(got.data.bytes(), tensors[i].data.bytes()))
        << got.name;  // (not memcmp: an empty tensor's data() may be null)
  }
  EXPECT_EQ(std::bit_cast<uint32_t>(file.Get("z.weight").data.As<float>()[3]),
            0x80000000u);  // -0.0 kept
  ExpectError([&] { file.Get("missing"); }, {path.string(), "missing"});
}

TEST_F(SafetensorsTest, BytesAreCanonical) {
  const std::vector<uint8_t> a = SafetensorsBytes(SampleTensors(), {{"k", "v"}});
  const std::vector<uint8_t> b = SafetensorsBytes(SampleTensors(), {{"k", "v"}});
  EXPECT_EQ(a, b);
  WriteSafetensors(dir_ / "t.safetensors", SampleTensors(), {{"k", "v"}});
  EXPECT_EQ(ReadFileBytes(dir_ / "t.safetensors"), a);

  uint64_t header_size;
  std::memcpy(&header_size, a.data(), 8);
  EXPECT_EQ(header_size % 8, 0u);
  const std::string header(a.begin() + 8, a.begin() + 8 + static_cast<int64_t>(header_size));
  EXPECT_EQ(header, R"({"__metadata__":{"k":"v"},"a.scalar":{"data_offsets":[24,28],"dtype":"F32",)"
                    R"("shape":[]},"empty":{"data_offsets":[28,28],"dtype":"F32","shape":[0,4]},)"
                    R"("z.weight":{"data_offsets":[0,24],"dtype":"F32","shape":[2,3]}}     )");
  EXPECT_EQ(a.size(), 8 + header_size + 28);
  // No metadata: no "__metadata__" entry.
  const std::vector<uint8_t> bare = SafetensorsBytes(SampleTensors(), {});
  EXPECT_EQ(std::string(bare.begin(), bare.end()).find("__metadata__"), std::string::npos);
}

TEST_F(SafetensorsTest, WriterRejectsBadTensors) {
  const std::vector<float> three(3);
  const auto write = [&](std::vector<NamedTensor> tensors) {
    WriteSafetensors(dir_ / "w.safetensors", tensors, {});
  };
  const std::vector<NamedTensor> short_data = {{"a", {2, 2}, three}};
  ExpectError([&] { write(short_data); },
              {"w.safetensors", "'a'", "[2, 2] has 4 elements", "data has 3"});
  ExpectError([&] { write({{"a", {3}, three}, {"a", {3}, three}}); }, {"duplicate", "'a'"});
  ExpectError([&] { write({{"__metadata__", {3}, three}}); }, {"reserved"});
  ExpectError([&] { write({{"", {3}, three}}); }, {"empty"});
  ExpectError([&] { write({{"a", {-1, -3}, three}}); }, {"negative dimension -1"});
}

TEST_F(SafetensorsTest, TruncatedOrMisSizedFilesNameTheFile) {
  const std::vector<uint8_t> good = SafetensorsBytes(SampleTensors(), {});
  ExpectParseError({good.begin(), good.begin() + 5}, {"5 bytes", "too short"});
  ExpectParseError({good.begin(), good.end() - 4}, {"'a.scalar'", "[24, 28] out of range"});
  std::vector<uint8_t> long_header = good;
  long_header[6] = 1;  // header length 2^48 + ...
  ExpectParseError(long_header, {"header length", "exceeds"});

  // Written to disk and truncated: the reader names the path.
  const auto path = dir_ / "cut.safetensors";
  WriteFileSynced(path, std::span(good).first(good.size() - 1));
  ExpectError([&] { ReadSafetensors(path); }, {path.string(), "out of range"});
  // Extra bytes after the last tensor are refused too.
  std::vector<uint8_t> longer = good;
  longer.resize(good.size() + 4);
  ExpectParseError(longer, {"cover 28 bytes", "holds 32"});
}

// Every dtype of lockstep/tensor.h round-trips under its safetensors name for a reader that
// accepts them all, each tensor aligned to its elements even after an odd-sized one; a reader of
// F32 alone refuses the others, naming the tensor and the dtype.
TEST_F(SafetensorsTest, EveryDtypeRoundTripsAlignedAndAnF32ReaderRefusesTheOthers) {
  const std::vector<int8_t> i8 = {-127, 0, 5};  // 3 bytes: what follows starts unaligned
  const std::vector<double> f64 = {1.0 / 3, -0.0};
  const std::vector<uint32_t> u32 = {7, 0xffffffffu};
  const std::vector<int32_t> i32 = {-(1 << 30), 3};
  const std::vector<BFloat16> bf16 = {{0x3f80}, {0x7fc0}, {0x8000}};
  const std::vector<float> f32 = {2.5f};
  const std::vector<NamedTensor> tensors = {{"i8", {3}, i8},     {"f64", {2}, f64},
                                            {"bf16", {3}, bf16}, {"u32", {2}, u32},
                                            {"i32", {2}, i32},   {"f32", {1}, f32}};
  const std::vector<uint8_t> bytes = SafetensorsBytes(tensors, {});
  const std::string header(bytes.begin() + 8, bytes.end());
  for (const char* name : {"\"I8\"", "\"F64\"", "\"BF16\"", "\"U32\"", "\"I32\"", "\"F32\""}) {
    EXPECT_NE(header.find(name), std::string::npos) << name;
  }
  const SafetensorsFile file = ParseSafetensors(bytes, "any", SafetensorsDtypes::kAny);
  for (const NamedTensor& want : tensors) {
    const NamedTensor& got = file.Get(want.name);
    EXPECT_EQ(got.data.dtype(), want.data.dtype()) << want.name;
    EXPECT_EQ(got.shape, want.shape) << want.name;
    EXPECT_TRUE(std::ranges::equal(got.data.bytes(), want.data.bytes())) << want.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got.data.data()) %
                  static_cast<uintptr_t>(InfoOf(got.data.dtype()).size),
              0u)
        << want.name;
  }
  EXPECT_EQ(file.Get("f64").data.As<double>()[0], 1.0 / 3);
  ExpectError([&] { ParseSafetensors(bytes, "f32.safetensors"); },
              {"f32.safetensors", "'bf16'", "dtype \"BF16\"", "F32 only"});
  ExpectError(
      [&] {
        ParseSafetensors(
            FileWithHeader(R"({"a":{"data_offsets":[0,4],"dtype":"F16","shape":[2]}})", 4), "f16",
            SafetensorsDtypes::kAny);
      },
      {"'a'", "dtype \"F16\"", "BF16"});
}

TEST_F(SafetensorsTest, MalformedHeadersNameTheProblem) {
  ExpectParseError(FileWithHeader(R"({"a": {"dtype": "F32", )", 0), {"invalid JSON"});
  ExpectParseError(FileWithHeader("[1, 2]", 0), {"must be a JSON object"});
  ExpectParseError(FileWithHeader(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4),
                   {"'a'", "dtype \"F16\"", "F32 only"});
  ExpectParseError(FileWithHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8),
                   {"'a'", "[0, 16] out of range", "8 bytes"});
  ExpectParseError(FileWithHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,0]}})", 8),
                   {"'a'", "[4, 0] out of range"});
  ExpectParseError(FileWithHeader(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                   {"'a'", "[3] needs 12 bytes", "span 8"});
  ExpectParseError(FileWithHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                  12),
                   {"'b'", "[4, 12] overlap", "ends at 8"});
  ExpectParseError(FileWithHeader(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                  12),
                   {"'b'", "leave a gap"});
  ExpectParseError(FileWithHeader(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                   {"'a'", "shape entry", "unsigned integer", "-2"});
  ExpectParseError(
      FileWithHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8),
      {"'a'", "unknown field \"x\""});
  ExpectParseError(FileWithHeader(R"({"a":{"dtype":"F32","shape":[2]}})", 8),
                   {"'a'", "missing field \"data_offsets\""});
  ExpectParseError(FileWithHeader(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                  R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                  4),
                   {"duplicate key \"a\""});
  ExpectParseError(FileWithHeader(R"({"__metadata__":{"k":1}})", 0), {"\"k\"", "must be a string"});
}

// One form only: the same tensors under a header another writer formatted (its own key order,
// no padding, spaces, an empty __metadata__) are refused; the canonical bytes are read.
TEST_F(SafetensorsTest, OnlyTheCanonicalHeaderIsRead) {
  const auto file_with = [](const std::string& header) {
    std::vector<uint8_t> bytes(8 + header.size() + 8);
    const uint64_t n = header.size();
    std::memcpy(bytes.data(), &n, 8);
    std::memcpy(bytes.data() + 8, header.data(), header.size());
    const float values[2] = {1.5f, -7.0f};
    std::memcpy(bytes.data() + 8 + header.size(), values, 8);
    return bytes;
  };
  // The canonical header: compact, keys sorted, padded with spaces to 56 bytes.
  const std::string canonical = R"({"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})";
  const SafetensorsFile file =
      ParseSafetensors(file_with(canonical + std::string(56 - canonical.size(), ' ')), "ok");
  ASSERT_EQ(file.Get("a").data.elements(), 2);
  EXPECT_EQ(file.Get("a").data.As<float>()[1], -7.0f);
  for (const std::string& foreign :
       {std::string(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})"),  // key order
        canonical,                                                                   // unpadded
        std::string(R"({"a": {"data_offsets": [0, 8], "dtype": "F32", "shape": [2]}})"),
        std::string(R"({"__metadata__":{},"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})")}) {
    std::string padded = foreign;
    if (foreign != canonical) padded.resize((foreign.size() + 7) / 8 * 8, ' ');
    ExpectError([&] { ParseSafetensors(file_with(padded), "foreign.safetensors"); },
                {"foreign.safetensors", "not in canonical form"});
  }
}

TEST_F(SafetensorsTest, HeaderOnlyReadValidatesAsParseDoes) {
  const std::map<std::string, std::string> metadata = {{"k", "v"}};
  const std::vector<uint8_t> bytes = SafetensorsBytes(SampleTensors(), metadata);
  const auto path = dir_ / "t.safetensors";
  WriteFileSynced(path, bytes);
  const SafetensorsFile parsed = ParseSafetensors(bytes, path);
  const auto file = File::OpenForReading(path);
  const state_internal::SafetensorsHeader header =
      state_internal::ReadSafetensorsHeader(file, file.Size());
  EXPECT_EQ(header.metadata, metadata);
  ASSERT_EQ(header.entries.size(), parsed.tensors().size());
  for (size_t i = 0; i < header.entries.size(); ++i) {
    const state_internal::SafetensorsEntry& e = header.entries[i];
    EXPECT_EQ(e.name, parsed.tensors()[i].name);
    EXPECT_EQ(e.shape, parsed.tensors()[i].shape);
    EXPECT_EQ(0, std::memcmp(bytes.data() + header.data_start + e.begin,
                             parsed.tensors()[i].data.data(), e.end - e.begin))
        << e.name;
  }
  // The bytes in front of the data are the header SafetensorsBytes writes.
  std::vector<TensorShape> shapes;
  for (const NamedTensor& t : SampleTensors()) shapes.push_back({t.name, t.shape});
  const std::string prefix = state_internal::SafetensorsHeaderBytes(shapes, metadata, "t");
  EXPECT_EQ(prefix.size(), header.data_start);
  EXPECT_EQ(prefix,
            std::string(bytes.begin(), bytes.begin() + static_cast<int64_t>(prefix.size())));

  // The same checks, on the header alone: a file one byte short of its offsets.
  const auto cut = dir_ / "cut.safetensors";
  WriteFileSynced(cut, std::span(bytes).first(bytes.size() - 1));
  const auto cut_file = File::OpenForReading(cut);
  ExpectError([&] { state_internal::ReadSafetensorsHeader(cut_file, cut_file.Size()); },
              {cut.string(), "'a.scalar'", "out of range"});
  WriteFileSynced(cut, std::span(bytes).first(5));
  const auto short_file = File::OpenForReading(cut);
  ExpectError([&] { state_internal::ReadSafetensorsHeader(short_file, short_file.Size()); },
              {cut.string(), "5 bytes", "too short"});

  // A damaged length inside a large file: refused without reading (or allocating) that much.
  // The file is sparse, so it takes no disk space.
  const auto large = dir_ / "large.safetensors";
  const uint64_t length = 100'000'008;
  WriteFileSynced(large, std::span(reinterpret_cast<const uint8_t*>(&length), 8));
  std::filesystem::resize_file(large, 8 + length + 8);
  const auto large_file = File::OpenForReading(large);
  ExpectError([&] { state_internal::ReadSafetensorsHeader(large_file, large_file.Size()); },
              {large.string(), "header length 100000008", "limit of 100000000"});
}

}  // namespace
}  // namespace lockstep
