// Checkpoint directories (docs/formats/checkpoint.md): written to a temporary sibling, every
// file fsynced, COMPLETE last, then renamed into place; read back only after every file has
// been checked against COMPLETE. There is one writer (WriteCheckpointStreamed, one piece of an
// array in memory at a time) and one set of checks for readers, used both by ReadCheckpoint
// (whole files in memory) and by OpenCheckpoint + StreamCheckpoint (one piece in memory).
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/ranges.h>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <algorithm>
#include <bit>
#include <charconv>
#include <future>
#include <map>
#include <optional>
#include <system_error>
#include <tuple>

#include "lockstep/state.h"
#include "state/internal.h"

namespace lockstep {
namespace {
namespace fs = std::filesystem;
using state_internal::Json, state_internal::kStateArrays;

constexpr const char* kModelFile = RunLayout::kModel;
constexpr const char* kOptimizerFile = RunLayout::kOptimizer;
constexpr const char* kGradsFile = RunLayout::kGrads;
constexpr const char* kMetaFile = RunLayout::kMeta;
constexpr const char* kCompleteFile = RunLayout::kComplete;
constexpr char kMetaFormat[] = "lockstep-checkpoint";
constexpr char kCompleteFormat[] = "lockstep-checkpoint-complete";
// Version tag of TensorFileDigest's layout (docs/formats/checkpoint.md, "COMPLETE").
constexpr std::string_view kTensorFileTag{"lockstep/tensor-file/v1\0", 24};
constexpr char kExpAvg[] = ".exp_avg";
constexpr char kExpAvgSq[] = ".exp_avg_sq";

// The three tensor files, in the order they are written and read.
struct TensorFile {
  const char* name;
  const char* content;  // what its __metadata__ says it holds
};
constexpr std::array<TensorFile, 3> kTensorFiles = {
    {{kModelFile, "model"}, {kOptimizerFile, "optimizer"}, {kGradsFile, "grads"}}};

// Where each StateArray is stored: the file (index into kTensorFiles) and the suffix the
// parameter's name takes there. Within a file, a parameter's arrays follow each other in
// StateArray order, and the parameters follow each other in parameter order.
struct ArrayPlace {
  size_t file;
  const char* suffix;
};
constexpr std::array<ArrayPlace, kStateArrayCount> kArrayPlaces = {
    {{0, ""}, {1, kExpAvg}, {1, kExpAvgSq}, {2, ""}}};

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
  const std::string text = StringField(meta, key, what);
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

std::string MetaJson(const StepState& s, std::span<const Digest> grad_digests,
                     const Digest& state_hash) {
  Json grads = Json::array();
  for (const Digest& d : grad_digests) grads.push_back(ToHex(d));
  Json meta = {
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
      {"grad_digests", std::move(grads)},
      {"state_hash", ToHex(state_hash)},
  };
  if (s.chain) meta["chain_blake2b"] = ToHex(*s.chain);
  return DumpJson(meta, "checkpoint meta.json");
}

// meta.json's contents.
struct Meta {
  StepState state;
  Digest state_hash{};
  std::vector<Digest> grad_digests;  // per parameter, in parameter order
};

Meta ParseMeta(std::string_view text, const std::string& what) {
  Json meta = ParseJsonStrict(text, what);
  std::optional<Digest> chain;  // absent in a checkpoint of an earlier lockstep
  if (meta.is_object() && meta.contains("chain_blake2b")) {
    chain = DigestField(meta, "chain_blake2b", what);
    meta.erase("chain_blake2b");
  }
  RequireKeys(meta,
              {"format", "format_version", "step", "optimizer_step", "lr_bits", "grad_norm_bits",
               "clip_factor_bits", "skipped", "tokens_digest", "rng_seed", "rng_counter",
               "data_cursor", "spike", "prev_hash", "descriptor", "grad_digests", "state_hash"},
              what);
  RequireFormat(meta, kMetaFormat, kCheckpointFormatVersion, what);
  StepState s;
  s.step = U64Field(meta, "step", what);
  s.optimizer_step = U64Field(meta, "optimizer_step", what);
  s.lr = FloatFromBits(meta, "lr_bits", what);
  s.grad_norm = FloatFromBits(meta, "grad_norm_bits", what);
  s.clip_factor = FloatFromBits(meta, "clip_factor_bits", what);
  if (!meta["skipped"].is_boolean()) {
    Fail("{}: field \"skipped\": expected true or false, got {}", what, ShownJson(meta["skipped"]));
  }
  s.skipped = meta["skipped"].get<bool>();
  s.tokens_digest = DigestField(meta, "tokens_digest", what);
  s.rng_seed = U64Field(meta, "rng_seed", what);
  s.rng_counter = U64Field(meta, "rng_counter", what);
  s.data_cursor = U64Field(meta, "data_cursor", what);
  const Json& spike = meta["spike"];
  const std::string spike_what = what + ": spike";
  RequireKeys(spike, {"total_skips", "recent_skips"}, spike_what);
  s.spike.total_skips = U64Field(spike, "total_skips", spike_what);
  if (!spike["recent_skips"].is_array()) {
    Fail("{}: field \"recent_skips\": expected an array, got {}", spike_what,
         ShownJson(spike["recent_skips"]));
  }
  for (const Json& step : spike["recent_skips"]) {
    s.spike.recent_skips.push_back(AsU64(step, spike_what + ": recent_skips"));
  }
  s.prev_hash = DigestField(meta, "prev_hash", what);
  s.chain = chain;
  s.descriptor = StringField(meta, "descriptor", what);
  const Json& grads = meta["grad_digests"];
  if (!grads.is_array()) {
    Fail("{}: field \"grad_digests\": expected an array, got {}", what, ShownJson(grads));
  }
  std::vector<Digest> grad_digests;
  for (size_t i = 0; i < grads.size(); ++i) {
    const std::string element = fmt::format("{}: field \"grad_digests\"[{}]", what, i);
    if (!grads[i].is_string()) {
      Fail("{}: expected a string, got {}", element, ShownJson(grads[i]));
    }
    grad_digests.push_back(DigestFromHex(grads[i].get<std::string>(), element));
  }
  return {std::move(s), DigestField(meta, "state_hash", what), std::move(grad_digests)};
}

// A file as COMPLETE lists it (data_start is set once a tensor file's header has been read).
using ListedFile = CheckpointIndex::File;

struct Listing {
  ListedFile meta;
  std::array<ListedFile, 3> tensor_files;  // kTensorFiles order; grads only with kFull
  Gradients gradients = Gradients::kDigests;
};

// Whether tensor file f (kTensorFiles order) is in a checkpoint that keeps `gradients`.
bool HasTensorFile(size_t f, Gradients gradients) {
  return f != 2 || gradients == Gradients::kFull;
}

// COMPLETE, parsed strictly: the format, and exactly the files of the checkpoint (grads only
// with full gradients) with their sizes and digests.
Listing ReadListing(const fs::path& dir) {
  const fs::path complete_path = dir / kCompleteFile;
  if (!fs::is_regular_file(complete_path)) {
    Fail("{}: no COMPLETE file: an unfinished write, or not a checkpoint directory", dir.string());
  }
  const std::string what = complete_path.string();
  const Json complete = ParseJsonStrict(ReadFileText(complete_path), what);
  RequireKeys(complete, {"format", "format_version", "files"}, what);
  RequireFormat(complete, kCompleteFormat, kCheckpointFormatVersion, what);
  const Json& files = complete["files"];
  const Gradients gradients =
      files.is_object() && files.contains(kGradsFile) ? Gradients::kFull : Gradients::kDigests;
  if (gradients == Gradients::kFull) {
    RequireKeys(files, {kModelFile, kOptimizerFile, kGradsFile, kMetaFile}, what + ": files");
  } else {
    RequireKeys(files, {kModelFile, kOptimizerFile, kMetaFile}, what + ": files");
  }
  // meta.json by its BLAKE2b, a tensor file by its TensorFileDigest.
  const auto listed = [&](const char* name, const char* digest_key) {
    const std::string entry_what = fmt::format("{}: files.{}", what, name);
    const Json& entry = files[name];
    RequireKeys(entry, {digest_key, "size"}, entry_what);
    return ListedFile{.path = dir / name,
                      .size = U64Field(entry, "size", entry_what),
                      .digest = DigestField(entry, digest_key, entry_what)};
  };
  return {.meta = listed(kMetaFile, "blake2b"),
          .tensor_files = {listed(kModelFile, "digest"), listed(kOptimizerFile, "digest"),
                           gradients == Gradients::kFull ? listed(kGradsFile, "digest")
                                                         : ListedFile{}},
          .gradients = gradients};
}

void CheckExists(const ListedFile& file) {
  if (!fs::exists(file.path)) Fail("{}: missing (listed in COMPLETE)", file.path.string());
}

void CheckSize(const ListedFile& file, uint64_t actual) {
  if (actual != file.size) {
    Fail("{}: {} bytes, but COMPLETE lists {} (truncated or altered)", file.path.string(), actual,
         file.size);
  }
}

void CheckDigest(const ListedFile& file, const Digest& actual, FileDigests digests) {
  if (actual != file.digest && digests == FileDigests::kEnforce) {
    Fail("{}: digest {} differs from {} listed in COMPLETE (the file is corrupt)",
         file.path.string(), ToHex(actual), ToHex(file.digest));
  }
}

// The whole file, checked against its listed size and (unless `digests` is kIgnore) digest:
// BLAKE2b-256 for meta.json, TensorFileDigest for a tensor file.
std::vector<uint8_t> ReadListedFile(const ListedFile& file, FileDigests digests) {
  CheckExists(file);
  std::vector<uint8_t> bytes = ReadFileBytes(file.path);
  CheckSize(file, bytes.size());
  const bool tensors = file.path.extension() == ".safetensors";
  CheckDigest(file, tensors ? TensorFileDigest(bytes, file.path) : Blake2b256(bytes), digests);
  return bytes;
}

// meta.json, checked against COMPLETE and parsed; its step must match a canonical directory name.
Meta ReadMeta(const fs::path& dir, const Listing& listing, FileDigests digests) {
  const std::vector<uint8_t> bytes = ReadListedFile(listing.meta, digests);
  const std::string what = listing.meta.path.string();
  Meta meta =
      ParseMeta(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), what);
  if (const auto named_step = StepOfDirName(dir.filename().string());
      named_step && *named_step != meta.state.step) {
    Fail("{}: field \"step\" is {} but the directory is named for step {}", what,
         meta.state.step, *named_step);
  }
  return meta;
}

void CheckFileMetadata(const fs::path& path, const std::map<std::string, std::string>& metadata,
                       std::string_view content, uint64_t step) {
  if (metadata != FileMetadata(content, step)) {
    Fail("{}: __metadata__ does not describe the {} of step {}", path.string(), content, step);
  }
}

// The parameters (model.safetensors' tensors, in data order) and, for each, the position of each
// of its four arrays in its file's tensor list.
struct Matching {
  std::vector<TensorShape> tensors;
  std::vector<std::array<size_t, kStateArrayCount>> position;
};

// Matches the tensor files' tensors (each file's in data order): every companion present with
// the parameter's shape, and no extra tensors; and one gradient digest in meta.json per parameter.
Matching MatchTensorFiles(const fs::path& dir, std::array<std::vector<TensorShape>, 3> files,
                          Gradients gradients, size_t grad_digests) {
  const size_t n = files[0].size();
  if (files[1].size() != 2 * n) {
    Fail("{}: {} parameters, but {} holds {} tensors (expected {})", dir.string(), n,
         kOptimizerFile, files[1].size(), 2 * n);
  }
  if (gradients == Gradients::kFull && files[2].size() != n) {
    Fail("{}: {} parameters, but {} holds {} tensors (expected {})", dir.string(), n, kGradsFile,
         files[2].size(), n);
  }
  if (grad_digests != n) {
    Fail("{}: field \"grad_digests\" lists {} digests for {} parameters",
         (dir / kMetaFile).string(), grad_digests, n);
  }
  std::array<std::map<std::string_view, size_t>, 3> by_name;
  for (size_t f = 0; f < files.size(); ++f) {
    for (size_t k = 0; k < files[f].size(); ++k) by_name[f].emplace(files[f][k].name, k);
  }
  // With the counts equal and names unique within a file (the JSON header has no duplicate
  // keys), finding every companion makes the three files agree exactly.
  Matching m;
  for (const TensorShape& p : files[0]) {
    std::array<size_t, kStateArrayCount>& position = m.position.emplace_back();
    for (int a = 0; a < kStateArrayCount; ++a) {
      const ArrayPlace& place = kArrayPlaces[a];
      if (!HasTensorFile(place.file, gradients)) continue;
      const fs::path path = dir / kTensorFiles[place.file].name;
      const std::string name = p.name + place.suffix;
      const auto it = by_name[place.file].find(name);
      if (it == by_name[place.file].end()) Fail("{}: no tensor named '{}'", path.string(), name);
      const TensorShape& t = files[place.file][it->second];
      if (t.shape != p.shape) {
        Fail("{}: tensor '{}' has shape [{}] but the parameter has shape [{}]", path.string(),
             name, fmt::join(t.shape, ", "), fmt::join(p.shape, ", "));
      }
      position[a] = it->second;
    }
  }
  m.tensors = std::move(files[0]);
  return m;
}

StateHash CheckRecomputedHash(const fs::path& dir, const Digest& recorded, StateHash recomputed) {
  if (recomputed.hash != recorded) {
    Fail("{}: the state hash recomputed from the files is {}, but meta.json records {}",
         dir.string(), ToHex(recomputed.hash), ToHex(recorded));
  }
  return recomputed;
}

int64_t ElementCount(const TensorShape& t, const fs::path& dir) {
  return static_cast<int64_t>(
      state_internal::ElementCount(t.shape, fmt::format("{}: tensor '{}'", dir.string(), t.name)));
}

// The piece buffer: no larger than the largest array needs.
size_t PieceSize(int64_t piece_floats, std::span<const int64_t> counts) {
  int64_t largest = 0;
  for (int64_t count : counts) largest = std::max(largest, count);
  return static_cast<size_t>(std::min(piece_floats, largest));
}

std::span<const uint8_t> BytesOf(std::string_view text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}
std::span<const uint8_t> BytesOf(std::span<const float> values) {
  return {reinterpret_cast<const uint8_t*>(values.data()), values.size_bytes()};
}
std::span<uint8_t> WritableBytesOf(std::span<float> values) {
  return {reinterpret_cast<uint8_t*>(values.data()), values.size_bytes()};
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

// The staging directory of step N's checkpoint: checkpoints/.step_N.PID-A.tmp beside final_dir,
// made with mkdir, which never takes an existing name (one taken, by a writer that crashed or by
// anyone, is passed over and never removed); removed with what the writer put in it unless the
// write commits (Commit renames or removes it). checkpoints/ itself is made if absent, and a
// link there is refused: a checkpoint is never written through one.
class StagingDir {
 public:
  StagingDir(const fs::path& run_dir, const fs::path& final_dir, uint64_t step) {
    const fs::path parent = final_dir.parent_path();
    const fs::file_status status = fs::symlink_status(parent);
    if (fs::is_symlink(status)) {
      Fail("{}: a symbolic link: a checkpoint is never written through a link", parent.string());
    }
    if (!fs::exists(status)) {
      CreateDirectories(parent);
      SyncDirectory(run_dir.empty() ? fs::path(".") : run_dir);  // make checkpoints/ durable
    } else if (!fs::is_directory(status)) {
      Fail("{}: exists and is not a directory", parent.string());
    }
    for (int attempt = 0; path_.empty(); ++attempt) {
      const fs::path candidate =
          parent / fmt::format(".{}.{}-{}.tmp", StepDirName(step), ::getpid(), attempt);
      if (::mkdir(candidate.c_str(), 0755) == 0) {
        path_ = candidate;
      } else if (errno != EEXIST || attempt + 1 == 1000) {
        Fail("{}: cannot make a staging directory: {}", candidate.string(),
             errno == EEXIST ? "1000 names taken" : std::strerror(errno));
      }
    }
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  ~StagingDir() {
    if (committed_) return;
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }
  void Committed() { committed_ = true; }

 private:
  fs::path path_;
  bool committed_ = false;
};

// Renames the finished temporary directory into place, or, when final_dir exists already,
// removes it and succeeds only if final_dir is this very checkpoint.
void Commit(const fs::path& temp_dir, const fs::path& final_dir, const std::string& complete,
            uint64_t step) {
  const fs::path parent = final_dir.parent_path();
  if (fs::exists(final_dir) && !fs::exists(final_dir / kCompleteFile)) {
    // Not a committed checkpoint (this writer renames only complete directories: its COMPLETE
    // was removed, or it is not a checkpoint): kept aside, never trusted nor lost, and replaced.
    fs::path aside = parent / ("incomplete-" + StepDirName(step));
    for (int n = 2; fs::exists(aside); ++n) {
      aside = parent / fmt::format("incomplete-{}.{}", StepDirName(step), n);
    }
    std::error_code ec;
    fs::rename(final_dir, aside, ec);
    if (ec) {
      Fail("{}: has no COMPLETE and cannot be moved aside: {}", final_dir.string(), ec.message());
    }
    std::fprintf(stderr, "%s: had no COMPLETE (not a committed checkpoint): moved to %s\n",
                 final_dir.c_str(), aside.c_str());
  }
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
           final_dir.string(), step);
    }
    return;
  }
  std::error_code ec;
  fs::rename(temp_dir, final_dir, ec);
  if (ec) Fail("{}: cannot rename to {}: {}", temp_dir.string(), final_dir.string(), ec.message());
  SyncDirectory(parent);
}
}  // namespace

