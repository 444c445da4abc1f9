// The verified parameter load: checkpoint -> config -> parameters.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "lockstep/json.h"

#include "lockstep/infer.h"

namespace lockstep::infer {

RunConfig ConfigOfCheckpoint(const Checkpoint& checkpoint) {
  return ConfigOfDescriptor(checkpoint.state.descriptor,
                            (checkpoint.dir / RunLayout::kMeta).string() + " descriptor");
}

RunConfig ConfigOfCheckpoint(const CheckpointIndex& checkpoint) {
  return ConfigOfDescriptor(checkpoint.state.descriptor,
                            (checkpoint.dir / RunLayout::kMeta).string() + " descriptor");
}

VerifiedModel LoadVerified(const std::filesystem::path& dir) {
  const CheckpointIndex ckpt = OpenCheckpoint(dir);
  RunConfig config = ConfigOfCheckpoint(ckpt);
  // The tensors must be those the recorded config makes, in its order: a descriptor that does
  // not match them names the checkpoint, not a model of another shape.
  std::vector<ParamSpec> specs = ParameterSpecs(config.model);
  if (ckpt.tensors.size() != specs.size()) {
    Fail("{}: holds {} tensors; its descriptor's model has {}", dir.string(), ckpt.tensors.size(),
         specs.size());
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorShape& t = ckpt.tensors[i];
    if (t.name != specs[i].name || t.shape != specs[i].shape) {
      Fail("{}: tensor {} is '{}' [{}]; its descriptor's model has '{}' [{}]", dir.string(), i,
           t.name, fmt::join(t.shape, ", "), specs[i].name, fmt::join(specs[i].shape, ", "));
    }
  }
  ParamStore params(std::move(specs));
  VerifyStreamedHash(ckpt,
                     StreamCheckpoint(ckpt, kCheckpointPieceFloats,
                                      [&](size_t i, StateArray a, int64_t begin,
                                          std::span<const float> piece, std::span<const Digest>) {
                                        if (a != StateArray::kParam) return;
                                        std::ranges::copy(piece, params.Tensor(i).begin() + begin);
                                      }));
  CheckWeightScales(config.model, params, dir.string());
  return {dir,
          std::move(config),
          ckpt.state.descriptor,
          ckpt.state_hash,
          ckpt.state.step,
          std::move(params)};
}

data::Dataset OpenTrainingData(const VerifiedModel& model, const std::filesystem::path& data) {
  data::Dataset dataset = data::OpenDataset(data);
  const nlohmann::json descriptor =
      ParseJsonStrict(model.descriptor, model.dir.string() + " descriptor");
  const std::string want = descriptor.value("data_manifest_blake2b", std::string());
  const std::string have = ToHex(dataset.manifest_digest());
  if (want != have) {
    Fail(
        "{}: its manifest.json has BLAKE2b {}, but checkpoint {} was trained on the dataset "
        "whose manifest has {} (descriptor field data_manifest_blake2b)",
        data.string(), have, model.dir.string(), want);
  }
  return dataset;
}

namespace {
// The byte tokenizer (docs/tokenizers.md): each byte its own id, data::kEodToken ends documents.
class ByteTokenizer final : public data::Tokenizer {
 public:
  const data::Vocabulary& vocabulary() const override { return vocabulary_; }
  std::vector<uint32_t> Encode(std::string_view text, std::string_view what) const override {
    const auto bytes = std::as_bytes(std::span(text));
    const std::span<const uint8_t> u8(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    data::ValidateUtf8(u8, what);
    return data::TokenizeBytes(u8);
  }
  std::string Decode(std::span<const uint32_t> ids) const override {
    std::string text;
    for (const uint32_t id : ids) {
      if (id < 256) text.push_back(static_cast<char>(id));
    }
    return text;
  }

 private:
  data::Vocabulary vocabulary_;
};
}  // namespace

std::unique_ptr<data::Tokenizer> OpenTrainingTokenizer(const data::Dataset& dataset) {
  const data::Vocabulary& v = dataset.vocabulary();
  if (v.bytes()) return std::make_unique<ByteTokenizer>();
  const std::optional<std::filesystem::path> file = data::DatasetTokenizerFile(dataset);
  if (!file) {
    Fail("{}: the dataset's tokenizer file {} (manifest tokenizer.name) is not there",
         dataset.dir().string(), v.tokenizer_file);
  }
  return data::OpenTokenizer(*file);
}

std::vector<uint32_t> ReadTokenFile(const std::filesystem::path& path, uint64_t min_ids,
                                    uint64_t max_ids, std::string_view what_max, int64_t vocab) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::is_regular_file(status)) {
    Fail("{}: not a regular file of little-endian uint32 token ids", path.string());
  }
  const uint64_t bytes = std::filesystem::file_size(path, ec);
  if (ec) Fail("{}: cannot read its size: {}", path.string(), ec.message());
  if (bytes % 4 != 0 || bytes / 4 < min_ids || bytes / 4 > max_ids) {
    Fail("{}: {} bytes; expected little-endian uint32 token ids, {} to {} of them ({})",
         path.string(), bytes, min_ids, max_ids, what_max);
  }
  const std::vector<uint8_t> data = ReadFileBytes(path);
  if (data.size() != bytes) Fail("{}: changed size while it was read", path.string());
  std::vector<uint32_t> ids(bytes / 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = uint32_t(data[4 * i]) | uint32_t(data[4 * i + 1]) << 8 |
             uint32_t(data[4 * i + 2]) << 16 | uint32_t(data[4 * i + 3]) << 24;
    if (ids[i] >= static_cast<uint64_t>(vocab)) {
      Fail("{}: token {} is {}, outside the vocabulary (model.vocab = {})", path.string(), i,
           ids[i], vocab);
    }
  }
  return ids;
}

}  // namespace lockstep::infer
