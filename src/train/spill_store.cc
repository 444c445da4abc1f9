// SpillStore: the four arrays of every tensor in files of fixed chunks (kSpillChunkFloats), each
// chunk's digest (ArrayDigest: its hash chunks side by side in vector lanes) kept in RAM and
// checked whenever the chunk is read back, so a spill file
// changed under a run is reported, never trained on. A chunk lives in one of three places: nowhere
// (all zeros: the moments and gradients at init cost no disk), in the checkpoint file it was
// loaded from (read in place: loading a checkpoint copies nothing), or in its slot of this store's
// file for its array (after it was first written).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>

#include "train/state_store.h"

namespace lockstep::train {
namespace {
namespace fs = std::filesystem;

static_assert(kSpillPieceFloats % kSpillChunkFloats == 0, "pieces are whole chunks");
// The streamed global norm continues a tensor's sum piece by piece from block boundaries.
static_assert(kSpillChunkFloats % rk::kNormBlock == 0, "chunks are whole norm blocks");

constexpr const char* kArrayNames[kStateArrayCount] = {"param", "m", "v", "grad"};
constexpr int64_t kChunkBytes = kSpillChunkFloats * int64_t{sizeof(float)};
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class SpillStore final : public StateStore {
 public:
  SpillStore(std::vector<ParamSpec> specs, const fs::path& dir) : StateStore(std::move(specs)) {
    std::error_code error;
    created_dir_ = fs::create_directories(dir, error);
    if (error) Fail("{}: cannot create the spill directory: {}", dir.string(), error.message());
    int64_t floats = 0;  // slots: tensor after tensor, each chunk at a multiple of the chunk size
    for (const ParamSpec& spec : specs_) {
      slot_chunk_.push_back(floats / kSpillChunkFloats);
      floats += Chunks(spec.numel()) * kSpillChunkFloats;
    }
    for (int a = 0; a < kStateArrayCount; ++a) {
      const fs::path path = dir / fmt::format("{}.spill", kArrayNames[a]);
      // Exclusive: a spill file of another run (or a crashed one) is never silently reused.
      std::optional<File> file;
      try {
        file.emplace(File::CreateExclusive(path, 0600));
      } catch (const Error& e) {
        Fail("{} (remove it, or give another --spill-dir)", e.what());
      }
      // Unlinked at once: the space is the open descriptor's, so it is freed however the process
      // ends (a killed replay of a large model must not leave gigabytes behind).
      files_.push_back({std::move(*file), true});
      if (::unlink(path.c_str()) != 0) {
        Fail("{}: cannot unlink the new spill file: {}", path.string(), std::strerror(errno));
      }
    }
    dir_ = dir;
    Zero();
  }

  ~SpillStore() override {
    files_.clear();  // closes them
    if (created_dir_) {
      std::error_code ignored;
      fs::remove(dir_, ignored);  // only if empty
    }
  }

  int64_t PieceFloats() const override { return kSpillPieceFloats; }

  Piece Acquire(StateArray array, size_t tensor, int64_t begin, int64_t count, bool load) override {
    const int64_t numel = specs_.at(tensor).numel();
    if (begin < 0 || begin % kSpillChunkFloats != 0 || count < 0 || begin + count > numel ||
        (count % kSpillChunkFloats != 0 && begin + count != numel)) {
      Fail("SpillStore: piece [{}, {}) of tensor '{}' ({} elements) is not whole chunks of {}",
           begin, begin + count, specs_[tensor].name, numel, kSpillChunkFloats);
    }
    auto buffer = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(count));
    const Piece piece{array, tensor, begin, {buffer.get(), static_cast<size_t>(count)}};
    if (load) {
      const auto start = Clock::now();
      ForChunks(piece, [&](int64_t c, std::span<float> data) { return ReadChunk(piece, c, data); });
      traffic_.read_seconds += Seconds(start);
      const int64_t first = begin / kSpillChunkFloats;
      for (int64_t c = first; c < first + Chunks(count); ++c) {
        if (ChunkOf(piece, c).file >= 0) {  // a chunk of zeros is not read
          traffic_.read_bytes += static_cast<uint64_t>(
              std::min(kSpillChunkFloats, begin + count - c * kSpillChunkFloats) * int64_t{sizeof(float)});
        }
      }
    }
    buffers_.emplace(buffer.get(), std::move(buffer));
    return piece;
  }

