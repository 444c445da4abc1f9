// bench_generate: generation speed of lockstep's KV-cache decoder (infer::KvDecoder), prefill and
// decode, at each thread count and batch size, with this machine's memory read bandwidth
// measured in the same process and the decode speed it allows.
//
//   bench_generate [--config NAME|PATH | --checkpoint DIR] [--prompt 128] [--decode 64]
//                  [--threads 1,2] [--batches 1,8] [--reps 2] [--bandwidth-mib 1024]
//                  [--profile] [--no-bandwidth]
//
// The model: a config's parameters from InitParameters (seed 1; the values do not change the
// speed), or a checkpoint through the verified load (what scripts/bench-generate.sh uses, so that
// llama.cpp runs the same weights from the checkpoint's GGUF export). A batch of B is B slots of
// one KvDecoder, every slot given the same prompt (fixed ids below 256 and the vocabulary):
// prefill is one Append of the B prompts (logits of each last position), decode is `--decode`
// Appends of one token per slot, each the argmax of the slot's previous logits (greedy).
// Each (threads, batch) pair runs one untimed warm-up and then `--reps` timed generations; the
// best prefill and the best decode are kept. Tokens/s count every slot's tokens.
//
// Bandwidth: a streaming read (a sum of 64-bit words, four streams per thread) over
// `--bandwidth-mib` MiB, far larger than the caches, split over the threads, best of 5. The decode
// bound at batch B:
//   B · bandwidth / (parameter bytes read per step + B · KV-cache bytes read per token)
// parameter bytes: every tensor but the token embeddings (one row of it is read), in fp32; KV
// bytes: the keys and values each layer's attention reads (its window or every position), at
// the mean decode position. Both are printed.
//
// --profile: one more decode at batch 1 per thread count with an OpObserver that times every
// kernel call: seconds per token by op (GEMMs by shape, with the GB/s at which they read their
// weights), and the time outside the observed ops.
//
// Prints one JSON object. The greedy tokens of slot 0 are compared across every run (thread
// counts, batch sizes): `greedy_tokens_same` (the decoder's bits do not depend on either).
#include <fmt/format.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/core.h"
#include "lockstep/infer.h"
#include "lockstep/kernels.h"
#include "lockstep/model.h"
#include "op_timer.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace infer = lockstep::infer;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    out.push_back(std::stoll(text.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return out;
}

// ---- memory read bandwidth -------------------------------------------------------------------
// A sum of 64-bit words (integer adds: any order gives the same sum) over four streams a quarter
// of the range apart, as a GEMV reads many weight rows at once: on the Zen 5 four streams read
// 5-20 % faster than one. AVX-512 loads where the CPU has them, else AVX2 (the library's
// baseline flags would give 16-byte loads). n: a multiple of 128 words.
__attribute__((target("avx512f"))) uint64_t SumWordsAvx512(const uint64_t* p, int64_t n) {
  const int64_t q = n / 4;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < q; i += 8) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + q + i));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + 2 * q + i));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + 3 * q + i));
  }
  // Stored and added here: GCC 12's _mm512_reduce_add_epi64 trips its own -Wuninitialized.
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t sum = 0;
  for (const uint64_t lane : lanes) sum += lane;
  return sum;
}
__attribute__((target("avx2"))) uint64_t SumWordsAvx2(const uint64_t* p, int64_t n) {
  const int64_t q = n / 4;
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < q; i += 4) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + q + i)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 2 * q + i)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 3 * q + i)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
uint64_t SumWordsBaseline(const uint64_t* p, int64_t n) {
  uint64_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += p[i];
  return s;
}

double ReadBandwidthGBps(int threads, int64_t mib) {
  const int64_t words = mib * (1 << 20) / 8;
  const std::unique_ptr<uint64_t, decltype(&std::free)> buffer(
      static_cast<uint64_t*>(std::aligned_alloc(64, static_cast<size_t>(words) * 8)), &std::free);
  if (!buffer) lockstep::Fail("bench_generate: cannot allocate {} MiB", mib);
  lockstep::SetThreads(threads);
  const auto share = [&](int64_t t, int64_t& begin, int64_t& end) {
    begin = words * t / threads / 128 * 128;
    end = t + 1 == threads ? words : words * (t + 1) / threads / 128 * 128;
  };
  lockstep::ParallelForEachThread([&](int64_t t) {  // first touch by the thread that reads it
    int64_t b = 0, e = 0;
    share(t, b, e);
    for (int64_t i = b; i < e; ++i) buffer.get()[i] = static_cast<uint64_t>(i);
  });
  const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
  std::vector<uint64_t> sums(static_cast<size_t>(threads));
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = Clock::now();
    lockstep::ParallelForEachThread([&](int64_t t) {
      int64_t b = 0, e = 0;
      share(t, b, e);
      const uint64_t* p = buffer.get() + b;
      sums[static_cast<size_t>(t)] = avx512 ? SumWordsAvx512(p, e - b)
                                     : avx2 ? SumWordsAvx2(p, e - b)
                                            : SumWordsBaseline(p, e - b);
    });
    best = std::min(best, Since(start));
  }
  uint64_t total = 0;
  for (const uint64_t s : sums) total += s;
  if (total != static_cast<uint64_t>(words) * static_cast<uint64_t>(words - 1) / 2) {
    lockstep::Fail("bench_generate: the bandwidth sum is wrong");
  }
  return static_cast<double>(words * 8) / best * 1e-9;
}

