// The training step: docs/training.md gives the exact order of everything below.
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>

#include "lockstep/kernels.h"
#include "lockstep/op_calls.h"
#include "lockstep/train.h"
#include "train/comm.h"
#include "train/exchange.h"
#include "train/routes.h"
#include "train/schedule.h"
#include "train/state_store.h"

namespace lockstep::train {
namespace fs = std::filesystem;

std::string RunDescriptor(const RunConfig& config, const data::Dataset& dataset) {
  nlohmann::json descriptor = nlohmann::json::parse(DescriptorJson(config));
  descriptor["data_manifest_blake2b"] = ToHex(dataset.manifest_digest());
  return descriptor.dump();  // nlohmann::json keeps keys sorted; no indent: compact
}

namespace {

// Numbers a step's ops in trace order, perturbs the one the fault names, and passes everything
// on to the observer behind it (a trace), if any.
class FaultyOp final : public OpObserver {
 public:
  FaultyOp(StepAndIndex fault, OpObserver* next) : fault_(fault), next_(next) {}
  void Context(uint64_t step, int64_t microbatch) override {
    if (step != step_) index_ = 0;
    step_ = step;
    if (next_ != nullptr) next_->Context(step, microbatch);
  }
  void Begin(std::string_view op, int64_t layer, std::span<const OpArg> args,
             std::span<const OpTensor> inputs) override {
    if (next_ != nullptr) next_->Begin(op, layer, args, inputs);
  }
  // Element 0 one ulp toward +inf; in an output of integers or bf16, its lowest bit flipped.
  static void Nudge(const MutableTensorView& t) {
    if (t.empty()) return;
    if (t.dtype() == Dtype::kF32) {
      t.As<float>()[0] = std::nextafter(t.As<float>()[0], INFINITY);
    } else if (t.dtype() == Dtype::kF64) {
      t.As<double>()[0] = std::nextafter(t.As<double>()[0], INFINITY);
    } else {
      t.bytes()[0] ^= std::byte{1};
    }
  }
  void End(std::span<const OpOutput> outputs) override {
    if (step_ == fault_.step && index_ == fault_.index && !outputs.empty()) {
      Nudge(outputs.front().view);
    }
    ++index_;
    if (next_ != nullptr) next_->End(outputs);
  }

