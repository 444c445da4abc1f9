// The exchange of a run (docs/distributed.md): who holds which elements of each tensor, and
// every transfer between the ranks -- the round's tokens and loss sums, the group gradients sent
// to their owners, the chunk digests, the updated parameters, the checkpoint pieces. It moves
// bytes and checks what it received against its owner's digests; it never adds floats (every sum
// is the trainer's, in the documented order). One process is N = 1: every transfer is a copy.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "lockstep/model.h"
#include "lockstep/state.h"
#include "lockstep/train.h"
#include "train/comm.h"

namespace lockstep::train {

class StateStore;

// Per tensor, per array: the digests of its hash chunks, in order.
using ChunkTable = std::vector<std::array<std::vector<Digest>, kStateArrayCount>>;

class Exchange {
 public:
  // `comm` outlives the exchange. The ownership is OwnershipBounds(specs, comm.size(), unit).
  Exchange(Comm& comm, std::vector<ParamSpec> specs, int64_t unit = kHashChunkFloats);

  Comm& comm() const { return comm_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  // The elements of tensor i whose moments and gradient rank r holds and updates.
  ElementRange Held(size_t i, int r) const {
    return {bounds_[i][static_cast<size_t>(r)], bounds_[i][static_cast<size_t>(r) + 1]};
  }
  ElementRange Held(size_t i) const { return Held(i, rank_); }
  std::vector<ElementRange> HeldHere() const;

  // Every rank's `mine` (any lengths) concatenated in rank order, `total` elements, everywhere.
  template <typename T>
  std::vector<T> AllgatherInRankOrder(const std::vector<T>& mine, size_t total) const {
    std::vector<T> all(total);
    comm_.Allgather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)));
    return all;
  }

  // A round's group gradients (`group`, one per rank) sent to their owners: for each piece of the
  // elements this rank holds, `at_owner(i, begin, count, parts)` with every rank's piece in rank
  // order. N > 1 only (one process adds its groups in place).
  using PartsAtOwner = std::function<void(size_t i, int64_t begin, int64_t count,
                                          std::span<const float> parts)>;
  void GatherToOwners(const ParamStore& group, const PartsAtOwner& at_owner) const;

  // Every rank's chunk digests of what it holds (`held`: per tensor and array, the chunks of
  // Held(i) in order) made into the whole table, on every rank.
  ChunkTable ShareChunkDigests(const ChunkTable& held) const;

  // Full sharding, beside the compute (Comm's tickets: the spans stay valid and untouched until
  // the ticket is waited for). Tensor i's gradient of this round's group on this rank (`tensor`,
  // whole) sent to the owners of its elements, as GatherToOwners does for every tensor; here
  // `at_owner` runs on the exchange's thread (Comm::AtRoot says what it may touch).
  Comm::Ticket StartGatherTensorToOwners(size_t i, std::span<const float> tensor,
                                         const PartsAtOwner& at_owner) const;
  // Tensor i's parameters whole in `whole`, from every rank's range of it (`mine` is this
  // rank's, Held(i)), concatenated in rank order.
  Comm::Ticket StartGatherParameter(size_t i, std::span<const float> mine,
                                    std::span<float> whole) const;

  // Each owner's updated parameters sent to every rank, in `store`. Every received chunk is
  // checked against its owner's digest in `chunks`; a replica that differs (a faulty node, a
  // corrupted transfer) stops the run on every rank, naming the rank, the step and the elements.
  // `corrupt`: this rank changes one received element first (the test-only replica fault).
  void ShareParameters(StateStore& store, const ChunkTable& chunks, uint64_t step,
                       bool corrupt) const;

  // A parameter copy this rank received checked against its owner's digests: `copy` holds
  // elements [begin, begin + copy.size()) of tensor i from `owner`, whose chunk digests of the
  // tensor are `owner_chunks`. The first chunk that differs is recorded in `diverged` as {tensor,
  // owner, first element}, unless one is recorded already. With `corrupt` (the test-only replica
  // fault) one element of the copy is changed first, and `corrupt` cleared.
  static void CheckCopy(std::span<float> copy, size_t i, int owner, int64_t begin,
                        const std::vector<Digest>& owner_chunks, bool& corrupt,
                        std::array<int64_t, 3>& diverged);
  // The verdicts of every rank on the parameter copies it received: `diverged` is this rank's
  // first chunk that did not hash to its owner's digest in `param_chunks(tensor)`, as
  // {tensor, owner, first element}, or all -1. A divergence anywhere stops every rank, naming
  // the rank, the step, the tensor and the elements.
  using ParamChunks = std::function<const std::vector<Digest>&(size_t tensor)>;
  void StopOnDivergedCopies(const std::array<int64_t, 3>& diverged,
                            const ParamChunks& param_chunks, uint64_t step) const;

  // A checkpoint written by rank 0 from every owner's pieces. Rank 0 asks for a piece with
  // RequestPiece and ends with EndPieceRequests; every other rank answers in ServePieceRequests,
  // reading each asked-for piece with `read`, until rank 0 ends.
  using ReadPiece = std::function<void(size_t i, StateArray array, int64_t begin,
                                       std::span<float> out)>;
  void ServePieceRequests(const ReadPiece& read) const;
  void RequestPiece(int owner, size_t i, StateArray array, int64_t begin,
                    std::span<float> out) const;
  void EndPieceRequests() const;

 private:
  // piece(owner, begin, count) for each owner of tensor i's elements in rank order, and each
  // piece of its range in order: the exchange's unit of gradient and parameter transfers.
  void ForEachOwnerPiece(size_t i, const std::function<void(int, int64_t, int64_t)>& piece) const;

  Comm& comm_;
  std::vector<ParamSpec> specs_;
  int rank_, ranks_;
  // Per tensor, N + 1 element offsets (OwnershipBounds).
  std::vector<std::vector<int64_t>> bounds_;
};

}  // namespace lockstep::train
