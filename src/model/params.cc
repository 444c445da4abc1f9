// Parameters: the canonical list, the contiguous store, and the seeded initialisation.
#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <map>
#include <string>

#include "lockstep/core.h"
#include "lockstep/kernels.h"
#include "lockstep/model.h"

namespace lockstep {

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t extent : shape) n *= extent;
  return n;
}

std::vector<ParamSpec> ParameterSpecs(const ModelConfig& c) {
  const int64_t d = c.d_model, q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  std::vector<ParamSpec> specs;
  auto gain = [&](std::string name) { specs.push_back({std::move(name), {d}, false, false}); };
  auto matrix = [&](std::string name, int64_t rows, int64_t cols, bool decay = true) {
    specs.push_back({std::move(name), {rows, cols}, decay, true});
  };
  matrix("tok_embeddings.weight", c.vocab, d, /*decay=*/false);
  if (c.embedding_norm) gain("emb_norm.weight");
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (size_t which = 0; which < kTensorsPerLayer; ++which) {
      const std::string name = fmt::format("layers.{}.{}", l, kLayerTensorNames[which]);
      switch (static_cast<LayerTensor>(which)) {
        case kAttnNorm:
        case kFfnNorm:
          gain(name);
          break;
        case kWq:
          matrix(name, q_dim, d);
          break;
        case kWk:
        case kWv:
          matrix(name, kv_dim, d);
          break;
        case kWo:
          matrix(name, d, q_dim);
          break;
        case kWGateUp:
          matrix(name, 2 * c.ffn_hidden, d);
          break;  // gate, then up
        case kWDown:
          matrix(name, d, c.ffn_hidden);
          break;
      }
      specs.back().layer = l;
    }
  }
  gain("final_norm.weight");
  matrix("output.weight", c.vocab, d);
  if (c.linear == Linear::kInt8) {
    const ParamIndex P(c);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (size_t j = 0; j < kLayerLinears.size(); ++j) {
        const ParamSpec& weight = specs[P.Layer(l, kLayerLinears[j])];
        specs.push_back({.name = fmt::format("layers.{}.{}", l, kLayerScaleNames[j]),
                         .shape = {weight.shape[0]},
                         .is_scale = true,
                         .layer = l});
      }
    }
  }
  return specs;
}

double ModelFlopsPerStep(const RunConfig& config) {
  const ModelConfig& m = config.model;
  double matmul_params = 0;
  for (const ParamSpec& spec : ParameterSpecs(m)) {
    if (spec.shape.size() == 2 && spec.name != "tok_embeddings.weight") {
      matmul_params += static_cast<double>(spec.numel());
    }
  }
  const auto sequences = static_cast<double>(config.train.microbatch * config.train.microbatches);
  double pairs = 0;  // visible (query, key) pairs of one sequence, summed over layers
  for (int64_t layer = 0; layer < m.n_layers; ++layer) {
    const int64_t window = LayerWindow(m, layer);
    for (int64_t q = 0; q < m.seq_len; ++q) {
      pairs += static_cast<double>(window > 0 ? std::min(q + 1, window) : q + 1);
    }
  }
  return 6.0 * matmul_params * sequences * static_cast<double>(m.seq_len) +
         12.0 * static_cast<double>(m.head_dim * m.n_heads) * pairs * sequences;
}

namespace {
// A tensor's floats in a ParamStore: its elements, then padding to the next 64-byte boundary.
int64_t PaddedFloats(const ParamSpec& spec) {
  constexpr int64_t kAlignFloats = 64 / sizeof(float);
  return (spec.numel() + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}
}  // namespace

ParamStore::ParamStore(std::vector<ParamSpec> specs) : specs_(std::move(specs)) {
  int64_t end = 0;
  for (const ParamSpec& spec : specs_) {
    offsets_.push_back(end);
    end += PaddedFloats(spec);
  }
  data_.assign(static_cast<size_t>(end), 0.0f);
}

int64_t ParamStore::FlatFloats(const std::vector<ParamSpec>& specs) {
  int64_t floats = 0;
  for (const ParamSpec& spec : specs) floats += PaddedFloats(spec);
  return floats;
}

std::span<float> ParamStore::Tensor(size_t i) {
  return {data_.data() + offsets_.at(i), static_cast<size_t>(specs_[i].numel())};
}

std::span<const float> ParamStore::Tensor(size_t i) const {
  return {data_.data() + offsets_.at(i), static_cast<size_t>(specs_[i].numel())};
}

size_t ParamStore::Find(std::string_view name) const {
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].name == name) return i;
  }
  Fail("ParamStore: no tensor named '{}'", name);
}

int64_t ParamStore::NumParameters() const {
  int64_t n = 0;
  for (const ParamSpec& spec : specs_) n += spec.numel();
  return n;
}