fs::path RunLayout::checkpoint(uint64_t step) const { return checkpoints() / StepDirName(step); }

fs::path CheckpointDir(const fs::path& run_dir, uint64_t step) {
  return RunLayout{run_dir}.checkpoint(step);
}

WrittenCheckpoint WriteCheckpointStreamed(const fs::path& run_dir, const StepState& state,
                                          std::span<const TensorShape> tensors,
                                          int64_t piece_floats, const PieceSource& source,
                                          Gradients gradients,
                                          std::span<const Digest> grad_digests) {
  const fs::path final_dir = CheckpointDir(run_dir, state.step);
  if (piece_floats < 1) {
    Fail("{}: WriteCheckpointStreamed: piece_floats = {} (must be at least 1)", final_dir.string(),
         piece_floats);
  }
  if (!grad_digests.empty() && grad_digests.size() != tensors.size()) {
    Fail("{}: WriteCheckpointStreamed: {} gradient digests for {} tensors", final_dir.string(),
         grad_digests.size(), tensors.size());
  }
  // Everything that can be refused is refused before the first byte is written: shapes, names
  // (by the headers), and the descriptor (which meta.json, written last, must encode).
  std::vector<int64_t> counts;
  std::vector<TensorDigest> digests;
  for (const TensorShape& t : tensors) {
    counts.push_back(ElementCount(t, final_dir));
    digests.push_back({.name = t.name, .shape = t.shape});
  }
  std::array<std::string, 3> headers;
  for (size_t f = 0; f < kTensorFiles.size(); ++f) {
    std::vector<TensorShape> in_file;
    for (const TensorShape& t : tensors) {
      for (const ArrayPlace& place : kArrayPlaces) {
        if (place.file == f) in_file.push_back({t.name + place.suffix, t.shape});
      }
    }
    headers[f] = state_internal::SafetensorsHeaderBytes(
        in_file, FileMetadata(kTensorFiles[f].content, state.step),
        (final_dir / kTensorFiles[f].name).string());
  }
  MetaJson(state, grad_digests, Digest{});

  StagingDir staging(run_dir, final_dir, state.step);
  const fs::path& temp_dir = staging.path();
  // One piece in memory; COMPLETE lists each file's size and digest, and each piece also feeds
  // its array's digest, from which the state hash in meta.json is made.
  Json listing = Json::object();
  std::vector<float> piece(PieceSize(piece_floats, counts));
  // Pulls array a of tensor i from the source piece by piece into `out` (when given) and returns
  // its digest.
  const auto pull = [&](size_t i, int a, File* out) {
    ArrayHasher array_hash;
    for (int64_t begin = 0; begin < counts[i]; begin += piece_floats) {
      const std::span<float> p(piece.data(),
                               static_cast<size_t>(std::min(piece_floats, counts[i] - begin)));
      source(i, static_cast<StateArray>(a), begin, p);
      array_hash.Update(p);
      if (out != nullptr) out->Write(BytesOf(p));
    }
    return array_hash.Final();
  };
  constexpr int kGrad = static_cast<int>(StateArray::kGrad);
  for (size_t f = 0; f < kTensorFiles.size(); ++f) {
    if (!HasTensorFile(f, gradients)) {
      // The gradients are kept as their digests: given, or made from the source's pieces.
      for (size_t i = 0; i < tensors.size(); ++i) {
        digests[i].grad = grad_digests.empty() ? pull(i, kGrad, nullptr) : grad_digests[i];
      }
      continue;
    }
    const fs::path path = temp_dir / kTensorFiles[f].name;
    File out = File::Create(path);
    out.Write(BytesOf(headers[f]));
    std::vector<Digest> in_file;  // the file's array digests, in data order
    for (size_t i = 0; i < tensors.size(); ++i) {
      for (int a = 0; a < kStateArrayCount; ++a) {
        if (kArrayPlaces[a].file != f) continue;
        in_file.push_back(digests[i].*kDigestArrays[a] = pull(i, a, &out));
        if (a == kGrad && !grad_digests.empty() && digests[i].grad != grad_digests[i]) {
          Fail("{}: the gradient of tensor '{}' hashes to {}, but its given digest is {}",
               final_dir.string(), tensors[i].name, ToHex(digests[i].grad),
               ToHex(grad_digests[i]));
        }
      }
    }
    out.Sync();
    listing[kTensorFiles[f].name] = {
        {"digest", ToHex(TensorFileDigestOf(BytesOf(headers[f]), in_file))},
        {"size", out.Size()}};
  }
  StateHash hash = StateHashFromDigests(state, digests);
  std::vector<Digest> written_grads;
  for (const TensorDigest& d : digests) written_grads.push_back(d.grad);
  const std::string meta = MetaJson(state, written_grads, hash.hash);
  WriteFileSynced(temp_dir / kMetaFile, meta);
  listing[kMetaFile] = {{"blake2b", ToHex(Blake2b256(BytesOf(meta)))}, {"size", meta.size()}};
  const std::string complete = DumpJson({{"format", kCompleteFormat},
                                         {"format_version", kCheckpointFormatVersion},
                                         {"files", listing}},
                                        "checkpoint COMPLETE");
  WriteFileSynced(temp_dir / kCompleteFile, complete);
  SyncDirectory(temp_dir);
  Commit(temp_dir, final_dir, complete, state.step);
  staging.Committed();
  return {.dir = final_dir, .hash = std::move(hash)};
}

