// The StateStore's whole-tensor access for the Model, and the in-RAM store.
#include <algorithm>
#include <array>
#include <limits>

#include "train/state_store.h"

namespace lockstep::train {

std::span<float> StateStore::Open(StateArray array, size_t i, bool load) {
  const Piece piece = Acquire(array, i, 0, specs_.at(i).numel(), load);
  open_[{array, i}] = piece;
  return piece.data;
}

void StateStore::Close(StateArray array, size_t i, bool store) {
  const auto it = open_.find({array, i});
  if (it == open_.end()) Fail("StateStore: tensor {} closed but not open", i);
  Release(it->second, store);
  open_.erase(it);
}

std::span<const float> StateStore::OpenParam(size_t i) {
  return Open(StateArray::kParam, i, /*load=*/true);
}
void StateStore::CloseParam(size_t i) { Close(StateArray::kParam, i, /*store=*/false); }
std::span<float> StateStore::OpenGrad(size_t i, bool accumulate) {
  return Open(StateArray::kGrad, i, /*load=*/accumulate);
}
void StateStore::CloseGrad(size_t i) { Close(StateArray::kGrad, i, /*store=*/true); }

namespace {

// The specs with every tensor not in `owned` made empty: a rank's moments and gradients.
std::vector<ParamSpec> OwnedOnly(std::vector<ParamSpec> specs, const std::vector<bool>& owned) {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!owned[i]) specs[i].shape = {0};
  }
  return specs;
}

class MemoryStore final : public StateStore {
 public:
  MemoryStore(std::vector<ParamSpec> specs, std::vector<bool> owned)
      : StateStore(specs),
        owned_(std::move(owned)),
        arrays_{ParamStore(specs), ParamStore(OwnedOnly(specs, owned_)),
                ParamStore(OwnedOnly(specs, owned_)), ParamStore(OwnedOnly(specs, owned_))} {}

  int64_t PieceFloats() const override { return std::numeric_limits<int64_t>::max(); }

  Piece Acquire(StateArray array, size_t tensor, int64_t begin, int64_t count, bool) override {
    const std::span<float> all = Array(array).Tensor(tensor);
    if (begin < 0 || count < 0 || begin + count > static_cast<int64_t>(all.size())) {
      Fail("MemoryStore: piece [{}, {}) outside tensor '{}' ({} elements)", begin, begin + count,
           specs_[tensor].name, all.size());
    }
    return {array, tensor, begin, all.subspan(static_cast<size_t>(begin), static_cast<size_t>(count))};
  }

  void Release(const Piece&, bool) override {}
  uint64_t SpillBytes() const override { return 0; }  // the piece is the stored array itself

  void Zero() override {
    for (ParamStore& store : arrays_) store.Zero();
  }

  StateHash Load(const CheckpointIndex& checkpoint, FileDigests digests,
                 const std::function<void(uint64_t)>& loaded) override {
    return StreamCheckpoint(
        checkpoint, kCheckpointPieceFloats,
        [&](size_t i, StateArray a, int64_t begin, std::span<const float> piece) {
          if (a == StateArray::kParam || owned_[i]) {
            std::ranges::copy(piece, Array(a).Tensor(i).begin() + begin);
          }
          loaded(piece.size_bytes());
        },
        digests);
  }

 private:
  ParamStore& Array(StateArray a) { return arrays_[static_cast<size_t>(a)]; }

  std::vector<bool> owned_;  // tensors whose moments and gradient this store holds
  std::array<ParamStore, kStateArrayCount> arrays_;
};

}  // namespace

std::unique_ptr<StateStore> MakeMemoryStore(std::vector<ParamSpec> specs,
                                            std::vector<bool> owned) {
  if (owned.empty()) owned.assign(specs.size(), true);
  return std::make_unique<MemoryStore>(std::move(specs), std::move(owned));
}

}  // namespace lockstep::train
