// Where a run's tensors live between uses: the parameters, both AdamW moments and the gradients.
// MemoryStore keeps them in RAM; SpillStore keeps them in files of digested chunks, so that a
// model larger than memory trains and replays with RAM ~ one layer plus the largest tensor
// (docs/training.md, "Storage"). The step sees only pieces, so both give the same bits.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "lockstep/model.h"
#include "lockstep/state.h"
#include "lockstep/train.h"

namespace lockstep::train {

// A view of elements [begin, begin + data.size()) of one array of one tensor.
struct Piece {
  StateArray array = StateArray::kParam;
  size_t tensor = 0;
  int64_t begin = 0;
  std::span<float> data;
};

class StateStore : public TensorAccess {
 public:
  explicit StateStore(std::vector<ParamSpec> specs) : specs_(std::move(specs)) {}

  const std::vector<ParamSpec>& specs() const { return specs_; }
  // Where the arrays live. In RAM a piece is a view of the stored array, so every tensor can be
  // had whole at no cost; on disk each acquired piece is read and digested.
  enum class Location { kRam, kDisk };
  virtual Location location() const = 0;
  // The longest piece worth asking for: every piece but a tensor's last has this length, so it
  // starts at a multiple of it (a multiple of rk::kNormBlock, or the whole tensor).
  virtual int64_t PieceFloats() const = 0;
  // A view of [begin, begin + count) of (array, tensor). With `load` it holds the stored
  // values; without, its contents are unspecified (the caller sets every element).
  virtual Piece Acquire(StateArray array, size_t tensor, int64_t begin, int64_t count,
                        bool load) = 0;
  // Done with the piece; with `store` its contents become the stored values. `hash_chunks`,
  // when the caller has them, are ChunkDigests of the piece's contents: a store on disk then
  // need not hash them again to digest what it writes.
  virtual void Release(const Piece& piece, bool store,
                       std::span<const Digest> hash_chunks = {}) = 0;
  // A hint: [begin, begin + count) of (array, tensor) is acquired with `load` soon. A store on
  // disk asks the kernel to start reading it now (into the page cache, not this process), so
  // that the disk works while the caller computes.
  virtual void Prefetch(StateArray /*array*/, size_t /*tensor*/, int64_t /*begin*/,
                        int64_t /*count*/) {}
  // Every array of every tensor set to zero (the parameters are then initialised by the caller).
  virtual void Zero() = 0;
  // Loads a checkpoint's arrays, reading every file once (StreamCheckpoint); returns the state
  // hash recomputed from the data. Nothing loaded is trusted before this returns. `loaded`
  // hears of each piece's bytes as it arrives.
  virtual StateHash Load(const CheckpointIndex& checkpoint, FileDigests digests,
                         const std::function<void(uint64_t bytes)>& loaded) = 0;
  // Load without reading, where the store can (a SpillStore; returns false in RAM, where Load is
  // the one read): each chunk stays where it lies in the checkpoint's files, is read there when
  // first acquired and digested then, and every later read of it is checked against that digest.
  // Until FinishAttach returns, the data is unverified.
  virtual bool Attach(const CheckpointIndex& /*checkpoint*/) { return false; }
  // After Attach: reads the chunks no Acquire has read (from the checkpoint, even if they were
  // overwritten since), then checks the files and recomputes the state hash from the chunks'
  // digests as Load does (CheckpointHashOfDigests), and returns it.
  virtual StateHash FinishAttach(FileDigests /*digests*/) {
    LOCKSTEP_INTERNAL("StateStore: FinishAttach without a checkpoint attached");
  }
  // The host memory that holds each array whole while the store lives (indexed by StateArray),
  // which an OpExecutor may keep copies of; empty spans for a store on disk.
  virtual std::array<std::span<const float>, kStateArrayCount> Regions() const { return {}; }
  // Bytes the store's files occupy on disk now (0 for RAM).
  virtual uint64_t SpillBytes() const = 0;
  // The disk traffic of Acquire and Release so far (all zero for RAM); PhaseReport's fields.
  struct Traffic {
    uint64_t read_bytes = 0, written_bytes = 0;
    double read_seconds = 0, write_seconds = 0;
  };
  virtual Traffic traffic() const { return {}; }

  // TensorAccess, in whole tensors.
  std::span<const float> OpenParam(size_t i) override;
  void CloseParam(size_t i) override;
  std::span<float> OpenGrad(size_t i, bool accumulate) override;
  void CloseGrad(size_t i) override;
  void WillOpenParam(size_t i) override;

 protected:
  std::vector<ParamSpec> specs_;

 private:
  // A whole tensor opened for the Model, and its release.
  std::span<float> Open(StateArray array, size_t i, bool load);
  void Close(StateArray array, size_t i, bool store);

  std::map<std::pair<StateArray, size_t>, Piece> open_;  // whole tensors open for the Model
};

// Four ParamStores in RAM; pieces are views into them (no copies). With `held` (one range per
// tensor; empty: every tensor whole), the moments and gradients of the other elements are not
// held at all (a rank of a distributed run), and asking for them fails; the parameters are held
// whole, or with `params_held` only in the same ranges (full sharding).
std::unique_ptr<StateStore> MakeMemoryStore(std::vector<ParamSpec> specs,
                                            std::vector<ElementRange> held = {},
                                            bool params_held = false);
// Files under `dir` (created if needed), unlinked as soon as they are open: they vanish with the
// store, or with the process however it ends.
std::unique_ptr<StateStore> MakeSpillStore(std::vector<ParamSpec> specs,
                                           const std::filesystem::path& dir);

// The bytes a SpillStore's chunk holds (4 MiB): pieces are multiples of it.
inline constexpr int64_t kSpillChunkFloats = int64_t{1} << 20;
// The longest piece of an array a SpillStore hands out (64 MiB): the update pass holds one piece
// of each of the four arrays at once.
inline constexpr int64_t kSpillPieceFloats = int64_t{16} << 20;
// StorePlan's part for a SpillStore: the most a spilled step holds open or reads ahead at once.
uint64_t SpillStoreOpenBytes(const ModelConfig& model);

}  // namespace lockstep::train