 private:
  StepAndIndex fault_;
  OpObserver* next_;
  uint64_t step_ = 0;
  int64_t index_ = 0;
};

std::string ServableSizes(int64_t groups) {
  std::string sizes;
  for (int64_t n = 1; n <= groups; ++n) {
    if (groups % n == 0) sizes += (sizes.empty() ? "" : ", ") + std::to_string(n);
  }
  return sizes;
}

}  // namespace

Trainer::Trainer(const RunConfig& config, const data::Dataset& dataset, std::string descriptor,
                 const Storage& storage, Comm* comm)
    : config_(config),
      solo_(comm == nullptr ? MakeSoloComm() : nullptr),
      comm_(comm == nullptr ? *solo_ : *comm),
      rank_(comm_.rank()),
      ranks_(comm_.size()),
      stream_(dataset, config.train.data_seed, static_cast<uint32_t>(config.model.seq_len)),
      model_(config.model, config.train.vocab_chunk, config.train.microbatch,
             config.model.seq_len, storage.activations),
      specs_(ParameterSpecs(config.model)),
      tokens_(static_cast<size_t>(config.train.microbatch * (config.model.seq_len + 1))) {
  // Every token id indexes a row of the embedding and of the output head.
  if (config.model.vocab < static_cast<int64_t>(dataset.vocabulary().size)) {
    Fail("config '{}': model.vocab = {} is smaller than the dataset's vocabulary ({} ids, {})",
         config.name, config.model.vocab, dataset.vocabulary().size,
         (dataset.dir() / "manifest.json").string());
  }
  const int64_t groups = config.train.grad_groups;
  if (groups % ranks_ != 0) {
    Fail("{} processes cannot train config '{}': its train.grad_groups = {} microbatch groups "
         "must divide evenly among the processes; world sizes that work: {} (docs/distributed.md)",
         ranks_, config.name, groups, ServableSizes(groups));
  }
  exchange_ = std::make_unique<Exchange>(comm_, specs_, OwnershipUnit(storage));
  if (storage.spill_dir) {
    // Each rank its own files: under the path given, a directory per rank.
    const fs::path& dir = *storage.spill_dir;
    store_ = MakeSpillStore(specs_, ranks_ == 1 ? dir : dir / fmt::format("rank-{}", rank_));
  } else {
    sharded_ = FullySharded(config, ranks_, storage);
    store_ = MakeMemoryStore(specs_, exchange_->HeldHere(), /*params_held=*/sharded_);
  }
  if (GroupBufferBytes(config, ranks_, storage) > 0) group_ = std::make_unique<ParamStore>(specs_);
  for (const ParamSpec& spec : specs_) shapes_.push_back({spec.name, spec.shape});
  if (config.model.linear == Linear::kInt8) {
    scale_of_.assign(specs_.size(), kNoScale);
    const ParamIndex P(config.model);
    for (size_t i = P.scales; i < specs_.size(); ++i) scale_of_[P.WeightOfScale(i)] = i;
  }
  state_.descriptor = std::move(descriptor);
  state_.rng_seed = config.train.seed;
}

Trainer::~Trainer() {
  if (hooks_.executor == nullptr) return;
  for (const std::span<const float> r : KeptRegions()) hooks_.executor->Forget(r);
}

ElementRange Trainer::Held(size_t i) const { return exchange_->Held(i); }

void Trainer::set_faults(const TestFaults& faults) {
  if (faults.op && ranks_ > 1) Fail("--test-fault-op: the op fault is for single-process runs");
  faults_ = faults;
  set_observer(caller_observer_);
}

void Trainer::set_observer(OpObserver* observer) {
  caller_observer_ = observer;
  op_fault_.reset();
  if (faults_.op) {
    op_fault_ = std::make_unique<FaultyOp>(*faults_.op, observer);
    observer = op_fault_.get();
  }
  // A spilled store hands out pieces, so an op would be seen piece by piece.
  if (observer != nullptr && store_->location() != StateStore::Location::kRam) {
    Fail("op observers (traces, test faults) need the state in RAM, not --spill-dir");
  }
  hooks_.observer = observer;
  model_.set_hooks(hooks_);
}

std::vector<std::span<const float>> Trainer::KeptRegions() const {
  std::vector<std::span<const float>> regions;
  for (const std::span<const float> r : store_->Regions()) {
    if (!r.empty()) regions.push_back(r);
  }
  if (group_) regions.push_back(group_->Flat());
  return regions;
}

void Trainer::StateOnHost(bool host_writes) {
  if (hooks_.executor == nullptr) return;
  for (const std::span<const float> r : KeptRegions()) {
    hooks_.executor->ToHost(r);
    if (host_writes) hooks_.executor->HostWrites(r);
  }
}

void Trainer::set_executor(OpExecutor* executor) {
  if (executor == hooks_.executor) return;
  if (hooks_.executor != nullptr) {
    StateOnHost(/*host_writes=*/false);
    for (const std::span<const float> r : KeptRegions()) hooks_.executor->Forget(r);
  }
  if (executor != nullptr) {
    for (const std::span<const float> r : KeptRegions()) executor->Keep(r);
  }
  hooks_.executor = executor;
  model_.set_hooks(hooks_);
}

int64_t Trainer::tokens_per_step() const {
  return config_.train.microbatches * config_.train.microbatch * config_.model.seq_len;
}

uint64_t Trainer::SpillBytes() const { return store_->SpillBytes(); }

namespace {

// Pieces of a tensor's range: [begin, begin + count), at most the store's piece length each (a
// spilled store's ranges are whole tensors, so its pieces start at multiples of it).
template <typename Body>
void ForEachPiece(const StateStore& store, ElementRange range, Body&& body) {
  const int64_t piece = store.PieceFloats();
  for (int64_t begin = range.begin; begin < range.end;) {
    const int64_t count = std::min(piece, range.end - begin);  // piece may be INT64_MAX (in RAM)
    body(begin, count);
    begin += count;
  }
}

}  // namespace

namespace {

// Appends a step's phases to a report: each Start ends the phase before it, with its wall time
// and the store's traffic meanwhile.
class PhaseClock {
 public:
  PhaseClock(const StateStore& store, std::vector<PhaseReport>& phases)
      : store_(store), phases_(phases) {}
  void Start(std::string name) {
    End();
    phases_.push_back({.name = std::move(name)});
    start_ = std::chrono::steady_clock::now();
    traffic_ = store_.traffic();
    open_ = true;
  }
  // `hashed_bytes`: what the phase digested beside the store's reads and writes.
  void End(uint64_t hashed_bytes = 0) {
    if (!open_) return;
    open_ = false;
    const StateStore::Traffic now = store_.traffic();
    PhaseReport& p = phases_.back();
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    p.read_bytes = now.read_bytes - traffic_.read_bytes;
    p.written_bytes = now.written_bytes - traffic_.written_bytes;
    p.read_seconds = now.read_seconds - traffic_.read_seconds;
    p.write_seconds = now.write_seconds - traffic_.write_seconds;
    p.hashed_bytes = p.read_bytes + p.written_bytes + hashed_bytes;
  }

 private:
  const StateStore& store_;
  std::vector<PhaseReport>& phases_;
  std::chrono::steady_clock::time_point start_;
  StateStore::Traffic traffic_;
  bool open_ = false;
};

}  // namespace

template <typename Body>
void Trainer::ForEachHeldPiece(std::initializer_list<StateArray> arrays, Body&& body,
                               std::optional<std::span<const size_t>> tensors) {
  struct Next {
    size_t i;
    int64_t begin, count;
  };
  std::vector<size_t> all;
  if (!tensors) {
    for (size_t i = 0; i < specs_.size(); ++i) all.push_back(i);
    tensors = all;
  }
  std::vector<Next> pieces;
  for (const size_t i : *tensors) {
    ForEachPiece(*store_, Held(i), [&](int64_t begin, int64_t count) {
      pieces.push_back({i, begin, count});
    });
  }
  // While piece k is worked on, pieces (k, asked) are prefetched: the next one, and more as long
  // as they hold no more than one full piece per array (what the memory plan counts, where the
  // store reads ahead into buffers of its own).
  const int64_t most = std::min<int64_t>(store_->PieceFloats(), int64_t{1} << 40);
  size_t asked = 0;    // pieces [0, asked) were prefetched
  int64_t ahead = 0;   // floats in pieces (k, asked)
  const auto ask = [&] {
    for (const StateArray a : arrays) {
      store_->Prefetch(a, pieces[asked].i, pieces[asked].begin, pieces[asked].count);
    }
    ++asked;
  };
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (asked == k) {
      ask();
    } else {
      ahead -= pieces[k].count;
    }
    while (asked < pieces.size() && (asked == k + 1 || ahead + pieces[asked].count <= most)) {
      ahead += pieces[asked].count;
      ask();
    }
    body(pieces[k].i, pieces[k].begin, pieces[k].count);
  }
}