  void Release(const Piece& piece, bool store) override {
    const auto it = buffers_.find(piece.data.data());
    if (it == buffers_.end()) Fail("SpillStore: a piece released twice or never acquired");
    if (store) {
      const auto start = Clock::now();
      ForChunks(piece,
                [&](int64_t c, std::span<float> data) { return WriteChunk(piece, c, data); });
      traffic_.write_seconds += Seconds(start);
      traffic_.written_bytes += piece.data.size_bytes();
    }
    buffers_.erase(it);
  }

  uint64_t SpillBytes() const override {
    uint64_t bytes = 0;
    for (const Attached& f : files_) {
      if (f.owned) bytes += f.file.AllocatedBytes();
    }
    return bytes;
  }

  Traffic traffic() const override { return traffic_; }

  void Zero() override {
    chunks_.assign(kStateArrayCount, {});
    for (auto& tensors : chunks_) {
      for (const ParamSpec& spec : specs_) {
        tensors.emplace_back(static_cast<size_t>(Chunks(spec.numel())));
      }
    }
    // Checkpoint files attached by an earlier Load are no longer referenced.
    files_.erase(files_.begin() + kStateArrayCount, files_.end());
  }

  StateHash Load(const CheckpointIndex& checkpoint, FileDigests digests,
                 const std::function<void(uint64_t)>& loaded) override {
    Zero();
    std::map<fs::path, int> file_of;
    for (size_t i = 0; i < specs_.size(); ++i) {
      for (int a = 0; a < kStateArrayCount; ++a) {
        // Gradients kept as digests stay zeros here (the next step overwrites them).
        if (a == static_cast<int>(StateArray::kGrad) && checkpoint.gradients != Gradients::kFull) {
          continue;
        }
        const fs::path& path = checkpoint.Where(i, static_cast<StateArray>(a)).file;
        if (file_of.contains(path)) continue;
        file_of[path] = static_cast<int>(files_.size());
        files_.push_back({File::OpenForReading(path), false});
      }
    }
    // StreamCheckpoint reads pieces of whole chunks and hands over their hash chunks' digests:
    // a chunk's digest (ArrayDigest) is made from those, and the chunk is left where it is.
    static_assert(kSpillChunkFloats % kHashChunkFloats == 0 &&
                  kSpillPieceFloats % kHashChunkFloats == 0);
    constexpr int64_t kPerChunk = kSpillChunkFloats / kHashChunkFloats;
    return StreamCheckpoint(
        checkpoint, kSpillPieceFloats,
        [&](size_t i, StateArray a, int64_t begin, std::span<const float> piece,
            std::span<const Digest> hash_chunks) {
          const CheckpointIndex::Location where = checkpoint.Where(i, a);
          const int file = file_of.at(where.file);
          const auto n = static_cast<int64_t>(piece.size());
          for (int64_t k = 0; k < Chunks(n); ++k) {
            const int64_t first = begin + k * kSpillChunkFloats;
            const int64_t floats = std::min(kSpillChunkFloats, n - k * kSpillChunkFloats);
            chunks_[static_cast<size_t>(a)][i][static_cast<size_t>(first / kSpillChunkFloats)] = {
                file, where.offset + static_cast<uint64_t>(first) * sizeof(float),
                ArrayDigestFromChunks(static_cast<uint64_t>(floats),
                                      hash_chunks.subspan(static_cast<size_t>(k * kPerChunk),
                                                          static_cast<size_t>(ChunkCount(floats))))};
          }
          loaded(piece.size_bytes());
        },
        digests);
  }

 private:
  struct Chunk {
    int file = -1;  // index into files_; -1: all zeros
    uint64_t offset = 0;
    Digest digest{};
  };
  struct Attached {
    File file;
    bool owned;  // this store's (unlinked) spill file, not a checkpoint's
  };