fs::path WriteCheckpoint(const fs::path& run_dir, const StepState& state,
                         std::span<const TensorState> tensors, Gradients gradients) {
  std::vector<TensorShape> shapes;
  // The gradients' digests, made here (and checked against the elements) when some gradient
  // comes with its digest.
  std::vector<Digest> grad_digests;
  for (const TensorState& t : tensors) {
    state_internal::CheckTensorState(t);  // sizes match shapes: the source below stays in bounds
  }
  const bool by_digest = std::ranges::any_of(
      tensors, [](const TensorState& t) { return t.grad_digest.has_value(); });
  for (const TensorState& t : tensors) {
    shapes.push_back({t.name, t.shape});
    if (!by_digest) continue;
    if (state_internal::HasGradElements(t)) {
      grad_digests.push_back(state_internal::CheckedGradDigest(t, ArrayDigest(t.grad)));
    } else if (gradients == Gradients::kFull) {
      Fail("{}: tensor '{}': a checkpoint with full gradients needs the gradient's elements, "
           "but only its digest is known",
           CheckpointDir(run_dir, state.step).string(), t.name);
    } else {
      grad_digests.push_back(*t.grad_digest);
    }
  }
  const auto copy = [&](size_t i, StateArray a, int64_t begin, std::span<float> piece) {
    const std::span<const float> from = tensors[i].*kStateArrays[static_cast<int>(a)];
    std::copy_n(from.begin() + begin, piece.size(), piece.begin());
  };
  return WriteCheckpointStreamed(run_dir, state, shapes, kCheckpointPieceFloats, copy, gradients,
                                 grad_digests)
      .dir;
}

