// The training step: docs/training.md gives the exact order of everything below.
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "lockstep/kernels.h"
#include "lockstep/train.h"

namespace lockstep::train {

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

Trainer::Trainer(const RunConfig& config, const data::Dataset& dataset, std::string descriptor)
    : config_(config),
      stream_(dataset, config.train.data_seed, static_cast<uint32_t>(config.model.seq_len)),
      model_(config.model, config.train.vocab_chunk, config.train.microbatch,
             config.model.seq_len),
      params_(ParameterSpecs(config.model)),
      grads_(ParameterSpecs(config.model)),
      m_(ParameterSpecs(config.model)),
      v_(ParameterSpecs(config.model)),
      tokens_(static_cast<size_t>(config.train.microbatch * (config.model.seq_len + 1))) {
  state_.descriptor = std::move(descriptor);
  state_.rng_seed = config.train.seed;
}

int64_t Trainer::tokens_per_step() const {
  return config_.train.microbatches * config_.train.microbatch * config_.model.seq_len;
}

std::vector<TensorState> Trainer::Tensors() const {
  std::vector<TensorState> tensors;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamSpec& spec = params_.Spec(i);
    tensors.push_back({spec.name, spec.shape, params_.Tensor(i), m_.Tensor(i), v_.Tensor(i),
                       grads_.Tensor(i)});
  }
  return tensors;
}

void Trainer::Rehash() { hash_ = ComputeStateHash(state_, Tensors()); }

void Trainer::Initialize() {
  params_.Zero();
  grads_.Zero();
  m_.Zero();
  v_.Zero();
  const std::string descriptor = state_.descriptor;
  state_ = StepState{};
  state_.descriptor = descriptor;
  state_.rng_seed = config_.train.seed;
  state_.rng_counter = static_cast<uint64_t>(InitParameters(config_.model, config_.train.seed, params_));
  Rehash();
}

void Trainer::Restore(const Checkpoint& checkpoint) {
  if (checkpoint.state.descriptor != state_.descriptor) {
    Fail("{}: meta.json descriptor differs from this run's (config and data must be those the "
         "checkpoint was trained with)\n  checkpoint: {}\n  this run:   {}",
         checkpoint.dir.string(), checkpoint.state.descriptor, state_.descriptor);
  }
  if (checkpoint.tensors.size() != params_.size()) {
    Fail("{}: holds {} tensors, the model has {}", checkpoint.dir.string(),
         checkpoint.tensors.size(), params_.size());
  }
  for (const TensorState& t : checkpoint.tensors) {
    const size_t i = params_.Find(t.name);
    if (t.shape != params_.Spec(i).shape) {
      Fail("{}: tensor {} has a different shape from the model's", checkpoint.dir.string(), t.name);
    }
    std::copy(t.param.begin(), t.param.end(), params_.Tensor(i).begin());
    std::copy(t.m.begin(), t.m.end(), m_.Tensor(i).begin());
    std::copy(t.v.begin(), t.v.end(), v_.Tensor(i).begin());
    std::copy(t.grad.begin(), t.grad.end(), grads_.Tensor(i).begin());
  }
  state_ = checkpoint.state;
  Rehash();
  if (hash_.hash != checkpoint.state_hash) {
    Fail("{}: restored state hashes to {}, meta.json says {}", checkpoint.dir.string(),
         ToHex(hash_.hash), ToHex(checkpoint.state_hash));
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
    const LossSums sums = model_.ForwardBackward(params_, tokens_, inv_tokens, mb > 0, grads_);
    loss_sum = loss_sum + sums.loss;
    zloss_sum = zloss_sum + sums.zloss;
  }
  report.loss = loss_sum * inv_tokens;
  report.zloss = zloss_sum * inv_tokens;

  // 2. Global norm over every gradient in parameter order.
  std::vector<std::span<const float>> grads;
  for (size_t i = 0; i < grads_.size(); ++i) grads.push_back(grads_.Tensor(i));
  report.grad_norm = rk::GlobalNorm(grads);

  // 3. Spike protocol: a non-finite loss or norm, or a norm above the threshold, skips the
  //    update; spike_max_skips skips within spike_window steps halt the run.
  report.skipped = !std::isfinite(report.loss + report.zloss) || !std::isfinite(report.grad_norm) ||
                   report.grad_norm > static_cast<float>(tc.spike_threshold);
  SpikeState& spike = state_.spike;
  std::erase_if(spike.recent_skips, [&](uint64_t s) {
    return report.step - s >= static_cast<uint64_t>(tc.spike_window);
  });
  if (report.skipped) {
    spike.total_skips += 1;
    spike.recent_skips.push_back(report.step);
    report.halt = spike.recent_skips.size() >= static_cast<size_t>(tc.spike_max_skips);
  } else {
    // 4. Stateless clipping, then AdamW per tensor (weight decay only where the spec says).
    report.clip_factor = rk::ClipFactor(report.grad_norm, static_cast<float>(tc.clip_norm));
    state_.optimizer_step += 1;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (report.clip_factor != 1.0f) rk::Scale(grads_.Tensor(i), report.clip_factor);
      const rk::AdamWParams adam{report.lr,
                                 static_cast<float>(tc.beta1),
                                 static_cast<float>(tc.beta2),
                                 static_cast<float>(tc.eps),
                                 params_.Spec(i).weight_decay ? static_cast<float>(tc.weight_decay)
                                                              : 0.0f,
                                 static_cast<int64_t>(state_.optimizer_step)};
      rk::AdamWUpdate(adam, params_.Tensor(i), grads_.Tensor(i), m_.Tensor(i), v_.Tensor(i));
    }
  }

  // 5. The chained hash, inside the step: the gradients are still those of this step.
  state_.prev_hash = hash_.hash;
  state_.step = report.step;
  state_.lr = report.lr;
  state_.grad_norm = report.grad_norm;
  state_.clip_factor = report.clip_factor;
  state_.skipped = report.skipped;
  state_.tokens_digest = consumed.Final();
  state_.data_cursor = cursor;
  Rehash();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace lockstep::train
