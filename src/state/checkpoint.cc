// Checkpoint directories (docs/formats/checkpoint.md): written to a temporary sibling, every
// file fsynced, COMPLETE last, then renamed into place; read back only after every file has
// been checked against COMPLETE.
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <system_error>

#include "lockstep/state.h"
#include "state/internal.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;
using state_internal::Json;

constexpr char kModelFile[] = "model.safetensors";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
constexpr char kGradsFile[] = "grads.safetensors";
constexpr char kMetaFile[] = "meta.json";
constexpr char kCompleteFile[] = "COMPLETE";
constexpr char kMetaFormat[] = "lockstep-checkpoint";
constexpr char kCompleteFormat[] = "lockstep-checkpoint-complete";
constexpr char kTempPrefix[] = ".tmp-";
constexpr char kExpAvg[] = ".exp_avg";
constexpr char kExpAvgSq[] = ".exp_avg_sq";

std::string StepDirName(uint64_t step) { return fmt::format("step_{:09d}", step); }

// The step of a canonical "step_%09d" name; nullopt for anything else.
std::optional<uint64_t> StepOfDirName(std::string_view name) {
  constexpr std::string_view kPrefix = "step_";
  if (!name.starts_with(kPrefix)) return std::nullopt;
  const std::string_view digits = name.substr(kPrefix.size());
  uint64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size() || StepDirName(step) != name) {
    return std::nullopt;
  }
  return step;
}

// Each tensor file records what it holds and for which step, so that a file moved between
// checkpoints is caught even though its own digest is intact.
std::map<std::string, std::string> FileMetadata(std::string_view content, uint64_t step) {
  return {{"format", kMetaFormat},
          {"format_version", std::to_string(kCheckpointFormatVersion)},
          {"content", std::string(content)},
          {"step", std::to_string(step)}};
}

// Floats are stored as the hex of their IEEE bits: exact for every value, NaN payloads included,
// which a JSON number is not.
std::string FloatBits(float value) { return fmt::format("{:08x}", std::bit_cast<uint32_t>(value)); }

float FloatFromBits(const Json& meta, const char* key, std::string_view what) {
  const std::string text = state_internal::StringField(meta, key, what);
  uint32_t bits = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), bits, 16);
  const bool lowercase_hex = std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
  if (text.size() != 8 || !lowercase_hex || ec != std::errc() || end != text.data() + 8) {
    Fail("{}: field \"{}\": '{}' is not 8 lowercase hex digits (the float's IEEE bits)", what, key,
         text);
  }
  return std::bit_cast<float>(bits);
}

std::string DumpJson(const Json& value, std::string_view what) {
  try {
    return value.dump(2) + "\n";
  } catch (const Json::exception& e) {
    Fail("{}: cannot encode as JSON (strings must be UTF-8): {}", what, e.what());
  }
}

std::string MetaJson(const StepState& s, const Digest& state_hash) {
  const Json meta = {
      {"format", kMetaFormat},
      {"format_version", kCheckpointFormatVersion},
      {"step", s.step},
      {"optimizer_step", s.optimizer_step},
      {"lr_bits", FloatBits(s.lr)},
      {"grad_norm_bits", FloatBits(s.grad_norm)},
      {"clip_factor_bits", FloatBits(s.clip_factor)},
      {"skipped", s.skipped},
      {"tokens_digest", ToHex(s.tokens_digest)},
      {"rng_seed", s.rng_seed},
      {"rng_counter", s.rng_counter},
      {"data_cursor", s.data_cursor},
      {"spike", {{"total_skips", s.spike.total_skips}, {"recent_skips", s.spike.recent_skips}}},
      {"prev_hash", ToHex(s.prev_hash)},
      // A string, not an embedded object: the hash covers these exact bytes, which re-encoding
      // an object could change.
      {"descriptor", s.descriptor},
      {"state_hash", ToHex(state_hash)},
  };
  return DumpJson(meta, "checkpoint meta.json");
}