namespace {

// The step's update of one piece: the gradient scaled by the clip factor (when it is not 1), then
// AdamW on the parameters and moments.
void UpdatePiece(const OpHooks& hooks, size_t i, const std::array<Piece, kStateArrayCount>& p,
                 const rk::AdamWParams& adam, float clip_factor) {
  const std::span<float> grad = p[int(StateArray::kGrad)].data;
  const std::span<float> param = p[int(StateArray::kParam)].data;
  const std::span<float> m = p[int(StateArray::kM)].data, v = p[int(StateArray::kV)].data;
  if (clip_factor != 1.0f) ops::Scale(hooks, -1, static_cast<int64_t>(i), clip_factor, grad);
  ops::AdamW(hooks, -1, static_cast<int64_t>(i), adam, param, grad, m, v);
}

}  // namespace

uint64_t Trainer::UpdateAndHash(bool update, const rk::AdamWParams& adam_template,
                                float clip_factor) {
  // Only a spilled pass is long enough to show (it reads and writes the state on disk).
  ProgressLine progress(update ? "update and hash" : "hash", StateBytes(config_.model),
                        progress_ && store_->SpillBytes() > 0);
  comm_.set_phase(fmt::format("step {}: update and hash", state_.step));
  // The chunk digests of what this rank holds: per tensor, per array, its chunks in order.
  // Pieces are hashed in batches, across tensors, of at most one full piece's length per array
  // (all of the state, in RAM): a model's many tensors of a chunk or two then fill the hash's
  // lanes (ChunkDigestsOfPieces), and a batch holds no more than one full piece would.
  ChunkTable held_chunks(specs_.size());
  // The int8 linears' scales are refreshed from their updated weights (docs/model.md, "Linears"):
  // per scale tensor, the maxima of its weight's rows, folded from every updated piece.
  const bool refresh = update && !scale_of_.empty();
  std::vector<std::vector<float>> maxima(specs_.size());
  if (refresh) {
    for (size_t i = 0; i < specs_.size(); ++i) {
      if (specs_[i].is_scale) maxima[i].assign(static_cast<size_t>(specs_[i].numel()), 0.0f);
    }
  }
  std::vector<std::array<Piece, kStateArrayCount>> batch;
  int64_t batch_floats = 0;
  uint64_t hashed_bytes = 0;
  const auto hash_batch = [&] {
    std::vector<std::span<const float>> arrays;
    for (const auto& p : batch) {
      for (const Piece& piece : p) {
        if (hooks_.executor != nullptr) hooks_.executor->ToHost(piece.data);
        arrays.push_back(piece.data);
        hashed_bytes += piece.data.size_bytes();
      }
    }
    if (refresh) {
      for (const auto& p : batch) {
        const Piece& param = p[size_t(StateArray::kParam)];
        const size_t scale = scale_of_[param.tensor];
        if (scale != kNoScale) {
          rk::FoldRowMaxima(param.data, param.begin, specs_[param.tensor].shape[1], maxima[scale]);
        }
      }
    }
    const std::vector<std::vector<Digest>> digests = ChunkDigestsOfPieces(arrays);
    for (size_t b = 0; b < batch.size(); ++b) {
      for (int a = 0; a < kStateArrayCount; ++a) {
        const std::vector<Digest>& d = digests[b * kStateArrayCount + static_cast<size_t>(a)];
        std::vector<Digest>& to = held_chunks[batch[b][a].tensor][a];
        to.insert(to.end(), d.begin(), d.end());
      }
      // An unscaled gradient is unchanged: only what the update wrote is stored back (and
      // nothing when the new state is discarded).
      for (int a = 0; a < kStateArrayCount; ++a) {
        const Piece& piece = batch[b][a];
        store_->Release(piece,
                        update && !discard_next_ &&
                            (piece.array != StateArray::kGrad || clip_factor != 1.0f),
                        digests[b * kStateArrayCount + static_cast<size_t>(a)]);
      }
      progress.Add(batch[b][0].data.size() * sizeof(float) * kStateArrayCount);
    }
    batch.clear();
    batch_floats = 0;
  };
  const auto update_and_digest = [&](size_t i, int64_t begin, int64_t count) {
    if (!batch.empty() && count > store_->PieceFloats() - batch_floats) hash_batch();
    std::array<Piece, kStateArrayCount>& p = batch.emplace_back();
    batch_floats += count;
    for (int a = 0; a < kStateArrayCount; ++a) {
      p[a] = store_->Acquire(static_cast<StateArray>(a), i, begin, count, /*load=*/true);
    }
    if (!update) return;
    if (specs_[i].is_scale) {  // set from its weight's maxima, not trained
      const std::span<float> param = p[size_t(StateArray::kParam)].data;
      if (hooks_.executor != nullptr) hooks_.executor->HostWrites(param);
      rk::ScalesOfMaxima(std::span(maxima[i]).subspan(static_cast<size_t>(begin), param.size()),
                         param);
      return;
    }
    rk::AdamWParams adam = adam_template;
    if (!specs_[i].weight_decay) adam.weight_decay = 0.0f;
    UpdatePiece(hooks_, i, p, adam, clip_factor);
  };
  const std::initializer_list<StateArray> kAll = {StateArray::kParam, StateArray::kM,
                                                  StateArray::kV, StateArray::kGrad};
  if (!refresh) {
    ForEachHeldPiece(kAll, update_and_digest);
  } else {
    // Every other tensor first; then the scales, from their weights' maxima on every rank.
    std::vector<size_t> others, scales;
    for (size_t i = 0; i < specs_.size(); ++i) (specs_[i].is_scale ? scales : others).push_back(i);
    ForEachHeldPiece(kAll, update_and_digest, others);
    if (!batch.empty()) hash_batch();
    ShareRowMaxima(maxima);
    ForEachHeldPiece(kAll, update_and_digest, scales);
  }
  if (!batch.empty()) hash_batch();
  ShareAndHash(held_chunks, update);
  return hashed_bytes;
}