void ParamStore::Zero() { std::fill(data_.begin(), data_.end(), 0.0f); }

// ---- initialisation (docs/model.md, "Initialisation") ----------------------------------------
namespace {

// Draws handled by one parallel task. The bits do not depend on it; only the split of the work
// does.
constexpr int64_t kInitBlock = 16384;

constexpr float kSqrt2 = 0x1.6a09e6p+0f;  // sqrt(2) rounded to binary32

// A scale tensor's weight rows are drawn again in chunks of about this many floats.
constexpr int64_t kScaleDrawFloats = int64_t{1} << 20;
int64_t ScaleRowsPerChunk(int64_t cols) { return std::max<int64_t>(1, kScaleDrawFloats / cols); }

// Scales [begin, begin + out.size()) of the scale tensor `spec`: those its weight's initial rows
// give (docs/model.md, "Initialisation"), the rows drawn again here.
void InitScaleRange(const ModelConfig& config, uint64_t seed, const ParamSpec& spec, int64_t begin,
                    std::span<float> out) {
  const std::vector<ParamSpec> specs = ParameterSpecs(config);
  const auto at =
      static_cast<size_t>(std::ranges::find(specs, spec.name, &ParamSpec::name) - specs.begin());
  LOCKSTEP_CHECK(at < specs.size() && specs[at].is_scale, "'{}' is no scale tensor", spec.name);
  const size_t w = ParamIndex(config).WeightOfScale(at);
  const int64_t cols = specs[w].shape[1], first_draw = FirstDraws(specs)[w];
  std::vector<float> maxima(out.size(), 0.0f);
  const int64_t rows = static_cast<int64_t>(out.size());
  const int64_t per_chunk = ScaleRowsPerChunk(cols);
  std::vector<float> drawn;
  for (int64_t r = 0; r < rows; r += per_chunk) {
    const int64_t n = std::min(per_chunk, rows - r);
    drawn.resize(static_cast<size_t>(n * cols));
    InitTensorRange(config, seed, specs[w], first_draw, (begin + r) * cols, drawn);
    rk::FoldRowMaxima(drawn, 0, cols,
                      std::span(maxima).subspan(static_cast<size_t>(r), static_cast<size_t>(n)));
  }
  rk::ScalesOfMaxima(maxima, out);
}

}  // namespace

namespace {
// The rows of every weight that has a scale tensor (int8 linears), whose maxima InitInPieces folds.
int64_t ScaledRows(const ModelConfig& config, const std::vector<ParamSpec>& specs) {
  if (config.linear != Linear::kInt8) return 0;
  int64_t rows = 0;
  for (size_t s = ParamIndex(config).scales; s < specs.size(); ++s) rows += specs[s].numel();
  return rows;
}
}  // namespace

void InitInPieces(const ModelConfig& config, uint64_t seed, int64_t piece_floats,
                  const std::function<void(size_t, int64_t, std::span<const float>)>& piece) {
  LOCKSTEP_CHECK(piece_floats >= 1, "pieces of {} floats", piece_floats);
  const std::vector<ParamSpec> specs = ParameterSpecs(config);
  const std::vector<int64_t> first_draws = FirstDraws(specs);
  const ParamIndex P(config);
  // Each scaled weight's rows' maxima, by weight index.
  std::map<size_t, std::vector<float>> maxima;
  if (config.linear == Linear::kInt8) {
    for (size_t s = P.scales; s < specs.size(); ++s) {
      maxima[P.WeightOfScale(s)].assign(static_cast<size_t>(specs[s].numel()), 0.0f);
    }
  }
  int64_t largest = 0;
  for (const ParamSpec& spec : specs) largest = std::max(largest, spec.numel());
  std::vector<float> buffer(static_cast<size_t>(std::min(piece_floats, largest)));
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& spec = specs[i];
    const auto folded = maxima.find(i);
    for (int64_t begin = 0; begin < spec.numel(); begin += piece_floats) {
      const std::span<float> out(buffer.data(),
                                 static_cast<size_t>(std::min(piece_floats, spec.numel() - begin)));
      if (spec.is_scale) {
        rk::ScalesOfMaxima(std::span<const float>(maxima.at(P.WeightOfScale(i)))
                               .subspan(static_cast<size_t>(begin), out.size()),
                           out);
      } else {
        InitTensorRange(config, seed, spec, first_draws[i], begin, out);
      }
      if (folded != maxima.end()) rk::FoldRowMaxima(out, begin, spec.shape[1], folded->second);
      piece(i, begin, out);
    }
  }
}

int64_t InitInPiecesFloats(const ModelConfig& config, int64_t piece_floats) {
  const std::vector<ParamSpec> specs = ParameterSpecs(config);
  int64_t largest = 0;
  for (const ParamSpec& spec : specs) largest = std::max(largest, spec.numel());
  return std::min(piece_floats, largest) + ScaledRows(config, specs);
}