std::pair<StepState, Digest> ParseMeta(std::string_view text, const std::string& what) {
  const Json meta = state_internal::ParseJsonStrict(text, what);
  state_internal::RequireKeys(
      meta,
      {"format", "format_version", "step", "optimizer_step", "lr_bits", "grad_norm_bits",
       "clip_factor_bits", "skipped", "tokens_digest", "rng_seed", "rng_counter", "data_cursor",
       "spike", "prev_hash", "descriptor", "state_hash"},
      what);
  state_internal::RequireFormat(meta, kMetaFormat, kCheckpointFormatVersion, what);
  using state_internal::U64Field, state_internal::DigestField;
  StepState s;
  s.step = U64Field(meta, "step", what);
  s.optimizer_step = U64Field(meta, "optimizer_step", what);
  s.lr = FloatFromBits(meta, "lr_bits", what);
  s.grad_norm = FloatFromBits(meta, "grad_norm_bits", what);
  s.clip_factor = FloatFromBits(meta, "clip_factor_bits", what);
  if (!meta["skipped"].is_boolean()) {
    Fail("{}: field \"skipped\": expected true or false, got {}", what,
         state_internal::Shown(meta["skipped"]));
  }
  s.skipped = meta["skipped"].get<bool>();
  s.tokens_digest = DigestField(meta, "tokens_digest", what);
  s.rng_seed = U64Field(meta, "rng_seed", what);
  s.rng_counter = U64Field(meta, "rng_counter", what);
  s.data_cursor = U64Field(meta, "data_cursor", what);
  const Json& spike = meta["spike"];
  const std::string spike_what = what + ": spike";
  state_internal::RequireKeys(spike, {"total_skips", "recent_skips"}, spike_what);
  s.spike.total_skips = U64Field(spike, "total_skips", spike_what);
  if (!spike["recent_skips"].is_array()) {
    Fail("{}: field \"recent_skips\": expected an array, got {}", spike_what,
         state_internal::Shown(spike["recent_skips"]));
  }
  for (const Json& step : spike["recent_skips"]) {
    s.spike.recent_skips.push_back(state_internal::AsU64(step, spike_what + ": recent_skips"));
  }
  s.prev_hash = DigestField(meta, "prev_hash", what);
  s.descriptor = state_internal::StringField(meta, "descriptor", what);
  return {std::move(s), DigestField(meta, "state_hash", what)};
}

// Reads a file listed in COMPLETE and checks it against its listed size and (unless `digests`
// is kIgnore) its digest.
std::vector<uint8_t> ReadListedFile(const fs::path& dir, const char* name, const Json& files,
                                    const std::string& complete_what, FileDigests digests) {
  const std::string entry_what = fmt::format("{}: files.{}", complete_what, name);
  const Json& entry = files[name];
  state_internal::RequireKeys(entry, {"blake2b", "size"}, entry_what);
  const uint64_t size = state_internal::U64Field(entry, "size", entry_what);
  const Digest digest = state_internal::DigestField(entry, "blake2b", entry_what);
  const fs::path path = dir / name;
  if (!fs::exists(path)) Fail("{}: missing (listed in COMPLETE)", path.string());
  std::vector<uint8_t> bytes = ReadFileBytes(path);
  if (bytes.size() != size) {
    Fail("{}: {} bytes, but COMPLETE lists {} (truncated or altered)", path.string(), bytes.size(),
         size);
  }
  const Digest actual = Blake2b256(bytes);
  if (actual != digest && digests == FileDigests::kEnforce) {
    Fail("{}: BLAKE2b-256 {} differs from {} listed in COMPLETE (the file is corrupt)",
         path.string(), ToHex(actual), ToHex(digest));
  }
  return bytes;
}

SafetensorsFile ReadTensorFile(const fs::path& dir, const char* name, std::string_view content,
                               uint64_t step, const Json& files, const std::string& what,
                               FileDigests digests) {
  SafetensorsFile file =
      ParseSafetensors(ReadListedFile(dir, name, files, what, digests), dir / name);
  if (file.metadata() != FileMetadata(content, step)) {
    Fail("{}: __metadata__ does not describe the {} of step {}", file.path().string(), content,
         step);
  }
  return file;
}