void Trainer::ShareRowMaxima(std::vector<std::vector<float>>& maxima) const {
  if (ranks_ == 1) return;
  std::vector<float> mine;
  for (const std::vector<float>& m : maxima) mine.insert(mine.end(), m.begin(), m.end());
  const std::vector<float> all =
      exchange_->AllgatherInRankOrder(mine, mine.size() * static_cast<size_t>(ranks_));
  for (size_t at = 0; at < all.size();) {  // rank by rank, tensor by tensor
    for (std::vector<float>& m : maxima) {
      rk::FoldMaxima(std::span(all).subspan(at, m.size()), m);
      at += m.size();
    }
  }
}

void Trainer::ShareAndHash(const ChunkTable& held_chunks, bool update) {
  const ChunkTable chunks = exchange_->ShareChunkDigests(held_chunks);
  std::vector<TensorDigest> digests;
  for (size_t i = 0; i < specs_.size(); ++i) {
    TensorDigest t{specs_[i].name, specs_[i].shape};
    for (int a = 0; a < kStateArrayCount; ++a) {
      t.*kDigestArrays[a] =
          ArrayDigestFromChunks(static_cast<uint64_t>(specs_[i].numel()), chunks[i][a]);
    }
    digests.push_back(std::move(t));
  }
  if (sharded_) {  // what the next step's gathers are checked against
    param_chunks_.clear();
    for (size_t i = 0; i < specs_.size(); ++i) {
      param_chunks_.push_back(chunks[i][size_t(StateArray::kParam)]);
    }
  } else if (update && ranks_ > 1) {
    if (hooks_.executor != nullptr) {  // the other ranks' updates of the parameters land here
      const std::span<const float> params = store_->Regions()[size_t(StateArray::kParam)];
      hooks_.executor->ToHost(params);
      hooks_.executor->HostWrites(params);
    }
    exchange_->ShareParameters(*store_, chunks, state_.step,
                               faults_.replica && faults_.replica->rank == rank_ &&
                                   faults_.replica->step == state_.step);
  }
  hash_ = StateHashFromDigests(state_, digests);
  // The chain through this step (meta.json's chain_blake2b): from the init, or continued from a
  // checkpoint that has one.
  if (state_.step == 0) {
    state_.chain = ChainAfter(Digest{}, 0, hash_.hash);
  } else if (state_.chain) {
    state_.chain = ChainAfter(*state_.chain, state_.step, hash_.hash);
  }
}

void Trainer::Initialize() {
  StateOnHost(/*host_writes=*/true);
  store_->Zero();
  attached_.reset();
  const std::string descriptor = state_.descriptor;
  state_ = StepState{};
  state_.descriptor = descriptor;
  state_.rng_seed = config_.train.seed;
  const std::vector<int64_t> first_draws = FirstDraws(specs_);
  {
    ProgressLine progress("initialise", StateBytes(config_.model) / kStateArrayCount, progress_);
    for (size_t i = 0; i < specs_.size(); ++i) {
      ForEachPiece(*store_, sharded_ ? Held(i) : Whole(i), [&](int64_t begin, int64_t count) {
        const Piece p = store_->Acquire(StateArray::kParam, i, begin, count, /*load=*/false);
        InitTensorRange(config_.model, config_.train.seed, specs_[i], first_draws[i], begin,
                        p.data);
        store_->Release(p, /*store=*/true);
        progress.Add(static_cast<uint64_t>(count) * sizeof(float));
      });
    }
  }
  state_.rng_counter = static_cast<uint64_t>(first_draws.back());
  UpdateAndHash(/*update=*/false, {}, 1.0f);
}