// ---- the model's bytes ----------------------------------------------------------------------
// What decode reads per element of a weight matrix: binary32, or the bfloat16s the decoder packs
// a bf16 compute copy as.
double WeightElementBytes(const lockstep::ModelConfig& c) {
  return c.compute_weights == lockstep::Storage::kBf16 ? 2.0 : 4.0;
}

struct Bytes {
  double parameters_total = 0;   // every tensor, fp32
  double parameters_read = 0;    // read per decode step: all but the embedding table, + one row
  double kv_read_per_token = 0;  // keys and values read by attention, at the mean decode position
};

Bytes ModelBytes(const lockstep::ModelConfig& c, int64_t prompt, int64_t decode) {
  Bytes b;
  for (const lockstep::ParamSpec& spec : lockstep::ParameterSpecs(c)) {
    const double bytes = 4.0 * static_cast<double>(spec.numel());
    b.parameters_total += bytes;
    if (spec.name == "tok_embeddings.weight") {
      b.parameters_read += 4.0 * static_cast<double>(c.d_model);
    } else {
      b.parameters_read += spec.is_matrix ? bytes / 4.0 * WeightElementBytes(c) : bytes;
    }
  }
  const double kv = static_cast<double>(c.n_kv_heads * c.head_dim);
  double keys = 0;  // summed over layers and decode positions
  for (int64_t t = prompt; t < prompt + decode; ++t) {
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const int64_t window = lockstep::LayerWindow(c, l);
      keys += static_cast<double>(window > 0 ? std::min(t + 1, window) : t + 1);
    }
  }
  b.kv_read_per_token = 2 * 4 * kv * keys / static_cast<double>(std::max<int64_t>(decode, 1));
  return b;
}

using lockstep::bench::OpTimer;

// ---- generation ---------------------------------------------------------------------------
struct Timing {
  double prefill = 1e30, decode = 1e30;
  std::vector<uint32_t> greedy;  // slot 0's decoded tokens
};

uint32_t Argmax(std::span<const float> row) {
  size_t best = 0;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] > row[best]) best = i;
  }
  return static_cast<uint32_t>(best);
}

// One generation of `batch` slots: prefill `prompt`, then `decode` greedy steps. Returns the
// seconds of each phase; slot 0's tokens into `greedy`.
std::pair<double, double> Generate(infer::KvDecoder& decoder, const std::vector<uint32_t>& prompt,
                                   int64_t batch, int64_t decode, int64_t vocab,
                                   std::vector<uint32_t>* greedy) {
  for (int64_t s = 0; s < batch; ++s) decoder.Reset(s);
  std::vector<infer::KvDecoder::Piece> pieces(static_cast<size_t>(batch));
  for (int64_t s = 0; s < batch; ++s) pieces[static_cast<size_t>(s)] = {s, prompt};
  auto start = Clock::now();
  std::vector<float> logits = decoder.Append(pieces, false);
  const double prefill = Since(start);
  std::vector<uint32_t> next(static_cast<size_t>(batch));
  const auto pick = [&] {
    for (int64_t s = 0; s < batch; ++s) {
      next[static_cast<size_t>(s)] = Argmax(std::span<const float>(logits).subspan(
          static_cast<size_t>(s * vocab), static_cast<size_t>(vocab)));
    }
    if (greedy != nullptr) greedy->push_back(next[0]);
  };
  if (greedy != nullptr) greedy->clear();
  pick();
  start = Clock::now();
  for (int64_t step = 0; step < decode; ++step) {
    for (int64_t s = 0; s < batch; ++s) {
      pieces[static_cast<size_t>(s)] = {
          s, std::span<const uint32_t>(&next[static_cast<size_t>(s)], 1)};
    }
    logits = decoder.Append(pieces, false);
    pick();
  }
  return {prefill, Since(start)};
}

