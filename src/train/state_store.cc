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
void StateStore::WillOpenParam(size_t i) { Prefetch(StateArray::kParam, i, 0, specs_.at(i).numel()); }

namespace {

// The specs with each tensor cut to its held range: a rank's moments and gradients.
std::vector<ParamSpec> HeldOnly(std::vector<ParamSpec> specs,
                                const std::vector<ElementRange>& held) {
  for (size_t i = 0; i < specs.size(); ++i) specs[i].shape = {held[i].size()};
  return specs;
}

class MemoryStore final : public StateStore {
 public:
  MemoryStore(std::vector<ParamSpec> specs, std::vector<ElementRange> held, bool params_held)
      : StateStore(specs),
        held_(std::move(held)),
        params_held_(params_held),
        arrays_{ParamStore(params_held ? HeldOnly(specs, held_) : specs),
                ParamStore(HeldOnly(specs, held_)), ParamStore(HeldOnly(specs, held_)),
                ParamStore(HeldOnly(specs, held_))} {}

  Location location() const override { return Location::kRam; }
  int64_t PieceFloats() const override { return std::numeric_limits<int64_t>::max(); }

  Piece Acquire(StateArray array, size_t tensor, int64_t begin, int64_t count, bool) override {
    const ElementRange held = Held(array, tensor);
    if (count < 0 || begin < held.begin || begin > held.end || count > held.end - begin) {
      Fail("MemoryStore: piece [{}, {}) of {} of tensor '{}' is outside the elements held here, "
           "[{}, {})",
           begin, begin + count, kStateArrayNames[static_cast<size_t>(array)], specs_[tensor].name,
           held.begin, held.end);
    }
    return {array, tensor, begin,
            Array(array).Tensor(tensor).subspan(static_cast<size_t>(begin - held.begin),
                                                static_cast<size_t>(count))};
  }

  void Release(const Piece&, bool, std::span<const Digest>) override {}
  uint64_t SpillBytes() const override { return 0; }  // the piece is the stored array itself
  std::array<std::span<const float>, kStateArrayCount> Regions() const override {
    std::array<std::span<const float>, kStateArrayCount> regions;
    for (size_t a = 0; a < regions.size(); ++a) regions[a] = arrays_[a].Flat();
    return regions;
  }

  void Zero() override {
    for (ParamStore& store : arrays_) store.Zero();
  }

  StateHash Load(const CheckpointIndex& checkpoint, FileDigests digests,
                 const std::function<void(uint64_t)>& loaded) override {
    return StreamCheckpoint(
        checkpoint, kCheckpointPieceFloats,
        [&](size_t i, StateArray a, int64_t begin, std::span<const float> piece,
            std::span<const Digest>) {
          // The part of the piece held here.
          const ElementRange held = Held(a, i);
          const int64_t from = std::max(begin, held.begin);
          const int64_t to = std::min(begin + static_cast<int64_t>(piece.size()), held.end);
          if (from < to) {
            std::ranges::copy(piece.subspan(static_cast<size_t>(from - begin),
                                            static_cast<size_t>(to - from)),
                              Array(a).Tensor(i).begin() + (from - held.begin));
          }
          loaded(piece.size_bytes());
        },
        digests);
  }

 private:
  ParamStore& Array(StateArray a) { return arrays_[static_cast<size_t>(a)]; }
  ElementRange Held(StateArray a, size_t i) const {
    return a == StateArray::kParam && !params_held_ ? ElementRange{0, specs_[i].numel()}
                                                    : held_[i];
  }

  std::vector<ElementRange> held_;  // per tensor: the elements of the moments and gradient held
  bool params_held_;                // the parameters too (else whole)
  std::array<ParamStore, kStateArrayCount> arrays_;
};

}  // namespace

std::vector<std::pair<std::string, uint64_t>> StorePlan(const RunConfig& config,
                                                        const Storage& storage) {
  if (storage.spill_dir) {
    return {{"open tensors (largest layer or head, with a gradient)",
             SpillStoreOpenBytes(config.model)}};
  }
  return {{"parameters, gradients, AdamW m and v", StateBytes(config.model)},
          {"microbatch group gradients", GroupBufferBytes(config, 1)}};
}

std::unique_ptr<StateStore> MakeMemoryStore(std::vector<ParamSpec> specs,
                                            std::vector<ElementRange> held, bool params_held) {
  if (held.empty()) {
    for (const ParamSpec& spec : specs) held.push_back({0, spec.numel()});
  }
  if (held.size() != specs.size()) {
    Fail("MakeMemoryStore: {} held ranges for {} tensors", held.size(), specs.size());
  }
  return std::make_unique<MemoryStore>(std::move(specs), std::move(held), params_held);
}

}  // namespace lockstep::train