namespace {

// A checkpoint's scalars against its own run: what training writes at step s of this config.
// Digests prove that bytes are unchanged since they were sealed, not that the sealed values are
// possible: a forger can reseal anything. (docs/formats/checkpoint.md, "Consistency".)
void CheckScalars(const StepState& s, const RunConfig& config, const std::vector<ParamSpec>& specs,
                  const fs::path& meta) {
  const TrainConfig& tc = config.train;
  const auto refuse = [&](std::string_view field, const std::string& value,
                          const std::string& expected) {
    Fail("{}: field \"{}\" is {}, but {}: the checkpoint contradicts its own run (a forged or "
         "resealed file)",
         meta.string(), field, value, expected);
  };
  const auto bits = [](float f) { return std::bit_cast<uint32_t>(f); };
  if (s.rng_seed != tc.seed) {
    refuse("rng_seed", std::to_string(s.rng_seed),
           fmt::format("the descriptor's train.seed is {}", tc.seed));
  }
  const auto draws = static_cast<uint64_t>(FirstDraws(specs).back());
  if (s.rng_counter != draws) {
    refuse("rng_counter", std::to_string(s.rng_counter),
           fmt::format("this model's initialisation draws {} words and no step draws more", draws));
  }
  const uint64_t per_step = static_cast<uint64_t>(tc.microbatches * tc.microbatch);
  if (s.step > UINT64_MAX / per_step || s.data_cursor != s.step * per_step) {
    refuse("data_cursor", std::to_string(s.data_cursor),
           fmt::format("step {} has consumed step x train.microbatches x train.microbatch = {} "
                       "windows",
                       s.step,
                       s.step > UINT64_MAX / per_step ? "more than 2^64"
                                                      : std::to_string(s.step * per_step)));
  }
  if (s.optimizer_step > s.step || s.optimizer_step + s.spike.total_skips != s.step) {
    refuse("optimizer_step", std::to_string(s.optimizer_step),
           fmt::format("every one of the {} steps either updates or is skipped, and spike "
                       "total_skips is {}",
                       s.step, s.spike.total_skips));
  }
  const float lr = s.step == 0 ? 0.0f : LearningRate(tc, static_cast<int64_t>(s.step));
  if (bits(s.lr) != bits(lr)) {
    refuse("lr_bits", fmt::format("{:08x}", bits(s.lr)),
           fmt::format("the schedule's learning rate at step {} has bits {:08x}", s.step,
                       bits(lr)));
  }
  const float clip = s.skipped || s.step == 0
                         ? 1.0f
                         : rk::ClipFactor(s.grad_norm, static_cast<float>(tc.clip_norm));
  if (bits(s.clip_factor) != bits(clip)) {
    refuse("clip_factor_bits", fmt::format("{:08x}", bits(s.clip_factor)),
           fmt::format("step {}'s grad_norm and train.clip_norm give {:08x}", s.step, bits(clip)));
  }
  if (!s.skipped && s.step > 0 && NormSkips(s.grad_norm, tc.spike_threshold)) {
    refuse("skipped", "false",
           fmt::format("a grad_norm of {} is a spike (train.spike_threshold {})", s.grad_norm,
                       tc.spike_threshold));
  }
  const std::vector<uint64_t>& recent = s.spike.recent_skips;
  const auto window = static_cast<uint64_t>(tc.spike_window);
  for (size_t k = 0; k < recent.size(); ++k) {
    if (recent[k] > s.step || recent[k] == 0 || s.step - recent[k] >= window ||
        (k > 0 && recent[k] <= recent[k - 1])) {
      refuse("spike.recent_skips", fmt::format("[{}]", fmt::join(recent, ", ")),
             fmt::format("it holds increasing steps within the last train.spike_window = {} steps "
                         "up to step {}",
                         window, s.step));
    }
  }
  const bool last_is_this = !recent.empty() && recent.back() == s.step;
  if (recent.size() > s.spike.total_skips ||
      recent.size() > static_cast<size_t>(tc.spike_max_skips) || last_is_this != s.skipped) {
    refuse("spike.recent_skips", fmt::format("[{}]", fmt::join(recent, ", ")),
           fmt::format("step {} was {}skipped, total_skips is {} and train.spike_max_skips {}",
                       s.step, s.skipped ? "" : "not ", s.spike.total_skips, tc.spike_max_skips));
  }
}

}  // namespace

void Trainer::CheckRestorable(const CheckpointIndex& checkpoint) const {
  const std::string where = checkpoint.dir.string();
  if (checkpoint.state.descriptor != state_.descriptor) {
    Fail("{}: meta.json descriptor differs from this run's (config and data must be those the "
         "checkpoint was trained with)\n  checkpoint: {}\n  this run:   {}",
         where, checkpoint.state.descriptor, state_.descriptor);
  }
  CheckScalars(checkpoint.state, config_, specs_, checkpoint.dir / RunLayout::kMeta);
  if (checkpoint.tensors.size() != specs_.size()) {
    Fail("{}: holds {} tensors, the model has {}", where, checkpoint.tensors.size(),
         specs_.size());
  }
  for (size_t i = 0; i < specs_.size(); ++i) {
    const TensorShape& t = checkpoint.tensors[i];
    if (t.name != specs_[i].name || t.shape != specs_[i].shape) {
      Fail("{}: tensor {} is '{}' [{}], the model's is '{}' [{}]", where, i, t.name,
           fmt::join(t.shape, ", "), specs_[i].name, fmt::join(specs_[i].shape, ", "));
    }
  }
}

StateHash Trainer::Restore(const CheckpointIndex& checkpoint, FileDigests digests) {
  CheckRestorable(checkpoint);
  attached_.reset();
  param_chunks_.clear();
  StateOnHost(/*host_writes=*/true);
  ProgressLine progress("load " + checkpoint.dir.string(), CheckpointBytes(checkpoint.gradients),
                        progress_);
  const StateHash recomputed = store_->Load(checkpoint, digests, [&](uint64_t bytes) {
    progress.Add(bytes);
  });
  progress.Finish();
  if (digests == FileDigests::kEnforce) VerifyStreamedHash(checkpoint, recomputed);
  state_ = checkpoint.state;
  hash_ = recomputed;
  gradients_held_ = checkpoint.gradients == Gradients::kFull;
  return recomputed;
}

bool Trainer::RestoreInPlace(const CheckpointIndex& checkpoint) {
  if (ranks_ > 1) Fail("Trainer::RestoreInPlace: one process only");
  CheckRestorable(checkpoint);  // before the store is cleared (Restore checks it again in RAM)
  if (!store_->Attach(checkpoint)) {
    Restore(checkpoint);
    return false;
  }
  state_ = checkpoint.state;
  hash_ = {.hash = checkpoint.state_hash, .components = {}};  // meta.json's, until checked
  gradients_held_ = checkpoint.gradients == Gradients::kFull;
  attached_.emplace(checkpoint);
  return true;
}