Digest TensorFileDigestOf(std::span<const uint8_t> head, std::span<const Digest> arrays) {
  Blake2b h;
  h.Update(kTensorFileTag).UpdateU64(head.size()).Update(Blake2b256(head));
  for (const Digest& array : arrays) h.Update(array);
  return h.Final();
}

Digest TensorFileDigest(std::span<const uint8_t> file, const fs::path& path) {
  const uint64_t header_size = state_internal::SafetensorsHeaderLength(
      file.first(std::min<size_t>(8, file.size())), file.size(), path);
  const std::string_view json(reinterpret_cast<const char*>(file.data()) + 8, header_size);
  const state_internal::SafetensorsHeader header =
      state_internal::ParseSafetensorsHeader(json, file.size() - 8 - header_size, path);
  std::vector<Digest> arrays;
  for (const state_internal::SafetensorsEntry& e : header.entries) {
    const auto data = file.subspan(header.data_start + e.begin, e.end - e.begin);
    arrays.push_back(ArrayDigest({reinterpret_cast<const float*>(data.data()), data.size() / 4}));
  }
  return TensorFileDigestOf(file.first(header.data_start), arrays);
}

Checkpoint ReadCheckpoint(const fs::path& dir, FileDigests digests) {
  const Listing listing = ReadListing(dir);
  Meta meta = ReadMeta(dir, listing, digests);
  const uint64_t step = meta.state.step;
  const auto read = [&](size_t f) {
    const ListedFile& listed = listing.tensor_files[f];
    SafetensorsFile file = ParseSafetensors(ReadListedFile(listed, digests), listed.path);
    CheckFileMetadata(listed.path, file.metadata(), kTensorFiles[f].content, step);
    return file;
  };
  Checkpoint c{.dir = dir,
               .state = std::move(meta.state),
               .state_hash = meta.state_hash,
               .model = read(0),
               .optimizer = read(1),
               .grads = {},
               .tensors = {}};
  if (listing.gradients == Gradients::kFull) c.grads = read(2);
  const std::array<const SafetensorsFile*, 3> files = {&c.model, &c.optimizer,
                                                       c.grads ? &*c.grads : nullptr};
  std::array<std::vector<TensorShape>, 3> shapes;
  for (size_t f = 0; f < files.size(); ++f) {
    if (files[f] == nullptr) continue;
    for (const NamedTensor& t : files[f]->tensors()) shapes[f].push_back({t.name, t.shape});
  }
  const Matching m =
      MatchTensorFiles(dir, std::move(shapes), listing.gradients, meta.grad_digests.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    TensorState& t = c.tensors.emplace_back();
    t.name = m.tensors[i].name;
    t.shape = m.tensors[i].shape;
    for (int a = 0; a < kStateArrayCount; ++a) {
      if (files[kArrayPlaces[a].file] == nullptr) continue;
      t.*kStateArrays[a] =
          files[kArrayPlaces[a].file]->tensors()[m.position[i][a]].data.As<float>();
    }
    t.grad_digest = meta.grad_digests[i];
  }
  return c;
}