// The tensor named `name` in `file`, which must have `shape`.
std::span<const float> Companion(const SafetensorsFile& file, const std::string& name,
                                 const std::vector<int64_t>& shape) {
  const NamedTensor& t = file.Get(name);
  if (t.shape != shape) {
    Fail("{}: tensor '{}' has shape [{}] but the parameter has shape [{}]", file.path().string(),
         name, fmt::join(t.shape, ", "), fmt::join(shape, ", "));
  }
  return t.data;
}

void CreateDirectories(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) Fail("{}: cannot create directory: {}", dir.string(), ec.message());
}

void RemoveAll(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) Fail("{}: cannot remove: {}", path.string(), ec.message());
}
}  // namespace

fs::path CheckpointDir(const fs::path& run_dir, uint64_t step) {
  return run_dir / "checkpoints" / StepDirName(step);
}

fs::path WriteCheckpoint(const fs::path& run_dir, const StepState& state,
                         std::span<const TensorState> tensors) {
  const StateHash hash = ComputeStateHash(state, tensors);  // also validates the tensors
  const fs::path final_dir = CheckpointDir(run_dir, state.step);
  const fs::path parent = final_dir.parent_path();
  const fs::path temp_dir = parent / (kTempPrefix + StepDirName(state.step));
  if (!fs::exists(parent)) {
    CreateDirectories(parent);
    SyncDirectory(run_dir.empty() ? fs::path(".") : run_dir);  // make checkpoints/ durable
  }
  RemoveAll(temp_dir);  // what a writer that crashed at this step left behind
  CreateDirectories(temp_dir);

  // One file in memory at a time; COMPLETE lists each file's size and digest.
  Json listing = Json::object();
  auto write = [&](const char* name, std::span<const uint8_t> bytes) {
    WriteFileSynced(temp_dir / name, bytes);
    listing[name] = {{"blake2b", ToHex(Blake2b256(bytes))}, {"size", bytes.size()}};
  };
  std::vector<NamedTensor> named;
  for (const TensorState& t : tensors) named.push_back({t.name, t.shape, t.param});
  write(kModelFile, SafetensorsBytes(named, FileMetadata("model", state.step)));
  named.clear();
  for (const TensorState& t : tensors) {
    named.push_back({t.name + kExpAvg, t.shape, t.m});
    named.push_back({t.name + kExpAvgSq, t.shape, t.v});
  }
  write(kOptimizerFile, SafetensorsBytes(named, FileMetadata("optimizer", state.step)));
  named.clear();
  for (const TensorState& t : tensors) named.push_back({t.name, t.shape, t.grad});
  write(kGradsFile, SafetensorsBytes(named, FileMetadata("grads", state.step)));
  const std::string meta = MetaJson(state, hash.hash);
  write(kMetaFile, std::span(reinterpret_cast<const uint8_t*>(meta.data()), meta.size()));
  const std::string complete = DumpJson({{"format", kCompleteFormat},
                                         {"format_version", kCheckpointFormatVersion},
                                         {"files", listing}},
                                        "checkpoint COMPLETE");
  WriteFileSynced(temp_dir / kCompleteFile, complete);
  SyncDirectory(temp_dir);

  if (fs::exists(final_dir)) {
    // Writing the same state twice yields the same bytes, and COMPLETE holds every file's
    // digest: equal COMPLETE files mean the committed checkpoint is this one.
    const fs::path existing = final_dir / kCompleteFile;
    const bool same = fs::exists(existing) && ReadFileText(existing) == complete;
    RemoveAll(temp_dir);
    SyncDirectory(parent);
    if (!same) {
      Fail("{}: already exists and differs from the step {} state being written; refusing to "
           "replace a committed checkpoint",
           final_dir.string(), state.step);
    }
    return final_dir;
  }
  std::error_code ec;
  fs::rename(temp_dir, final_dir, ec);
  if (ec) Fail("{}: cannot rename to {}: {}", temp_dir.string(), final_dir.string(), ec.message());
  SyncDirectory(parent);
  return final_dir;
}