fs::path Trainer::WriteCheckpoint(const fs::path& run_dir, Gradients gradients) {
  RefuseUnsettled("a checkpoint");
  if (gradients == Gradients::kFull && !gradients_held_) {
    Fail("{}: a checkpoint of step {} with full gradients needs them, but this state was restored "
         "from a checkpoint that keeps only their digests; full gradients exist after a step "
         "trained here",
         CheckpointDir(run_dir, state_.step).string(), state_.step);
  }
  comm_.set_phase(fmt::format("step {}: checkpoint", state_.step));
  if (rank_ != 0) {
    // Answer rank 0's requests for the pieces this rank owns until it is done.
    exchange_->ServePieceRequests([&](size_t i, StateArray a, int64_t begin, std::span<float> out) {
      ReadPiece(i, a, begin, out);
    });
    return {};
  }
  ProgressLine progress(fmt::format("write checkpoint step {}", state_.step),
                        CheckpointBytes(gradients), progress_);
  // Bounded pieces: the writer's buffer is one piece, whatever the store (in RAM a store's
  // piece is a whole tensor).
  // The gradients' digests are the state hash's (with kFull the written gradients must hash to
  // them).
  std::vector<Digest> grad_digests;
  for (const TensorShape& t : shapes_) {
    grad_digests.push_back(ComponentDigest(hash_, fmt::format("grad:{}", t.name)));
  }
  const WrittenCheckpoint written = WriteCheckpointStreamed(
      run_dir, state_, shapes_, std::min(store_->PieceFloats(), kSpillPieceFloats),
      [&](size_t i, StateArray a, int64_t begin, std::span<float> out) {
        ReadPiece(i, a, begin, out);
        progress.Add(out.size_bytes());
      },
      gradients, grad_digests);
  progress.Finish();
  exchange_->EndPieceRequests();
  if (written.hash.hash != hash_.hash) {
    Fail("{}: the checkpoint written hashes to {}, but the trainer's state hash is {}",
         written.dir.string(), ToHex(written.hash.hash), ToHex(hash_.hash));
  }
  return written.dir;
}

void Trainer::ReadPiece(size_t i, StateArray array, int64_t begin, std::span<float> out) {
  RefuseUnsettled("a read of the state");
  if (array == StateArray::kGrad && !gradients_held_) {
    Fail("step {}: the gradient of tensor '{}' is not held: the state was restored from a "
         "checkpoint that keeps only the gradients' digests",
         state_.step, specs_.at(i).name);
  }
  const int64_t end = begin + static_cast<int64_t>(out.size());
  for (int r = 0; r < ranks_; ++r) {
    // Every rank holds the parameters whole (unless sharded); the other arrays in its range.
    const ElementRange held = array == StateArray::kParam && !sharded_
                                  ? (r == rank_ ? Whole(i) : ElementRange{})
                                  : exchange_->Held(i, r);
    const int64_t from = std::max(begin, held.begin), to = std::min(end, held.end);
    if (from >= to) continue;
    const std::span<float> part =
        out.subspan(static_cast<size_t>(from - begin), static_cast<size_t>(to - from));
    if (r != rank_) {
      exchange_->RequestPiece(r, i, array, from, part);
      continue;
    }
    // In the store's pieces, so that a whole array copied out costs no second copy of it.
    const int64_t piece = store_->PieceFloats();
    for (int64_t at = from; at < to;) {
      const Piece p = store_->Acquire(array, i, at, std::min(piece, to - at), /*load=*/true);
      if (hooks_.executor != nullptr) hooks_.executor->ToHost(p.data);
      std::ranges::copy(p.data, part.begin() + (at - from));
      store_->Release(p, /*store=*/false);
      at += static_cast<int64_t>(p.data.size());
    }
  }
}

std::vector<float> Trainer::RunGroup(int64_t group, uint64_t cursor, TensorAccess& access,
                                     std::vector<uint32_t>& tokens, std::vector<Digest>& backward,
                                     ProgressLine& progress) {
  const TrainConfig& tc = config_.train;
  const int64_t seq = config_.model.seq_len, per_group = tc.microbatches / tc.grad_groups;
  const float inv_tokens = 1.0f / static_cast<float>(tokens_per_step());
  std::vector<float> sums;
  for (int64_t k = 0; k < per_group; ++k) {
    const uint64_t first = cursor + static_cast<uint64_t>((group * per_group + k) * tc.microbatch);
    for (int64_t b = 0; b < tc.microbatch; ++b) {
      stream_.Window(first + static_cast<uint64_t>(b),
                     std::span(tokens_).subspan(b * (seq + 1), seq + 1));
    }
    if (faults_.token && faults_.token->step == state_.step + 1) {
      const auto mb_tokens = static_cast<int64_t>(tokens_.size());
      const int64_t at = faults_.token->index - (group * per_group + k) * mb_tokens;
      if (at >= 0 && at < mb_tokens) tokens_[static_cast<size_t>(at)] ^= 1u;
    }
    tokens.insert(tokens.end(), tokens_.begin(), tokens_.end());
    if (hooks_.observer != nullptr) hooks_.observer->Context(state_.step + 1, group * per_group + k);
    const LossSums s = model_.ForwardBackward(access, tokens_, inv_tokens, k > 0);
    sums.push_back(s.loss);
    sums.push_back(s.zloss);
    backward.push_back(s.backward);
    progress.Add(1);
  }
  return sums;
}