StateHash VerifyCheckpointHash(const Checkpoint& checkpoint) {
  return CheckRecomputedHash(checkpoint.dir, checkpoint.state_hash,
                             ComputeStateHash(checkpoint.state, checkpoint.tensors));
}

CheckpointIndex OpenCheckpoint(const fs::path& dir) {
  const Listing listing = ReadListing(dir);
  Meta meta = ReadMeta(dir, listing, FileDigests::kEnforce);
  CheckpointIndex index{.dir = dir,
                        .state = std::move(meta.state),
                        .state_hash = meta.state_hash,
                        .tensors = {},
                        .grad_digests = std::move(meta.grad_digests),
                        .gradients = listing.gradients,
                        .files = {},
                        .offsets = {}};
  std::array<std::vector<state_internal::SafetensorsEntry>, 3> entries;
  std::array<std::vector<TensorShape>, 3> shapes;
  for (size_t f = 0; f < kTensorFiles.size(); ++f) {
    if (!HasTensorFile(f, index.gradients)) continue;
    const ListedFile& listed = listing.tensor_files[f];
    CheckExists(listed);
    const File file = File::OpenForReading(listed.path);
    CheckSize(listed, file.Size());
    state_internal::SafetensorsHeader header =
        state_internal::ReadSafetensorsHeader(file, listed.size);
    CheckFileMetadata(listed.path, header.metadata, kTensorFiles[f].content, index.state.step);
    index.files[f] = listed;
    index.files[f].data_start = header.data_start;
    for (const auto& e : header.entries) shapes[f].push_back({e.name, e.shape});
    entries[f] = std::move(header.entries);
  }
  Matching m =
      MatchTensorFiles(dir, std::move(shapes), index.gradients, index.grad_digests.size());
  index.tensors = std::move(m.tensors);
  for (const auto& position : m.position) {
    std::array<uint64_t, kStateArrayCount>& offsets = index.offsets.emplace_back();
    for (int a = 0; a < kStateArrayCount; ++a) {
      const size_t f = kArrayPlaces[a].file;
      if (HasTensorFile(f, index.gradients)) {
        offsets[a] = index.files[f].data_start + entries[f][position[a]].begin;
      }
    }
  }
  return index;
}