  static int64_t Chunks(int64_t numel) { return (numel + kSpillChunkFloats - 1) / kSpillChunkFloats; }

  Chunk& ChunkOf(const Piece& piece, int64_t c) {
    return chunks_[static_cast<size_t>(piece.array)][piece.tensor][static_cast<size_t>(c)];
  }

  std::string Describe(const Piece& piece, int64_t c) const {
    return fmt::format("chunk {} of {} of '{}'", c, kArrayNames[static_cast<int>(piece.array)],
                       specs_[piece.tensor].name);
  }

  // Runs io(chunk index, chunk data) for every chunk of the piece, in parallel (chunks are
  // independent); io returns an error message or nothing. Fails with the first error.
  template <typename Io>
  void ForChunks(const Piece& piece, Io io) {
    const int64_t first = piece.begin / kSpillChunkFloats;
    const auto n = static_cast<int64_t>(piece.data.size());
    const int64_t count = (n + kSpillChunkFloats - 1) / kSpillChunkFloats;
    std::vector<std::optional<std::string>> errors(static_cast<size_t>(count));
    ParallelFor(count, [&](int64_t k) {
      const int64_t begin = k * kSpillChunkFloats;
      errors[static_cast<size_t>(k)] =
          io(first + k, piece.data.subspan(static_cast<size_t>(begin),
                                           static_cast<size_t>(std::min(kSpillChunkFloats, n - begin))));
    });
    for (const auto& error : errors) {
      if (error) Fail("{}", *error);
    }
  }

  std::optional<std::string> ReadChunk(const Piece& piece, int64_t c, std::span<float> data) {
    const Chunk& chunk = ChunkOf(piece, c);
    if (chunk.file < 0) {
      std::ranges::fill(data, 0.0f);
      return std::nullopt;
    }
    const Attached& file = files_[static_cast<size_t>(chunk.file)];
    try {  // in a ParallelFor body: errors are returned, not thrown
      file.file.ReadAt(chunk.offset,
                       {reinterpret_cast<uint8_t*>(data.data()), data.size_bytes()});
    } catch (const Error& e) {
      return fmt::format("reading {}: {}", Describe(piece, c), e.what());
    }
    const Digest digest = ArrayDigest(data);
    if (digest != chunk.digest) {
      return fmt::format(
          "{}: {} at byte {} reads back with digest {} but was {} with {}: the file was changed "
          "under lockstep",
          file.file.path().string(), Describe(piece, c), chunk.offset, ToHex(digest),
          file.owned ? "written" : "loaded", ToHex(chunk.digest));
    }
    return std::nullopt;
  }

  std::optional<std::string> WriteChunk(const Piece& piece, int64_t c, std::span<const float> data) {
    File& file = files_[static_cast<size_t>(piece.array)].file;
    const uint64_t offset =
        static_cast<uint64_t>(slot_chunk_[piece.tensor] + c) * static_cast<uint64_t>(kChunkBytes);
    try {  // in a ParallelFor body: errors are returned, not thrown
      file.WriteAt(offset, {reinterpret_cast<const uint8_t*>(data.data()), data.size_bytes()});
    } catch (const Error& e) {
      return fmt::format("writing {}: {}", Describe(piece, c), e.what());
    }
    ChunkOf(piece, c) = {static_cast<int>(piece.array), offset, ArrayDigest(data)};
    return std::nullopt;
  }

  fs::path dir_;
  bool created_dir_ = false;
  std::vector<Attached> files_;       // the four spill files (by StateArray), then attachments
  std::vector<int64_t> slot_chunk_;   // first chunk slot of each tensor in a spill file
  std::vector<std::vector<std::vector<Chunk>>> chunks_;  // [array][tensor][chunk]
  std::map<const float*, std::unique_ptr<float[]>> buffers_;  // acquired pieces
  Traffic traffic_;
};

}  // namespace

std::unique_ptr<StateStore> MakeSpillStore(std::vector<ParamSpec> specs, const fs::path& dir) {
  return std::make_unique<SpillStore>(std::move(specs), dir);
}

}  // namespace lockstep::train
