// The training step: docs/training.md gives the exact order of everything below.
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "lockstep/kernels.h"
#include "lockstep/train.h"
#include "train/state_store.h"

namespace lockstep::train {
namespace fs = std::filesystem;

float LearningRate(const TrainConfig& c, int64_t step) {
  const float peak = static_cast<float>(c.lr), floor = static_cast<float>(c.min_lr);
  if (step <= c.warmup_steps) {
    return peak * (static_cast<float>(step) / static_cast<float>(c.warmup_steps));
  }
  const int64_t span = c.steps - c.warmup_steps;
  if (span <= 0 || step > c.steps) return floor;
  if (c.schedule == "cosine") {
    // floor + (peak - floor) * 0.5 * (1 + cos(pi * progress)), progress in (0, 1].
    const float progress = static_cast<float>(step - c.warmup_steps) / static_cast<float>(span);
    const float cosine = dmath::Cos(3.14159265f * progress);
    return floor + (peak - floor) * (0.5f * (1.0f + cosine));
  }
  // "wsd": warmup, stable at peak, then a linear decay to floor over the last
  // wsd_decay_fraction of the steps (at least one step).
  const int64_t decay_steps =
      std::max<int64_t>(1, static_cast<int64_t>(std::llround(c.wsd_decay_fraction * c.steps)));
  const int64_t decay_start = c.steps - decay_steps;
  if (step <= decay_start) return peak;
  const float remaining = static_cast<float>(c.steps - step) / static_cast<float>(decay_steps);
  return floor + (peak - floor) * remaining;
}

std::string RunDescriptor(const RunConfig& config, const data::Dataset& dataset) {
  nlohmann::json descriptor = nlohmann::json::parse(DescriptorJson(config));
  descriptor["data_manifest_blake2b"] = ToHex(dataset.manifest_digest());
  return descriptor.dump();  // nlohmann::json keeps keys sorted; no indent: compact
}

Trainer::Trainer(const RunConfig& config, const data::Dataset& dataset, std::string descriptor,
                 const Storage& storage)
    : config_(config),
      stream_(dataset, config.train.data_seed, static_cast<uint32_t>(config.model.seq_len)),
      model_(config.model, config.train.vocab_chunk, config.train.microbatch,
             config.model.seq_len),
      specs_(ParameterSpecs(config.model)),
      store_(storage.spill_dir ? MakeSpillStore(specs_, *storage.spill_dir)
                               : MakeMemoryStore(specs_)),
      tokens_(static_cast<size_t>(config.train.microbatch * (config.model.seq_len + 1))) {
  for (const ParamSpec& spec : specs_) shapes_.push_back({spec.name, spec.shape});
  state_.descriptor = std::move(descriptor);
  state_.rng_seed = config.train.seed;
}

Trainer::~Trainer() = default;

int64_t Trainer::tokens_per_step() const {
  return config_.train.microbatches * config_.train.microbatch * config_.model.seq_len;
}

uint64_t Trainer::SpillBytes() const { return store_->SpillBytes(); }

namespace {

// Pieces of a tensor: [begin, begin + count) with begin a multiple of the store's piece length.
template <typename Body>
void ForEachPiece(const StateStore& store, const ParamSpec& spec, Body&& body) {
  const int64_t n = spec.numel(), piece = store.PieceFloats();
  for (int64_t begin = 0; begin < n;) {
    const int64_t count = std::min(piece, n - begin);  // piece may be INT64_MAX (in RAM)
    body(begin, count);
    begin += count;
  }
}

}  // namespace

uint64_t StateBytes(const ModelConfig& model) {
  uint64_t floats = 0;
  for (const ParamSpec& spec : ParameterSpecs(model)) floats += static_cast<uint64_t>(spec.numel());
  return floats * sizeof(float) * kStateArrayCount;
}

void Trainer::UpdateAndHash(bool update, const rk::AdamWParams& adam_template, float clip_factor) {
  // Only a spilled pass is long enough to show (it reads and writes the state on disk).
  ProgressLine progress(update ? "update and hash" : "hash", StateBytes(config_.model),
                        progress_ && store_->SpillBytes() > 0);
  std::vector<TensorDigest> digests;
  for (size_t i = 0; i < specs_.size(); ++i) {
    std::array<Blake2b, kStateArrayCount> hashers;
    ForEachPiece(*store_, specs_[i], [&](int64_t begin, int64_t count) {
      std::array<Piece, kStateArrayCount> p;
      for (int a = 0; a < kStateArrayCount; ++a) {
        p[a] = store_->Acquire(static_cast<StateArray>(a), i, begin, count, /*load=*/true);
      }
      if (update) {
        const std::span<float> grad = p[int(StateArray::kGrad)].data;
        if (clip_factor != 1.0f) rk::Scale(grad, clip_factor);
        rk::AdamWParams adam = adam_template;
        if (!specs_[i].weight_decay) adam.weight_decay = 0.0f;
        rk::AdamWUpdate(adam, p[int(StateArray::kParam)].data, grad, p[int(StateArray::kM)].data,
                        p[int(StateArray::kV)].data);
      }
      // The four arrays' digests are independent streams.
      ParallelFor(kStateArrayCount, [&](int64_t a) {
        hashers[static_cast<size_t>(a)].Update(std::span<const float>(p[a].data));
      });
      // An unscaled gradient is unchanged: only what the update wrote is stored back.
      for (const Piece& piece : p) {
        store_->Release(piece, update && (piece.array != StateArray::kGrad || clip_factor != 1.0f));
      }
      progress.Add(static_cast<uint64_t>(count) * sizeof(float) * kStateArrayCount);
    });
    digests.push_back({specs_[i].name, specs_[i].shape, hashers[0].Final(), hashers[1].Final(),
                       hashers[2].Final(), hashers[3].Final()});
  }
  hash_ = StateHashFromDigests(state_, digests);
}

void Trainer::Initialize() {
  store_->Zero();
  const std::string descriptor = state_.descriptor;
  state_ = StepState{};
  state_.descriptor = descriptor;
  state_.rng_seed = config_.train.seed;
  const std::vector<int64_t> first_draws = FirstDraws(specs_);
  {
    ProgressLine progress("initialise", StateBytes(config_.model) / kStateArrayCount, progress_);
    for (size_t i = 0; i < specs_.size(); ++i) {
      ForEachPiece(*store_, specs_[i], [&](int64_t begin, int64_t count) {
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

StateHash Trainer::Restore(const CheckpointIndex& checkpoint, FileDigests digests) {
  const std::string where = checkpoint.dir.string();
  if (checkpoint.state.descriptor != state_.descriptor) {
    Fail("{}: meta.json descriptor differs from this run's (config and data must be those the "
         "checkpoint was trained with)\n  checkpoint: {}\n  this run:   {}",
         where, checkpoint.state.descriptor, state_.descriptor);
  }
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
  ProgressLine progress("load " + where, StateBytes(config_.model), progress_);
  const StateHash recomputed = store_->Load(checkpoint, digests, [&](uint64_t bytes) {
    progress.Add(bytes);
  });
  progress.Finish();
  if (digests == FileDigests::kEnforce) VerifyStreamedHash(checkpoint, recomputed);
  state_ = checkpoint.state;
  hash_ = recomputed;
  return recomputed;
}

fs::path Trainer::WriteCheckpoint(const fs::path& run_dir) {
  ProgressLine progress(fmt::format("write checkpoint step {}", state_.step), StateBytes(config_.model),
                        progress_);
  // Bounded pieces: the writer's buffer is one piece, whatever the store (in RAM a store's
  // piece is a whole tensor).
  const WrittenCheckpoint written = WriteCheckpointStreamed(
      run_dir, state_, shapes_, std::min(store_->PieceFloats(), kSpillPieceFloats),
      [&](size_t i, StateArray a, int64_t begin, std::span<float> out) {
        ReadPiece(i, a, begin, out);
        progress.Add(out.size_bytes());
      });
  progress.Finish();
  if (written.hash.hash != hash_.hash) {
    Fail("{}: the checkpoint written hashes to {}, but the trainer's state hash is {}",
         written.dir.string(), ToHex(written.hash.hash), ToHex(hash_.hash));
  }
  return written.dir;
}

void Trainer::ReadPiece(size_t i, StateArray array, int64_t begin, std::span<float> out) {
  // In the store's pieces, so that a whole array copied out costs no second copy of it.
  const int64_t piece = store_->PieceFloats(), end = begin + static_cast<int64_t>(out.size());
  for (int64_t at = begin; at < end;) {
    const Piece p = store_->Acquire(array, i, at, std::min(piece, end - at), /*load=*/true);
    std::ranges::copy(p.data, out.begin() + (at - begin));
    store_->Release(p, /*store=*/false);
    at += static_cast<int64_t>(p.data.size());
  }
}

StepReport Trainer::Step() {
  const auto start = std::chrono::steady_clock::now();
  const TrainConfig& tc = config_.train;
  const int64_t seq = config_.model.seq_len, batch = tc.microbatch;
  StepReport report;
  report.step = state_.step + 1;
  report.lr = LearningRate(tc, static_cast<int64_t>(report.step));
  report.tokens = tokens_per_step();

  // 1. Microbatches in order; windows taken in order from the cursor; gradients accumulated.
  const float inv_tokens = 1.0f / static_cast<float>(report.tokens);
  Blake2b consumed;
  uint64_t cursor = state_.data_cursor;
  float loss_sum = 0.0f, zloss_sum = 0.0f;
  for (int64_t mb = 0; mb < tc.microbatches; ++mb) {
    for (int64_t b = 0; b < batch; ++b) {
      stream_.Window(cursor++, std::span(tokens_).subspan(b * (seq + 1), seq + 1));
    }
    consumed.Update(std::span(reinterpret_cast<const uint8_t*>(tokens_.data()),
                              tokens_.size() * sizeof(uint32_t)));
    const LossSums sums = model_.ForwardBackward(*store_, tokens_, inv_tokens, mb > 0);
    loss_sum = loss_sum + sums.loss;
    zloss_sum = zloss_sum + sums.zloss;
  }
  report.loss = loss_sum * inv_tokens;
  report.zloss = zloss_sum * inv_tokens;

  // 2. Global norm over every gradient in parameter order, piece by piece. A NaN gradient
  //    (whose bits the kernels do not fix) is made the canonical NaN here, before anything
  //    hashes or writes it; the scan runs only in a piece whose sum is NaN.
  std::vector<double> squares;
  for (size_t i = 0; i < specs_.size(); ++i) {
    double running = 0.0;
    ForEachPiece(*store_, specs_[i], [&](int64_t begin, int64_t count) {
      const Piece g = store_->Acquire(StateArray::kGrad, i, begin, count, /*load=*/true);
      running = rk::AddTensorSquares(running, g.data);
      const bool replaced = std::isnan(running) && rk::CanonicalizeNaNs(g.data) > 0;
      store_->Release(g, /*store=*/replaced);
    });
    squares.push_back(running);
  }
  report.grad_norm = rk::NormOfTensorSums(squares);

  // 3. Spike protocol: a non-finite loss or norm, or a norm above the threshold, skips the
  //    update; spike_max_skips skips within spike_window steps halt the run.
  report.skipped = !std::isfinite(report.loss + report.zloss) || !std::isfinite(report.grad_norm) ||
                   report.grad_norm > static_cast<float>(tc.spike_threshold);
  SpikeState& spike = state_.spike;
  std::erase_if(spike.recent_skips, [&](uint64_t s) {
    return report.step - s >= static_cast<uint64_t>(tc.spike_window);
  });
  rk::AdamWParams adam;
  if (report.skipped) {
    spike.total_skips += 1;
    spike.recent_skips.push_back(report.step);
    report.halt = spike.recent_skips.size() >= static_cast<size_t>(tc.spike_max_skips);
  } else {
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
  state_.tokens_digest = consumed.Final();
  state_.data_cursor = cursor;
  UpdateAndHash(!report.skipped, adam, report.clip_factor);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace lockstep::train