CheckpointIndex::Location CheckpointIndex::Where(size_t i, StateArray a) const {
  const int k = static_cast<int>(a);
  if (i >= offsets.size() || k < 0 || k >= kStateArrayCount) {
    Fail("{}: no array {} of tensor {} (the checkpoint holds {} tensors)", dir.string(), k, i,
         offsets.size());
  }
  if (!HasTensorFile(kArrayPlaces[k].file, gradients)) {
    Fail("{}: holds only the digest of tensor '{}''s gradient, not its elements (a checkpoint "
         "written without full gradients)",
         dir.string(), tensors.at(i).name);
  }
  return {.file = files[kArrayPlaces[k].file].path, .offset = offsets[i][k]};
}

namespace {

// A tensor file's digest from its header and the digests of its arrays, taken in data order.
Digest FileDigestOfArrays(const CheckpointIndex& index, size_t f, std::span<const uint8_t> header,
                          std::span<const TensorDigest> tensors) {
  std::vector<std::pair<uint64_t, Digest>> arrays;
  for (size_t i = 0; i < index.tensors.size(); ++i) {
    for (int a = 0; a < kStateArrayCount; ++a) {
      if (kArrayPlaces[a].file == f) arrays.emplace_back(index.offsets[i][a], tensors[i].*kDigestArrays[a]);
    }
  }
  std::ranges::sort(arrays, {}, &std::pair<uint64_t, Digest>::first);
  std::vector<Digest> in_file;
  for (const auto& [offset, digest] : arrays) in_file.push_back(digest);
  return TensorFileDigestOf(header, in_file);
}

// After the tensor files' digests: the gradients' (meta.json's, or with full gradients checked
// against them), and the state hash of every digest.
StateHash HashOfCheckedArrays(const CheckpointIndex& index, std::vector<TensorDigest> tensor_digests,
                              FileDigests digests) {
  if (index.grad_digests.size() != tensor_digests.size()) {
    Fail("{}: the index holds {} gradient digests for {} tensors", index.dir.string(),
         index.grad_digests.size(), tensor_digests.size());
  }
  for (size_t i = 0; i < tensor_digests.size(); ++i) {
    if (index.gradients == Gradients::kDigests) {
      tensor_digests[i].grad = index.grad_digests[i];
    } else if (tensor_digests[i].grad != index.grad_digests[i] &&
               digests == FileDigests::kEnforce) {
      Fail("{}: the gradient of tensor '{}' hashes to {}, but meta.json's grad_digests lists {}",
           index.files[2].path.string(), tensor_digests[i].name, ToHex(tensor_digests[i].grad),
           ToHex(index.grad_digests[i]));
    }
  }
  return StateHashFromDigests(index.state, tensor_digests);
}

}  // namespace