void Trainer::FoldRound(int64_t round) {
  if (sharded_) return;  // the route added the gradients at their owners
  if (ranks_ == 1) {
    if (round == 0) return;  // group 0 accumulated in place
    for (size_t i = 0; i < specs_.size(); ++i) {
      ForEachPiece(*store_, Whole(i), [&](int64_t begin, int64_t count) {
        const Piece total = store_->Acquire(StateArray::kGrad, i, begin, count, /*load=*/true);
        const std::span<const float> part =
            group_->Tensor(i).subspan(static_cast<size_t>(begin), static_cast<size_t>(count));
        ops::AddInto(hooks_, -1, part, total.data, static_cast<int64_t>(i));
        store_->Release(total, /*store=*/true);
      });
    }
    return;
  }
  comm_.set_phase(fmt::format("step {}: gradients of round {}", state_.step + 1, round));
  if (hooks_.executor != nullptr) {  // the group's gradients leave, the sums land, on the host
    hooks_.executor->ToHost(group_->Flat());
    const std::span<const float> grads = store_->Regions()[size_t(StateArray::kGrad)];
    hooks_.executor->ToHost(grads);
    hooks_.executor->HostWrites(grads);
  }
  exchange_->GatherToOwners(*group_, [&](size_t i, int64_t begin, int64_t count,
                                          std::span<const float> parts) {
    // Group round·N + r is rank r's: in rank order, the groups are added in group order.
    const Piece total = store_->Acquire(StateArray::kGrad, i, begin, count, /*load=*/round > 0);
    for (int r = 0; r < ranks_; ++r) {
      const auto part = parts.subspan(static_cast<size_t>(r * count), static_cast<size_t>(count));
      if (round == 0 && r == 0) {
        std::ranges::copy(part, total.data.begin());
      } else {
        rk::AddInto(part, total.data);
      }
    }
    store_->Release(total, /*store=*/true);
  });
}

uint64_t Trainer::CheckpointBytes(Gradients gradients) const {
  return StateBytes(config_.model) / kStateArrayCount *
         static_cast<uint64_t>(CheckpointArrays(gradients));
}

void Trainer::RefuseUnsettled(std::string_view what) const {
  if (attached_) {
    Fail("{} of {}, restored in place, before the step that verifies it: its data is unchecked",
         what, attached_->dir.string());
  }
  RefuseDiscarded(what);
}

void Trainer::RefuseDiscarded(std::string_view what) const {
  if (discarded_) {
    Fail("{} after step {}, whose state was discarded (DiscardNextState): the trainer holds no "
         "state to continue from",
         what, state_.step);
  }
}

Trainer::GroupsDone Trainer::RunGroups(uint64_t step) {
  const TrainConfig& tc = config_.train;
  const int64_t per_group = tc.microbatches / tc.grad_groups, rounds = tc.grad_groups / ranks_;
  const uint64_t cursor = state_.data_cursor;
  GroupsDone done;
  done.squares.resize(specs_.size());
  Blake2b consumed, backward;
  std::vector<float> sums;  // (loss, zloss) of each microbatch, in microbatch order
  // A long step shows its microbatches going by; one done within 2 s prints nothing.
  ProgressLine microbatches(fmt::format("step {}: forward and backward", step),
                            static_cast<uint64_t>(rounds * per_group), progress_, "microbatches",
                            /*delay_seconds=*/2);
  const RouteParts parts{*store_,      *exchange_,      sharded_,
                         group_.get(), hooks_.executor, param_chunks_};
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t group = round * ranks_ + rank_;
    comm_.set_phase(fmt::format("step {}: microbatch group {}", step, group));
    const bool corrupt_copy = faults_.replica && faults_.replica->rank == rank_ &&
                              faults_.replica->step == step && round == 0;
    const std::unique_ptr<GroupRoute> route =
        MakeGroupRoute(parts, round, rounds, step, corrupt_copy);
    std::vector<uint32_t> tokens;
    std::vector<Digest> group_backward;
    const std::vector<float> group_sums =
        RunGroup(group, cursor, *route, tokens, group_backward, microbatches);
    route->Finish(done.squares);
    const std::vector<uint32_t> round_tokens = exchange_->AllgatherInRankOrder(
        tokens, tokens.size() * static_cast<size_t>(ranks_));
    consumed.Update(std::span(reinterpret_cast<const uint8_t*>(round_tokens.data()),
                              round_tokens.size() * sizeof(uint32_t)));
    const std::vector<float> round_sums = exchange_->AllgatherInRankOrder(
        group_sums, group_sums.size() * static_cast<size_t>(ranks_));
    sums.insert(sums.end(), round_sums.begin(), round_sums.end());
    for (const Digest& d : exchange_->AllgatherInRankOrder(
             group_backward, group_backward.size() * static_cast<size_t>(ranks_))) {
      backward.Update(d);
    }
    FoldRound(round);
  }
  float loss_sum = 0.0f, zloss_sum = 0.0f;
  for (size_t mb = 0; mb < sums.size(); mb += 2) {
    loss_sum = loss_sum + sums[mb];
    zloss_sum = zloss_sum + sums[mb + 1];
  }
  const float inv_tokens = 1.0f / static_cast<float>(tokens_per_step());
  done.loss = loss_sum * inv_tokens;
  done.zloss = zloss_sum * inv_tokens;
  done.tokens_digest = consumed.Final();
  done.backward_digest = backward.Final();
  microbatches.Finish();
  return done;
}