void CheckWeightScales(const ModelConfig& config, const ParamStore& params, std::string_view what) {
  if (config.linear != Linear::kInt8) return;
  const ParamIndex P(config);
  std::vector<float> maxima, scales;
  for (size_t s = P.scales; s < params.size(); ++s) {
    const size_t w = P.WeightOfScale(s);
    const std::span<const float> have = params.Tensor(s);
    maxima.assign(have.size(), 0.0f);
    scales.resize(have.size());
    rk::FoldRowMaxima(params.Tensor(w), 0, params.Spec(w).shape[1], maxima);
    rk::ScalesOfMaxima(maxima, scales);
    for (size_t r = 0; r < have.size(); ++r) {
      if (std::bit_cast<uint32_t>(have[r]) != std::bit_cast<uint32_t>(scales[r])) {
        Fail(
            "{}: '{}' row {} is {} (0x{:08x}), but the scales of '{}' are their rows' largest "
            "magnitude / 127, {} (0x{:08x}) for this row: the scales do not belong to the "
            "weights",
            what, params.Spec(s).name, r, have[r], std::bit_cast<uint32_t>(have[r]),
            params.Spec(w).name, scales[r], std::bit_cast<uint32_t>(scales[r]));
      }
    }
  }
}

void InitTensorRange(const ModelConfig& config, uint64_t seed, const ParamSpec& spec,
                     int64_t first_draw, int64_t begin, std::span<float> out) {
  const int64_t n = spec.numel();
  if (begin < 0 || first_draw < 0 || begin + static_cast<int64_t>(out.size()) > n) {
    Fail("InitTensorRange: elements [{}, {}) of {} (first draw {}) are outside its {} elements",
         begin, begin + static_cast<int64_t>(out.size()), spec.name, first_draw, n);
  }
  if (spec.is_scale) {
    InitScaleRange(config, seed, spec, begin, out);
    return;
  }
  if (!spec.is_matrix) {
    std::fill(out.begin(), out.end(), 1.0f);
    return;
  }
  const float scale = static_cast<float>(config.init_std) * kSqrt2;  // one rounding
  const PhiloxKey key = PhiloxKeyFromSeed(seed);
  const bool by_table = InitByTable(spec) || rk::InitErfinvTableMade();
  if (by_table) rk::InitErfinvTable();  // made here, not inside a task
  const int64_t count = static_cast<int64_t>(out.size());
  ParallelFor((count + kInitBlock - 1) / kInitBlock, [&](int64_t block) {
    // The words of a block in pieces that stay in the first-level cache.
    constexpr int64_t kPiece = 2048;
    std::array<uint32_t, kPiece> words;
    for (int64_t p0 = block * kInitBlock, end = std::min(count, p0 + kInitBlock); p0 < end;
         p0 += kPiece) {
      const auto n = static_cast<size_t>(std::min(kPiece, end - p0));
      const std::span<uint32_t> drawn_words(words.data(), n);
      const std::span<float> drawn = out.subspan(static_cast<size_t>(p0), n);
      rk::PhiloxWords(key, static_cast<uint64_t>(first_draw + begin + p0), drawn_words);
      if (by_table) {
        rk::InitErfinvByTable(drawn_words, scale, drawn);
      } else {
        for (size_t e = 0; e < n; ++e) drawn[e] = rk::InitErfinvArgument(drawn_words[e]);
        rk::ErfinvInPlace(drawn);
        for (float& x : drawn) x = scale * x;
      }
    }
  });
}

std::vector<int64_t> FirstDraws(const std::vector<ParamSpec>& specs) {
  std::vector<int64_t> first;
  int64_t draw = 0;
  for (const ParamSpec& spec : specs) {
    first.push_back(draw);
    if (spec.is_matrix) draw += spec.numel();
  }
  first.push_back(draw);
  return first;
}

int64_t InitParameters(const ModelConfig& config, uint64_t seed, ParamStore& params) {
  const std::vector<ParamSpec> expected = ParameterSpecs(config);
  if (params.size() != expected.size()) {
    Fail("InitParameters: the store holds {} tensors, the config has {}", params.size(),
         expected.size());
  }
  const std::vector<int64_t> first = FirstDraws(expected);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& spec = params.Spec(i);
    if (spec.name != expected[i].name || spec.shape != expected[i].shape) {
      Fail("InitParameters: tensor {} is '{}', the config expects '{}'", i, spec.name,
           expected[i].name);
    }
    InitTensorRange(config, seed, spec, first[i], 0, params.Tensor(i));
  }
  return first.back();
}

}  // namespace lockstep