StateHash StreamCheckpoint(const CheckpointIndex& index, int64_t piece_floats,
                           const PieceSink& sink, FileDigests digests) {
  if (piece_floats < 1) {
    Fail("{}: StreamCheckpoint: piece_floats = {} (must be at least 1)", index.dir.string(),
         piece_floats);
  }
  std::vector<int64_t> counts;
  std::vector<TensorDigest> tensor_digests;
  for (const TensorShape& t : index.tensors) {
    counts.push_back(ElementCount(t, index.dir));
    tensor_digests.push_back({.name = t.name, .shape = t.shape});
  }
  // Two piece buffers: the next piece is read on its own thread while the current one is
  // hashed and handed to the sink, so the disk does not wait for the hashing.
  std::array<std::vector<float>, 2> buffers;
  for (std::vector<float>& b : buffers) b.resize(PieceSize(piece_floats, counts));
  for (size_t f = 0; f < kTensorFiles.size(); ++f) {
    if (!HasTensorFile(f, index.gradients)) continue;
    const ListedFile& listed = index.files[f];
    const File in = File::OpenForReading(listed.path);
    CheckSize(listed, in.Size());  // it may have changed since OpenCheckpoint
    // The file's arrays in data order, after its header: together, every byte of the file.
    std::vector<std::tuple<uint64_t, size_t, int>> arrays;
    for (size_t i = 0; i < index.tensors.size(); ++i) {
      for (int a = 0; a < kStateArrayCount; ++a) {
        if (kArrayPlaces[a].file == f) arrays.emplace_back(index.offsets[i][a], i, a);
      }
    }
    std::sort(arrays.begin(), arrays.end());
    std::vector<uint8_t> header(listed.data_start);
    in.ReadAt(0, header);
    // The file's pieces in data order: array (its index in `arrays`), first element, length.
    struct Job {
      size_t array;
      int64_t begin, count;
    };
    std::vector<Job> jobs;
    for (size_t k = 0; k < arrays.size(); ++k) {
      const int64_t n = counts[std::get<1>(arrays[k])];
      for (int64_t begin = 0; begin < n; begin += piece_floats) {
        jobs.push_back({k, begin, std::min(piece_floats, n - begin)});
      }
    }
    const auto piece_of = [&](size_t j) {
      return std::span<float>(buffers[j % 2].data(), static_cast<size_t>(jobs[j].count));
    };
    const auto read = [&](size_t j) {
      const uint64_t offset = std::get<0>(arrays[jobs[j].array]);
      in.ReadAt(offset + 4 * static_cast<uint64_t>(jobs[j].begin), WritableBytesOf(piece_of(j)));
    };
    for (const auto& [offset, i, a] : arrays) {  // an array without elements has no pieces
      if (counts[i] == 0) tensor_digests[i].*kDigestArrays[a] = ArrayHasher().Final();
    }
    std::optional<ArrayHasher> array_hash;
    std::future<void> next;
    if (!jobs.empty()) next = std::async(std::launch::async, read, 0);
    for (size_t j = 0; j < jobs.size(); ++j) {
      next.get();  // piece j is in its buffer (or its read's error is thrown here)
      if (j + 1 < jobs.size()) next = std::async(std::launch::async, read, j + 1);
      const auto& [offset, i, a] = arrays[jobs[j].array];
      if (jobs[j].begin == 0) array_hash.emplace();
      const std::span<float> p = piece_of(j);
      array_hash->Update(p);
      if (jobs[j].begin + jobs[j].count == counts[i]) {  // the array's last piece
        tensor_digests[i].*kDigestArrays[a] = array_hash->Final();
      }
      if (sink) {
        // Aligned pieces are whole hash chunks (the array's last perhaps shorter), all final now.
        const std::span<const Digest> chunks =
            piece_floats % kHashChunkFloats == 0
                ? array_hash->chunks().subspan(
                      static_cast<size_t>(jobs[j].begin / kHashChunkFloats),
                      static_cast<size_t>(ChunkCount(jobs[j].count)))
                : std::span<const Digest>();
        sink(i, static_cast<StateArray>(a), jobs[j].begin, p, chunks);
      }
    }
    CheckDigest(listed, FileDigestOfArrays(index, f, header, tensor_digests), digests);
  }
  return HashOfCheckedArrays(index, std::move(tensor_digests), digests);
}