float Trainer::GlobalNorm(uint64_t step, std::vector<std::vector<double>> squares) {
  comm_.set_phase(fmt::format("step {}: global norm", step));
  if (hooks_.observer != nullptr) hooks_.observer->Context(step, -1);
  std::vector<int64_t> blocks;    // per tensor
  std::vector<size_t> unsummed;  // tensors whose gradient is read for its squares
  for (size_t i = 0; i < specs_.size(); ++i) {
    blocks.push_back((specs_[i].numel() + rk::kNormBlock - 1) / rk::kNormBlock);
    // A NaN is made canonical in the gradient below, which needs it read.
    if (std::ranges::any_of(squares[i], [](double x) { return std::isnan(x); })) squares[i].clear();
    if (squares[i].empty()) unsummed.push_back(i);
  }
  const auto block_squares = [&](size_t i, int64_t begin, int64_t count) {
    const Piece g = store_->Acquire(StateArray::kGrad, i, begin, count, /*load=*/true);
    const std::vector<double> sums =
        ops::BlockSquares(hooks_, -1, static_cast<int64_t>(i), begin, g.data);
    // A NaN sum means a NaN element: the piece is written back canonical.
    const bool nan = std::ranges::any_of(sums, [](double x) { return std::isnan(x); });
    if (nan) ops::CanonicalizeNaNs(hooks_, -1, static_cast<int64_t>(i), g.data);
    store_->Release(g, /*store=*/nan);
    squares[i].insert(squares[i].end(), sums.begin(), sums.end());
  };
  ForEachHeldPiece({StateArray::kGrad}, block_squares, unsummed);
  std::vector<double> my_blocks;
  for (const std::vector<double>& s : squares) {
    my_blocks.insert(my_blocks.end(), s.begin(), s.end());
  }
  const std::vector<double> block_sums = exchange_->AllgatherInRankOrder(
      my_blocks, static_cast<size_t>(std::reduce(blocks.begin(), blocks.end())));
  return ops::GlobalNorm(hooks_, -1, block_sums, blocks);
}

StepReport Trainer::Step() {
  RefuseDiscarded("a step");
  RequireIeeeFloatingPoint();  // a register read: nothing loaded since changed it
  const auto start = std::chrono::steady_clock::now();
  const Comm::Traffic traffic = comm_.traffic();
  const TrainConfig& tc = config_.train;
  StepReport report;
  report.step = state_.step + 1;
  report.lr = LearningRate(tc, static_cast<int64_t>(report.step));
  report.tokens = tokens_per_step();
  PhaseClock phases(*store_, report.phases);

  // 1. Microbatch groups in rounds, each over its route to the state (routes.h): in round j
  //    rank r computes group j·N + r, so a round's groups, gathered in rank order, are in group
  //    order. Losses and tokens are gathered per microbatch and added / digested in microbatch
  //    order; group gradients are added into the owners' gradients in group order (FoldRound).
  phases.Start("forward and backward");
  GroupsDone groups = RunGroups(report.step);
  report.loss = groups.loss;
  report.zloss = groups.zloss;
  report.backward_digest = groups.backward_digest;

  // 2. Global norm over every gradient in parameter order: each rank sums the squares of the
  //    kNormBlock blocks it holds; the block sums are shared and added in parameter order. A NaN
  //    gradient (whose bits the kernels do not fix) is made the canonical NaN here, before
  //    anything hashes or writes it; the scan runs only in a piece whose sums hold a NaN.
  phases.Start("global norm");
  report.grad_norm = GlobalNorm(report.step, std::move(groups.squares));

  // 3. Spike protocol (schedule.h): a non-finite loss or norm, or a norm above the threshold,
  //    skips the update; spike_max_skips skips within spike_window steps halt the run.
  SpikeOutcome spike =
      SpikeRule(tc, state_.spike, report.step, report.loss, report.zloss, report.grad_norm);
  report.skipped = spike.skipped;
  report.halt = spike.halt;
  state_.spike = std::move(spike.state);
  rk::AdamWParams adam;
  if (!report.skipped) {
    // 4. Stateless clipping, then AdamW per tensor (weight decay only where the spec says).
    report.clip_factor = rk::ClipFactor(report.grad_norm, static_cast<float>(tc.clip_norm));
    state_.optimizer_step += 1;
    adam = {report.lr,
            static_cast<float>(tc.beta1),
            static_cast<float>(tc.beta2),
            static_cast<float>(tc.eps),
            static_cast<float>(tc.weight_decay),
            static_cast<int64_t>(state_.optimizer_step)};
  }

  // 5. The chained hash, inside the step: the gradients are still those of this step. The
  //    update and the digests are one pass over the pieces.
  state_.prev_hash = hash_.hash;
  state_.step = report.step;
  state_.lr = report.lr;
  state_.grad_norm = report.grad_norm;
  state_.clip_factor = report.clip_factor;
  state_.skipped = report.skipped;
  state_.tokens_digest = groups.tokens_digest;
  state_.data_cursor += static_cast<uint64_t>(tc.microbatches * tc.microbatch);
  phases.Start("update and hash");
  phases.End(UpdateAndHash(!report.skipped, adam, report.clip_factor));
  if (attached_) {  // restored in place: the checkpoint is checked now that the step read it
    phases.Start("verify checkpoint");
    VerifyStreamedHash(*attached_, store_->FinishAttach(FileDigests::kEnforce));
    attached_.reset();
    phases.End();
  }
  gradients_held_ = true;
  discarded_ = discard_next_;
  discard_next_ = false;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const Comm::Traffic after = comm_.traffic();
  report.comm_seconds = after.seconds - traffic.seconds;
  report.comm_hidden_seconds =
      std::max(0.0, report.comm_seconds - (after.waited_seconds - traffic.waited_seconds));
  report.comm_bytes = after.bytes_sent - traffic.bytes_sent;
  return report;
}

}  // namespace lockstep::train