int Usage() {
  fmt::print(stderr,
             "usage: bench_generate [--config NAME|PATH | --checkpoint DIR] [--prompt N] "
             "[--decode N]\n"
             "                      [--threads 1,2] [--batches 1,8] [--reps N] "
             "[--bandwidth-mib N] [--profile] [--no-bandwidth]\n");
  return 2;
}

int Main(int argc, char** argv) {
  std::string config_name = "smoke", checkpoint;
  int64_t prompt_len = 128, decode_len = 64, reps = 2, bandwidth_mib = 1024;
  std::vector<int64_t> thread_list = {1, 2}, batch_list = {1, 8};
  bool profile = false, bandwidth = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) lockstep::Fail("bench_generate: {} needs a value", arg);
      return argv[++i];
    };
    if (arg == "--config") {
      config_name = value();
    } else if (arg == "--checkpoint") {
      checkpoint = value();
    } else if (arg == "--prompt") {
      prompt_len = std::stoll(value());
    } else if (arg == "--decode") {
      decode_len = std::stoll(value());
    } else if (arg == "--threads") {
      thread_list = ParseList(value());
    } else if (arg == "--batches") {
      batch_list = ParseList(value());
    } else if (arg == "--reps") {
      reps = std::stoll(value());
    } else if (arg == "--bandwidth-mib") {
      bandwidth_mib = std::stoll(value());
    } else if (arg == "--profile") {
      profile = true;
    } else if (arg == "--no-bandwidth") {
      bandwidth = false;
    } else {
      return Usage();
    }
  }
  // The model.
  std::optional<infer::VerifiedModel> verified;
  std::unique_ptr<lockstep::ParamStore> own;
  lockstep::RunConfig config;
  const auto load_start = Clock::now();
  if (!checkpoint.empty()) {
    verified.emplace(infer::LoadVerified(checkpoint));
    config = verified->config;
  } else {
    config = lockstep::LoadRunConfig(config_name);
    own = std::make_unique<lockstep::ParamStore>(lockstep::ParameterSpecs(config.model));
    lockstep::SetThreads(2);
    lockstep::InitParameters(config.model, 1, *own);
  }
  const double load_seconds = Since(load_start);
  const lockstep::ParamStore& params = verified ? verified->params : *own;
  const lockstep::ModelConfig& c = config.model;
  if (prompt_len < 1 || decode_len < 1 || prompt_len + decode_len + 1 > c.seq_len) {
    lockstep::Fail("bench_generate: prompt {} + decode {} must fit in seq_len {}", prompt_len,
                   decode_len, c.seq_len);
  }
  std::vector<uint32_t> prompt(static_cast<size_t>(prompt_len));
  uint32_t state = 12345;
  for (uint32_t& t : prompt) {
    state = state * 1664525u + 1013904223u;
    t = (state >> 8) % static_cast<uint32_t>(std::min<int64_t>(256, c.vocab));
  }
  const Bytes bytes = ModelBytes(c, prompt_len, decode_len);

  std::map<int64_t, double> gbps;
  if (bandwidth) {
    for (const int64_t t : thread_list)
      gbps[t] = ReadBandwidthGBps(static_cast<int>(t), bandwidth_mib);
  }

  std::string runs_json, profile_json;
  std::vector<uint32_t> reference_greedy;
  bool greedy_same = true;
  for (const int64_t threads : thread_list) {
    lockstep::SetThreads(static_cast<int>(threads));
    for (const int64_t batch : batch_list) {
      infer::KvDecoder decoder(c, params, batch);
      std::vector<uint32_t> greedy;
      const std::vector<uint32_t> warm(prompt.begin(),
                                       prompt.begin() + std::min<int64_t>(8, prompt_len));
      Generate(decoder, warm, batch, 2, c.vocab, nullptr);  // warm-up: scratch, page faults
      Timing best;
      for (int64_t r = 0; r < reps; ++r) {
        const auto [p, d] = Generate(decoder, prompt, batch, decode_len, c.vocab, &greedy);
        best.prefill = std::min(best.prefill, p);
        best.decode = std::min(best.decode, d);
        if (reference_greedy.empty()) reference_greedy = greedy;
        greedy_same = greedy_same && greedy == reference_greedy;
      }
      const double b = static_cast<double>(batch);
      const double decode_tps = b * static_cast<double>(decode_len) / best.decode;
      std::string bound = "null", ratio = "null";
      if (bandwidth) {
        const double limit =
            b * gbps[threads] * 1e9 / (bytes.parameters_read + b * bytes.kv_read_per_token);
        bound = fmt::format("{:.2f}", limit);
        ratio = fmt::format("{:.3f}", decode_tps / limit);
      }
      runs_json += fmt::format(
          "{}    {{\"threads\": {}, \"batch\": {}, \"prefill_seconds\": {:.5f}, "
          "\"prefill_tokens_per_second\": {:.1f}, \"decode_seconds\": {:.5f}, "
          "\"decode_tokens_per_second\": {:.2f}, \"decode_ms_per_step\": {:.3f}, "
          "\"decode_bandwidth_limit_tokens_per_second\": {}, \"decode_over_bandwidth_limit\": {}, "
          "\"decode_effective_read_gb_per_second\": {:.2f}}}",
          runs_json.empty() ? "" : ",\n", threads, batch, best.prefill,
          b * static_cast<double>(prompt_len) / best.prefill, best.decode, decode_tps,
          best.decode / static_cast<double>(decode_len) * 1e3, bound, ratio,
          (bytes.parameters_read + b * bytes.kv_read_per_token) * static_cast<double>(decode_len) /
              best.decode * 1e-9);
    }
    if (profile) {
      infer::KvDecoder decoder(c, params, 1);
      OpTimer timer(WeightElementBytes(c));
      Generate(decoder, prompt, 1, 2, c.vocab, nullptr);
      decoder.Reset(0);
      std::vector<infer::KvDecoder::Piece> pieces = {{0, prompt}};
      std::vector<float> logits = decoder.Append(pieces, false);
      decoder.set_hooks({&timer, nullptr});
      const auto start = Clock::now();
      for (int64_t step = 0; step < decode_len; ++step) {
        uint32_t next = Argmax(logits);
        pieces[0] = {0, std::span<const uint32_t>(&next, 1)};
        logits = decoder.Append(pieces, false);
      }
      const double per_token = Since(start) / static_cast<double>(decode_len);
      std::vector<std::pair<std::string, OpTimer::Total>> rows(timer.totals().begin(),
                                                               timer.totals().end());
      std::sort(rows.begin(), rows.end(),
                [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
      std::string ops;
      double observed = 0;
      for (const auto& [key, t] : rows) {
        const double ms = t.seconds / static_cast<double>(decode_len) * 1e3;
        observed += ms;
        ops += fmt::format(
            "{}        {{\"op\": \"{}\", \"calls_per_token\": {}, \"ms_per_token\": {:.4f}, "
            "\"share\": {:.4f}{}}}",
            ops.empty() ? "" : ",\n", key, t.calls / decode_len, ms, ms / (per_token * 1e3),
            t.weight_bytes > 0 ? fmt::format(", \"weight_read_gb_per_second\": {:.2f}",
                                             t.weight_bytes / t.seconds * 1e-9)
                               : "");
      }
      profile_json += fmt::format(
          "{}    {{\"threads\": {}, \"batch\": 1, \"ms_per_token_with_observer\": {:.4f}, "
          "\"ms_outside_observed_ops\": {:.4f}, \"ops\": [\n{}\n    ]}}",
          profile_json.empty() ? "" : ",\n", threads, per_token * 1e3, per_token * 1e3 - observed,
          ops);
    }
  }

  std::string bw_json;
  for (const auto& [t, g] : gbps) {
    bw_json += fmt::format("{}{{\"threads\": {}, \"gb_per_second\": {:.2f}}}",
                           bw_json.empty() ? "" : ", ", t, g);
  }
  fmt::print(
      "{{\n  \"runtime\": \"lockstep KvDecoder\",\n  \"config\": \"{}\",\n  \"source\": \"{}\",\n"
      "  \"load_seconds\": {:.2f},\n  \"lockstep_variant\": \"{}\",\n  \"parameters\": {},\n"
      "  \"parameter_bytes\": {:.0f},\n  \"weight_matrices_read_as\": \"{}\",\n"
      "  \"parameter_bytes_read_per_decode_step\": {:.0f},\n"
      "  \"kv_bytes_read_per_token_mean\": {:.0f},\n  \"prompt_tokens\": {},\n"
      "  \"decode_tokens\": {},\n  \"reps\": {},\n  \"read_bandwidth\": [{}],\n"
      "  \"bandwidth_buffer_mib\": {},\n  \"greedy_tokens_same\": {},\n  \"runs\": [\n{}\n  "
      "]{}\n}}\n",
      config.name, checkpoint.empty() ? "InitParameters seed 1" : checkpoint, load_seconds,
      lockstep::rk::ActiveIsa().name, params.NumParameters(), bytes.parameters_total,
      WeightElementBytes(c) == 2 ? "bf16" : "f32", bytes.parameters_read, bytes.kv_read_per_token,
      prompt_len, decode_len, reps, bw_json, bandwidth_mib, greedy_same ? "true" : "false",
      runs_json, profile ? fmt::format(",\n  \"profile_decode\": [\n{}\n  ]", profile_json) : "");
  return greedy_same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_generate: {}\n", e.what());
    return 2;
  }
}