StateHash CheckpointHashOfDigests(const CheckpointIndex& index, std::vector<TensorDigest> tensors,
                                  FileDigests digests) {
  if (tensors.size() != index.tensors.size()) {
    Fail("{}: {} tensor digests for {} tensors", index.dir.string(), tensors.size(),
         index.tensors.size());
  }
  for (size_t f = 0; f < kTensorFiles.size(); ++f) {
    if (!HasTensorFile(f, index.gradients)) continue;
    const ListedFile& listed = index.files[f];
    const File in = File::OpenForReading(listed.path);
    CheckSize(listed, in.Size());  // it may have changed since OpenCheckpoint
    std::vector<uint8_t> header(listed.data_start);
    in.ReadAt(0, header);
    CheckDigest(listed, FileDigestOfArrays(index, f, header, tensors), digests);
  }
  return HashOfCheckedArrays(index, std::move(tensors), digests);
}

void ReadCheckpointPiece(const CheckpointIndex& index, size_t i, StateArray a, int64_t begin,
                         std::span<float> out) {
  const CheckpointIndex::Location where = index.Where(i, a);
  const uint64_t count = state_internal::ElementCount(index.tensors.at(i).shape, where.file.string());
  if (begin < 0 || static_cast<uint64_t>(begin) + out.size() > count) {
    Fail("{}: elements [{}, {}) are outside tensor '{}' ({} elements)", where.file.string(), begin,
         static_cast<uint64_t>(begin) + out.size(), index.tensors[i].name, count);
  }
  const File file = File::OpenForReading(where.file);
  file.ReadAt(where.offset + static_cast<uint64_t>(begin) * sizeof(float),
              std::span(reinterpret_cast<uint8_t*>(out.data()), out.size_bytes()));
}

StateHash VerifyStreamedHash(const CheckpointIndex& index, StateHash recomputed) {
  return CheckRecomputedHash(index.dir, index.state_hash, std::move(recomputed));
}

std::vector<uint64_t> CompleteCheckpointSteps(const fs::path& run_dir) {
  const fs::path parent = RunLayout{run_dir}.checkpoints();
  std::vector<uint64_t> steps;
  if (!fs::is_directory(parent)) return steps;
  std::error_code list_error;
  for (const fs::directory_entry& entry : fs::directory_iterator(parent, list_error)) {
    const std::optional<uint64_t> step = StepOfDirName(entry.path().filename().string());
    if (!step) continue;
    std::error_code unreadable;  // an entry that cannot be inspected is not a complete checkpoint
    if (entry.is_directory(unreadable) &&
        fs::is_regular_file(entry.path() / kCompleteFile, unreadable)) {
      steps.push_back(*step);
    }
  }
  if (list_error) Fail("{}: cannot list directory: {}", parent.string(), list_error.message());
  std::ranges::sort(steps);
  return steps;
}

std::optional<fs::path> LatestCompleteCheckpoint(const fs::path& run_dir) {
  const std::vector<uint64_t> steps = CompleteCheckpointSteps(run_dir);
  if (steps.empty()) return std::nullopt;
  return CheckpointDir(run_dir, steps.back());
}

}  // namespace lockstep
