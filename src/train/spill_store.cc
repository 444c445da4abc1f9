// SpillStore: the StateStore whose arrays live in files of digested chunks (SpillChunks). A
// piece is read into a buffer of its own (PieceBuffers), read ahead where its chunks lie one
// after another in a file opened with O_DIRECT, and written back to its chunks' slots.
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "train/piece_buffers.h"
#include "train/spill_chunks.h"
#include "train/state_store.h"

namespace lockstep::train {
namespace {
namespace fs = std::filesystem;

static_assert(kSpillPieceFloats % kSpillChunkFloats == 0, "pieces are whole chunks");
// The streamed global norm continues a tensor's sum piece by piece from block boundaries.
static_assert(kSpillChunkFloats % rk::kNormBlock == 0, "chunks are whole norm blocks");

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class SpillStore final : public StateStore {
 public:
  SpillStore(std::vector<ParamSpec> specs, const fs::path& dir)
      : StateStore(std::move(specs)), chunks_(specs_, dir) {}

  Location location() const override { return Location::kDisk; }
  int64_t PieceFloats() const override { return kSpillPieceFloats; }

  Piece Acquire(StateArray array, size_t tensor, int64_t begin, int64_t count, bool load) override {
    const int64_t numel = specs_.at(tensor).numel();
    if (!chunks_.WholeChunks(tensor, begin, count)) {
      Fail("SpillStore: piece [{}, {}) of tensor '{}' ({} elements) is not whole chunks of {}",
           begin, begin + count, specs_[tensor].name, numel, kSpillChunkFloats);
    }
    const PieceKey key{array, tensor, begin, count};
    const std::unique_ptr<PieceBuffers::Ahead> ahead = load ? buffers_.TakeAhead(key) : nullptr;
    // Any other read ahead of these elements is of no use now (or stale, once they are stored).
    buffers_.CancelOverlapping(key);
    const auto start = Clock::now();
    if (ahead) buffers_.Wait(*ahead);
    PieceBuffers::Buffer buffer =
        ahead ? std::move(ahead->buffer) : buffers_.Take(DirectBytes(count * sizeof(float)));
    const size_t lead = ahead ? ahead->lead : 0;
    const std::span<float> data{reinterpret_cast<float*>(buffer.data.get() + lead),
                                static_cast<size_t>(count)};
    const Piece piece{array, tensor, begin, data};
    if (load) {
      try {
        if (ahead && !ahead->request.error.empty()) {
          Fail("reading chunks {} to {} of {} of '{}': {}", begin / kSpillChunkFloats,
               SpillChunks::Count(begin + count) - 1, kStateArrayNames[static_cast<size_t>(array)],
               specs_[tensor].name, ahead->request.error);
        }
        if (ahead) {
          chunks_.Check(piece);
        } else {
          chunks_.Read(piece);
        }
      } catch (...) {
        buffers_.Keep(std::move(buffer));
        throw;
      }
      traffic_.read_seconds += Seconds(start);
      traffic_.read_bytes += chunks_.StoredBytes(piece);
    }
    acquired_.emplace(piece.data.data(), std::move(buffer));
    return piece;
  }

  void Prefetch(StateArray array, size_t tensor, int64_t begin, int64_t count) override {
    if (!ReadAhead(array, tensor, begin, count)) chunks_.Advise(array, tensor, begin, count);
  }

  void Release(const Piece& piece, bool store, std::span<const Digest> hash_chunks) override {
    const auto it = acquired_.find(piece.data.data());
    if (it == acquired_.end()) {
      LOCKSTEP_INTERNAL("SpillStore: a piece released twice or never acquired");
    }
    if (store) {
      buffers_.CancelOverlapping(
          {piece.array, piece.tensor, piece.begin, static_cast<int64_t>(piece.data.size())});
      const auto start = Clock::now();
      chunks_.Write(piece, {it->second.data.get(), it->second.bytes}, hash_chunks);
      traffic_.write_seconds += Seconds(start);
      traffic_.written_bytes += piece.data.size_bytes();
    }
    buffers_.Keep(std::move(it->second));
    acquired_.erase(it);
  }

  uint64_t SpillBytes() const override { return chunks_.SpillBytes(); }
  Traffic traffic() const override { return traffic_; }

  void Zero() override {
    buffers_.CancelAll();
    chunks_.Clear();
    attached_.reset();
  }

  StateHash Load(const CheckpointIndex& checkpoint, FileDigests digests,
                 const std::function<void(uint64_t)>& loaded) override {
    Zero();
    return chunks_.Load(checkpoint, digests, loaded);
  }

  bool Attach(const CheckpointIndex& checkpoint) override {
    Zero();
    chunks_.Attach(checkpoint);
    attached_.emplace(checkpoint);
    return true;
  }

  StateHash FinishAttach(FileDigests digests) override {
    if (!attached_) LOCKSTEP_INTERNAL("SpillStore: FinishAttach without a checkpoint attached");
    // The chunks no step read, from the checkpoint.
    const auto start = Clock::now();
    traffic_.read_bytes += chunks_.ReadUnread();
    traffic_.read_seconds += Seconds(start);
    std::vector<TensorDigest> tensors = chunks_.AttachedDigests();
    const CheckpointIndex checkpoint = std::move(*attached_);
    attached_.reset();
    return CheckpointHashOfDigests(checkpoint, std::move(tensors), digests);
  }

 private:
  // Starts reading [begin, begin + count) of (array, tensor) into a buffer of its own, where
  // its chunks lie one after another in a file opened with O_DIRECT; returns whether it did (or
  // had). Elsewhere (chunks of zeros, chunks spread over slots or files, a filesystem without
  // O_DIRECT, a checkpoint whose tensor data is not float-aligned) Prefetch asks the kernel.
  bool ReadAhead(StateArray array, size_t tensor, int64_t begin, int64_t count) {
    const PieceKey key{array, tensor, begin, count};
    if (buffers_.ReadingAhead(key)) return true;
    if (tensor >= specs_.size() || count == 0 || !chunks_.WholeChunks(tensor, begin, count)) {
      return false;  // Acquire reports such a piece
    }
    std::optional<SpillChunks::Run> run = chunks_.DirectRun(array, tensor, begin, count);
    if (!run) return false;
    buffers_.ReadAhead(key, std::move(run->file), run->offset,
                       static_cast<size_t>(count) * sizeof(float));
    return true;
  }

  SpillChunks chunks_;
  PieceBuffers buffers_;  // destroyed before chunks_: the reads ahead end before the files close
  std::map<const float*, PieceBuffers::Buffer> acquired_;  // acquired pieces, by first element
  Traffic traffic_;
  // An attached checkpoint (Attach) until FinishAttach.
  std::optional<CheckpointIndex> attached_;
};

}  // namespace

std::unique_ptr<StateStore> MakeSpillStore(std::vector<ParamSpec> specs, const fs::path& dir) {
  return std::make_unique<SpillStore>(std::move(specs), dir);
}

// The largest sum, over the passes of a spilled step, of the tensors open at once and those read
// ahead: a layer's parameters plus its largest gradient, or output.weight with its gradient and
// final_norm.weight, or tok_embeddings.weight (forward) or its gradient (backward), each with the
// next layer's parameters read ahead; or the update pass's pieces being hashed (up to one full
// piece per array) and those read ahead (as many).
uint64_t SpillStoreOpenBytes(const ModelConfig& model) {
  const auto bytes_of = [](const ParamSpec& spec) {
    return static_cast<uint64_t>(spec.numel()) * sizeof(float);
  };
  const auto layers = static_cast<size_t>(model.n_layers);
  std::vector<uint64_t> layer_params(layers), layer_largest(layers);
  uint64_t head = 0, largest = 0;
  for (const ParamSpec& spec : ParameterSpecs(model)) {
    const uint64_t bytes = bytes_of(spec);
    largest = std::max(largest, bytes);
    if (spec.layer >= 0) {
      const auto layer = static_cast<size_t>(spec.layer);
      layer_params[layer] += bytes;
      layer_largest[layer] = std::max(layer_largest[layer], bytes);
    } else if (spec.name == "output.weight" || spec.name == "final_norm.weight") {
      head += bytes;
    }
  }
  const uint64_t piece = static_cast<uint64_t>(kSpillPieceFloats) * sizeof(float);
  const uint64_t array = StateBytes(model) / kStateArrayCount;
  uint64_t next_layer = 0;
  for (const uint64_t bytes : layer_params) next_layer = std::max(next_layer, bytes);
  uint64_t open =
      std::max(head + largest + next_layer, 2 * kStateArrayCount * std::min(piece, array));
  for (size_t layer = 0; layer < layers; ++layer) {
    open = std::max(open, layer_params[layer] + layer_largest[layer] + next_layer);
  }
  return open;
}

}  // namespace lockstep::train