Checkpoint ReadCheckpoint(const fs::path& dir, FileDigests digests) {
  const fs::path complete_path = dir / kCompleteFile;
  if (!fs::is_regular_file(complete_path)) {
    Fail("{}: no COMPLETE file: an unfinished write, or not a checkpoint directory", dir.string());
  }
  const std::string complete_what = complete_path.string();
  const Json listing = state_internal::ParseJsonStrict(ReadFileText(complete_path), complete_what);
  state_internal::RequireKeys(listing, {"format", "format_version", "files"}, complete_what);
  state_internal::RequireFormat(listing, kCompleteFormat, kCheckpointFormatVersion,
                                complete_what);
  const Json& files = listing["files"];
  state_internal::RequireKeys(files, {kModelFile, kOptimizerFile, kGradsFile, kMetaFile},
                              complete_what + ": files");

  const std::string meta_what = (dir / kMetaFile).string();
  const std::vector<uint8_t> meta_bytes =
      ReadListedFile(dir, kMetaFile, files, complete_what, digests);
  auto [state, state_hash] = ParseMeta(
      std::string_view(reinterpret_cast<const char*>(meta_bytes.data()), meta_bytes.size()),
      meta_what);
  const uint64_t step = state.step;
  if (const auto named_step = StepOfDirName(dir.filename().string());
      named_step && *named_step != step) {
    Fail("{}: field \"step\" is {} but the directory is named for step {}", meta_what, step,
         *named_step);
  }

  Checkpoint c{
      .dir = dir,
      .state = std::move(state),
      .state_hash = state_hash,
      .model = ReadTensorFile(dir, kModelFile, "model", step, files, complete_what, digests),
      .optimizer =
          ReadTensorFile(dir, kOptimizerFile, "optimizer", step, files, complete_what, digests),
      .grads = ReadTensorFile(dir, kGradsFile, "grads", step, files, complete_what, digests),
      .tensors = {},
  };
  const size_t n = c.model.tensors().size();
  if (c.optimizer.tensors().size() != 2 * n || c.grads.tensors().size() != n) {
    Fail("{}: {} parameters, but {} holds {} tensors (expected {}) and {} holds {} (expected {})",
         dir.string(), n, kOptimizerFile, c.optimizer.tensors().size(), 2 * n, kGradsFile,
         c.grads.tensors().size(), n);
  }
  // With the counts equal and names unique within a file, finding every companion makes the
  // three files agree exactly.
  for (const NamedTensor& p : c.model.tensors()) {
    c.tensors.push_back({.name = p.name,
                         .shape = p.shape,
                         .param = p.data,
                         .m = Companion(c.optimizer, p.name + kExpAvg, p.shape),
                         .v = Companion(c.optimizer, p.name + kExpAvgSq, p.shape),
                         .grad = Companion(c.grads, p.name, p.shape)});
  }
  return c;
}

StateHash VerifyCheckpointHash(const Checkpoint& checkpoint) {
  StateHash recomputed = ComputeStateHash(checkpoint.state, checkpoint.tensors);
  if (recomputed.hash != checkpoint.state_hash) {
    Fail("{}: the state hash recomputed from the files is {}, but meta.json records {}",
         checkpoint.dir.string(), ToHex(recomputed.hash), ToHex(checkpoint.state_hash));
  }
  return recomputed;
}

std::optional<fs::path> LatestCompleteCheckpoint(const fs::path& run_dir) {
  const fs::path parent = run_dir / "checkpoints";
  if (!fs::is_directory(parent)) return std::nullopt;
  std::optional<uint64_t> latest;
  std::error_code list_error;
  for (const fs::directory_entry& entry : fs::directory_iterator(parent, list_error)) {
    const std::optional<uint64_t> step = StepOfDirName(entry.path().filename().string());
    if (!step || (latest && *step <= *latest)) continue;
    std::error_code unreadable;  // an entry that cannot be inspected is not a complete checkpoint
    if (entry.is_directory(unreadable) &&
        fs::is_regular_file(entry.path() / kCompleteFile, unreadable)) {
      latest = step;
    }
  }
  if (list_error) Fail("{}: cannot list directory: {}", parent.string(), list_error.message());
  if (!latest) return std::nullopt;
  return parent / StepDirName(*latest);
}

}  // namespace lockstep
