// The exchange between the ranks of a run (src/train/exchange.h, docs/distributed.md).
#include "train/exchange.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "train/state_store.h"

namespace lockstep::train {
namespace {

// Gradients and parameters travel between ranks in pieces of this many floats (4 MiB, whole
// hash chunks): an owner gathering a piece holds N of them at once.
constexpr int64_t kExchangePieceFloats = int64_t{1} << 20;
static_assert(kExchangePieceFloats % kHashChunkFloats == 0);

// A checkpoint piece request from rank 0 to an owner: tensor, array, begin, count; tensor -1
// ends the checkpoint.
using PieceRequest = std::array<int64_t, 4>;

std::span<const std::byte> Bytes(std::span<const float> f) { return std::as_bytes(f); }
std::span<std::byte> Bytes(std::span<float> f) { return std::as_writable_bytes(f); }

}  // namespace

// Owners are non-decreasing in chunk order, so each rank's chunks of a tensor are one range.
std::vector<std::vector<int64_t>> OwnershipBounds(const std::vector<ParamSpec>& specs, int ranks,
                                                  int64_t unit) {
  if (unit < kHashChunkFloats || unit % kHashChunkFloats != 0) {
    LOCKSTEP_INTERNAL("an ownership unit of {} floats is not whole hash chunks", unit);
  }
  using Wide = unsigned __int128;  // N * 2 * total: no overflow for any int64 element count
  Wide total = 0;
  for (const ParamSpec& spec : specs) total += static_cast<Wide>(spec.numel());
  std::vector<std::vector<int64_t>> bounds;
  Wide before = 0;
  for (const ParamSpec& spec : specs) {
    const int64_t n = spec.numel();
    std::vector<int64_t> b(static_cast<size_t>(ranks) + 1, n);
    b[0] = 0;
    for (int64_t begin = 0; begin < n; begin += unit) {
      const Wide size = static_cast<Wide>(std::min(unit, n - begin));
      const Wide mid2 = 2 * (before + static_cast<Wide>(begin)) + size;
      const auto owner = static_cast<int>(
          std::min<Wide>(static_cast<Wide>(ranks - 1), mid2 * static_cast<Wide>(ranks) / (2 * total)));
      // The first chunk owned by a rank >= r starts rank r's range (and ends those before it).
      for (int r = 1; r <= owner; ++r) {
        if (b[static_cast<size_t>(r)] == n) b[static_cast<size_t>(r)] = begin;
      }
    }
    before += static_cast<Wide>(n);
    bounds.push_back(std::move(b));
  }
  return bounds;
}

Exchange::Exchange(Comm& comm, std::vector<ParamSpec> specs, int64_t unit)
    : comm_(comm),
      specs_(std::move(specs)),
      rank_(comm.rank()),
      ranks_(comm.size()),
      bounds_(OwnershipBounds(specs_, ranks_, unit)) {}

std::vector<ElementRange> Exchange::HeldHere() const {
  std::vector<ElementRange> held;
  for (size_t i = 0; i < specs_.size(); ++i) held.push_back(Held(i));
  return held;
}

void Exchange::GatherToOwners(const ParamStore& group, const PartsAtOwner& at_owner) const {
  std::vector<float> received;
  for (size_t i = 0; i < specs_.size(); ++i) {
    ForEachOwnerPiece(i, [&](int owner, int64_t begin, int64_t count) {
      received.resize(owner == rank_ ? static_cast<size_t>(count * ranks_) : 0);
      comm_.Gather(
          Bytes(group.Tensor(i).subspan(static_cast<size_t>(begin), static_cast<size_t>(count))),
          Bytes(std::span(received)), owner);
      if (owner == rank_) at_owner(i, begin, count, received);
    });
  }
}

Comm::Ticket Exchange::StartGatherTensorToOwners(size_t i, std::span<const float> tensor,
                                                 const PartsAtOwner& at_owner) const {
  Comm::Ticket last = 0;
  ForEachOwnerPiece(i, [&](int owner, int64_t begin, int64_t count) {
    last = comm_.StartGather(
        Bytes(tensor.subspan(static_cast<size_t>(begin), static_cast<size_t>(count))), owner,
        [i, begin, count, at_owner](std::span<const std::byte> all) {
          at_owner(
              i, begin, count,
              std::span(reinterpret_cast<const float*>(all.data()), all.size() / sizeof(float)));
        });
  });
  return last;
}

void Exchange::ForEachOwnerPiece(size_t i,
                                 const std::function<void(int, int64_t, int64_t)>& piece) const {
  for (int owner = 0; owner < ranks_; ++owner) {
    const ElementRange held = Held(i, owner);
    for (int64_t begin = held.begin; begin < held.end; begin += kExchangePieceFloats) {
      piece(owner, begin, std::min(kExchangePieceFloats, held.end - begin));
    }
  }
}

Comm::Ticket Exchange::StartGatherParameter(size_t i, std::span<const float> mine,
                                            std::span<float> whole) const {
  if (static_cast<int64_t>(mine.size()) != Held(i).size() ||
      static_cast<int64_t>(whole.size()) != specs_[i].numel()) {
    LOCKSTEP_INTERNAL("gathering tensor '{}' from {} of its {} elements into {}",
         specs_[i].name, mine.size(), specs_[i].numel(), whole.size());
  }
  return comm_.StartAllgather(std::as_bytes(mine), std::as_writable_bytes(whole));
}

ChunkTable Exchange::ShareChunkDigests(const ChunkTable& held) const {
  std::vector<Digest> mine;
  for (const auto& tensor : held) {
    for (const std::vector<Digest>& c : tensor) mine.insert(mine.end(), c.begin(), c.end());
  }
  // Every rank's chunk digests, in rank order: each tensor's chunks are those of ranks 0, 1, ...
  size_t total = 0;
  for (const ParamSpec& spec : specs_) total += kStateArrayCount * ChunkCount(spec.numel());
  const std::vector<Digest> all = AllgatherInRankOrder(mine, total);
  ChunkTable chunks(specs_.size());
  size_t at = 0;
  for (int r = 0; r < ranks_; ++r) {
    for (size_t i = 0; i < specs_.size(); ++i) {
      const ElementRange range = Held(i, r);
      const auto count = static_cast<size_t>(
          range.size() == 0 ? 0 : ChunkCount(range.end) - range.begin / kHashChunkFloats);
      for (auto& array : chunks[i]) {
        array.insert(array.end(), all.begin() + static_cast<std::ptrdiff_t>(at),
                     all.begin() + static_cast<std::ptrdiff_t>(at + count));
        at += count;
      }
    }
  }
  return chunks;
}

void Exchange::ShareParameters(StateStore& store, const ChunkTable& chunks, uint64_t step,
                               bool corrupt) const {
  // The first chunk whose copy here differs from its owner's: tensor, owner, first element.
  std::array<int64_t, 3> diverged{-1, -1, -1};
  const auto param_chunks = [&](size_t i) -> const std::vector<Digest>& {
    return chunks[i][int(StateArray::kParam)];
  };
  for (size_t i = 0; i < specs_.size(); ++i) {
    ForEachOwnerPiece(i, [&](int r, int64_t begin, int64_t count) {
      const Piece p = store.Acquire(StateArray::kParam, i, begin, count, /*load=*/r == rank_);
      comm_.Broadcast(Bytes(p.data), r);
      if (r != rank_) CheckCopy(p.data, i, r, begin, param_chunks(i), corrupt, diverged);
      store.Release(p, /*store=*/r != rank_);
    });
  }
  StopOnDivergedCopies(diverged, param_chunks, step);
}

void Exchange::CheckCopy(std::span<float> copy, size_t i, int owner, int64_t begin,
                         const std::vector<Digest>& owner_chunks, bool& corrupt,
                         std::array<int64_t, 3>& diverged) {
  if (corrupt) {
    copy[0] = std::nextafter(copy[0], INFINITY);
    corrupt = false;
  }
  const std::vector<Digest> received = ChunkDigests(copy);
  const auto first = static_cast<size_t>(begin / kHashChunkFloats);
  for (size_t c = 0; c < received.size() && diverged[0] < 0; ++c) {
    if (received[c] != owner_chunks[first + c]) {
      diverged = {static_cast<int64_t>(i), owner,
                  static_cast<int64_t>(first + c) * kHashChunkFloats};
    }
  }
}

void Exchange::StopOnDivergedCopies(const std::array<int64_t, 3>& diverged,
                                    const ParamChunks& param_chunks, uint64_t step) const {
  const std::vector<int64_t> verdicts = AllgatherInRankOrder(
      std::vector<int64_t>(diverged.begin(), diverged.end()), 3 * static_cast<size_t>(ranks_));
  for (int r = 0; r < ranks_; ++r) {
    const int64_t* v = &verdicts[3 * static_cast<size_t>(r)];
    if (v[0] < 0) continue;
    const auto i = static_cast<size_t>(v[0]);
    const int64_t end = std::min(v[2] + kHashChunkFloats, specs_[i].numel());
    Fail("step {}: rank {}'s copy of elements [{}, {}) of parameter tensor '{}' does not hash to "
         "the {} its owner, rank {}, updated them to: the replicas diverged (a faulty node or "
         "transfer); the run stops before committing the step",
         step, r, v[2], end, specs_[i].name,
         ToHex(param_chunks(i)[static_cast<size_t>(v[2] / kHashChunkFloats)]), v[1]);
  }
}

void Exchange::ServePieceRequests(const ReadPiece& read) const {
  std::vector<float> piece;
  for (;;) {
    PieceRequest request{};
    comm_.Receive(std::as_writable_bytes(std::span(request)), 0);
    if (request[0] < 0) return;
    piece.resize(static_cast<size_t>(request[3]));
    read(static_cast<size_t>(request[0]), static_cast<StateArray>(request[1]), request[2], piece);
    comm_.Send(Bytes(std::span<const float>(piece)), 0);
  }
}

void Exchange::RequestPiece(int owner, size_t i, StateArray array, int64_t begin,
                            std::span<float> out) const {
  // Only rank 0 asks (it writes the checkpoints); the owners serve in ServePieceRequests.
  LOCKSTEP_CHECK(rank_ == 0, "rank {} asked rank {} for elements [{}, {}) of tensor {}", rank_,
                 owner, begin, begin + static_cast<int64_t>(out.size()), i);
  const PieceRequest request{static_cast<int64_t>(i), static_cast<int64_t>(array), begin,
                             static_cast<int64_t>(out.size())};
  comm_.Send(std::as_bytes(std::span(request)), owner);
  comm_.Receive(Bytes(out), owner);
}

void Exchange::EndPieceRequests() const {
  for (int r = 1; r < ranks_; ++r) {
    const PieceRequest done{-1, 0, 0, 0};
    comm_.Send(std::as_bytes(std::span(done)), r);
  }
}

}  // namespace lockstep::train
