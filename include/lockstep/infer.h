// lockstep infer: the trained model used outside training. The verified parameter load
// (checkpoint -> config -> parameters, every file's digest and the state hash checked before
// anything is used), a forward that needs no targets with a KV cache for decoding, generation with
// receipts, and export to other runtimes' formats. Layered above model, data and state, beside
// train (docs/architecture.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <functional>
#include <memory>
#include <optional>

#include "lockstep/data.h"
#include "lockstep/model.h"
#include "lockstep/state.h"

namespace lockstep::infer {

// ---- the verified load ------------------------------------------------------------------------
// The run config a checkpoint was trained with: its descriptor through ConfigOfDescriptor.
RunConfig ConfigOfCheckpoint(const Checkpoint& checkpoint);
RunConfig ConfigOfCheckpoint(const CheckpointIndex& checkpoint);

// A checkpoint's parameters, loaded and verified.
struct VerifiedModel {
  std::filesystem::path dir;
  RunConfig config;
  std::string descriptor;  // the run descriptor the checkpoint records
  Digest state_hash{};     // meta.json's, equal to the one recomputed from the files
  uint64_t step = 0;
  ParamStore params;
};
// Streams `dir` (a complete checkpoint, RUN/checkpoints/step_*) in pieces: RAM ~ the parameters,
// not the moments. Checks every file's digest, the state hash, and that the tensors are the ones
// the recorded config makes, by name, shape and order; fails naming the directory, the tensor and
// both values. Nothing is returned before every check has passed.
VerifiedModel LoadVerified(const std::filesystem::path& dir);

// The dataset a checkpoint trained on, opened and verified (data::OpenDataset): its
// manifest.json's BLAKE2b must be the descriptor's data_manifest_blake2b; fails naming the
// directory and both digests. Its vocabulary says which tokenizer made the model's token ids.
data::Dataset OpenTrainingData(const VerifiedModel& model, const std::filesystem::path& data);
// The tokenizer of such a dataset, to encode prompts and decode outputs: the byte tokenizer, or
// the tokenizer file the manifest names, found in the dataset's directory with the manifest's
// BLAKE2b (fails naming the file otherwise).
std::unique_ptr<data::Tokenizer> OpenTrainingTokenizer(const data::Dataset& dataset);

// Token ids from a file of raw little-endian uint32 (`lockstep forward --tokens`, `generate
// --prompt-tokens`): its size is checked against [min_ids, max_ids] ids before anything is read
// (a file that is not a regular file is refused), then every id against `vocab`. Fails naming
// the file, the sizes and the first bad id. `what_max` says where max_ids comes from.
std::vector<uint32_t> ReadTokenFile(const std::filesystem::path& path, uint64_t min_ids,
                                    uint64_t max_ids, std::string_view what_max, int64_t vocab);

// ---- a forward without targets, with a KV cache -------------------------------------------------
// The decoder of docs/model.md run on new tokens of sequences whose earlier positions are kept
// in a KV cache: every layer's k (after QK-norm and RoPE) and v of every position so far. The
// same ops as Model::Forward, on the rows of the new tokens only: every op works row by row and
// attention reads a query's own position and the keys it sees (docs/numerics.md, "Causal
// attention"), so a position's logits are the same bits whether its sequence is run whole
// (Model::Forward then Model::Logits), prefilled in pieces or decoded a token at a time, and
// whatever other sequences share the call (docs/inference.md, "Exactness").
class KvDecoder : private AttentionContext {
 public:
  // `slots` sequences of up to config.seq_len positions each, cached in RAM. The decoder reads
  // the weights in `params` in place (the ParamStore must outlive it), or with
  // model.compute_weights = bf16 their compute copy, made once here; and on the CPU the head and
  // the fp32 linears packed for decode's few rows, or the int8 linears' weights quantized, made
  // at the first call that needs them (CopyBytes).
  KvDecoder(const ModelConfig& config, const ParamStore& params, int64_t slots);
  // One sequence per slot of up to capacities[slot] positions (1 .. config.seq_len) each.
  KvDecoder(const ModelConfig& config, const ParamStore& params,
            std::span<const int64_t> capacities);
  ~KvDecoder();
  KvDecoder(const KvDecoder&) = delete;
  KvDecoder& operator=(const KvDecoder&) = delete;
  // The bytes the KV caches of slots of these capacities hold (the keys and values of every
  // layer), and the most one Append of `rows` new rows returning `logit_rows` rows of logits
  // holds besides (its activations and logits).
  static uint64_t CacheBytes(const ModelConfig& config, std::span<const int64_t> capacities);
  static uint64_t AppendBytes(const ModelConfig& config, int64_t rows, int64_t logit_rows);
  // The most bytes of the copies of weights a decoder makes: the bf16 compute copy (with
  // model.compute_weights = bf16) and, on the CPU (`on_cpu`), the packed head and, with
  // `linears` (set_linear_copies), the packed fp32 linears or the quantized int8 linears.
  static uint64_t CopyBytes(const ModelConfig& config, bool on_cpu, bool linears = true);
  // Whether the decoder makes its copies of the layers' linear weights (on by default): without
  // them each call reads the weights in place (and an int8 linear quantizes its weight on each
  // call, as training does); the same bits, slower, in less memory.
  void set_linear_copies(bool on) { linear_copies_ = on; }

  // New tokens of one sequence: they are its positions Length(slot) ..
  struct Piece {
    int64_t slot = 0;
    std::span<const uint32_t> tokens;
    std::string_view what = {};  // names the piece in errors; empty: "slot N"
  };
  // Runs every piece's tokens (each slot at most once per call; a piece may be empty) and
  // returns the logits [rows, vocab]: of every new position in piece order with every_position,
  // else of each non-empty piece's last position, in piece order. Fails, naming the piece and the
  // sizes, when a sequence would exceed seq_len or a token is outside the vocabulary; the cache is
  // then unchanged.
  std::vector<float> Append(std::span<const Piece> pieces, bool every_position);
  int64_t Length(int64_t slot) const;
  void Reset(int64_t slot);  // the slot's sequence starts again, empty
  int64_t slots() const { return static_cast<int64_t>(lengths_.size()); }

  // Every op call is reported to hooks.observer and run by hooks.executor where it runs it
  // (Model::set_hooks). An executor keeps the weights and the KV caches resident (planned
  // first: too large a model or batch for the device is refused, naming the sizes), so a token
  // sends the device its few rows of activations, not every weight again.
  void set_hooks(const OpHooks& hooks);

 private:
  // AttentionContext, for the pieces of the Append being run: per piece, RoPE at its positions,
  // its keys and values into the cache, and attention over the cache.
  void Attend(const OpHooks& hooks, int64_t layer, std::span<float> q, std::span<float> k,
              std::span<const float> v, std::span<float> attn) override;
  void Norm(int64_t layer, std::span<const float> x, std::span<const float> gain,
            std::span<float> y, int64_t rows, int64_t cols);
  std::span<float> Cache(std::vector<float>& cache, int64_t slot, int64_t from, int64_t rows);
  // Whether a call of `rows` rows runs the fp32 linears on their packings (packed_layers_, made
  // here at the first such call): at most rk::kGemvMaxRows rows on the CPU.
  bool PackedLinears(int64_t rows);
  // Whether the int8 linears run on their weights quantized once (quantized_layers_, made here at
  // the first call, its ops reported to the hooks): on the CPU with model.linear = int8.
  bool QuantizedLinears();

  ModelConfig config_;
  std::vector<int64_t> capacities_, first_;  // per slot: its positions, its first in the cache
  std::span<const float> tok_, emb_norm_, final_norm_, output_;
  std::span<const float> weights_;  // every parameter: the ParamStore's, or compute_'s
  // With model.compute_weights = bf16: the parameters rounded to bf16 but the int8 scales
  // (docs/model.md, "bf16 storage"); the embedding table's rows are the rounded rows training looks
  // up.
  std::unique_ptr<ParamStore> compute_;
  // On the CPU, for calls of at most rk::kGemvMaxRows rows: output_ packed (rk::PackForGemv),
  // and with model.linear = fp32 every layer's linears, each made at the first call that needs it.
  std::optional<rk::GemvPacking> head_;
  std::vector<LayerPackings> packed_layers_;
  std::vector<LayerInt8Weights> quantized_layers_;
  bool linear_copies_ = true;
  // What an executor keeps: the weights and every layer's KV caches (fixed in size and place).
  std::vector<std::span<const float>> Resident() const;
  std::vector<LayerTensors> layers_;
  // The Append being run: its pieces, and piece i's rows first_row_[i] .. first_row_[i + 1] - 1.
  std::span<const Piece> pieces_;
  std::vector<int64_t> first_row_;
  rk::RopeTable rope_;
  float scale_;
  std::vector<int64_t> lengths_;
  std::vector<std::vector<float>> k_cache_, v_cache_;  // per layer: each slot's [capacity, K]
  // Scratch for the rows of one call.
  std::vector<float> x_, y_, h_, rstd_, q_raw_, k_raw_, q_, k_, v_, attn_, gu_, act_;
  Int8Scratch int8_;  // model.linear = int8 only
  OpHooks hooks_;
};

// ---- generation (docs/inference.md) ------------------------------------------------------------
struct SamplingParams {
  int64_t max_tokens = 64;  // tokens generated per request at most
  float temperature = 0;    // 0: greedy (the lowest id of the largest logit)
  int64_t top_k = 0;        // 0: every id
  float top_p = 1;          // 1: no nucleus cut
  uint64_t seed = 0;
};
// The ranges of SamplingParams that generate takes and a receipt may hold.
inline constexpr int64_t kMaxTokensLimit = int64_t{1} << 40;
inline constexpr int64_t kMaxTopK = int64_t{1} << 31;
// Fails naming `what` and the field unless max_tokens is in [1, kMaxTokensLimit], temperature a
// finite binary32 that is +0 or above (not -0), top_k in [0, kMaxTopK] and top_p in (0, 1].
void CheckSampling(const SamplingParams& params, std::string_view what);
// The id sampled from `logits` for request `request` at position `position` (of the token being
// chosen): docs/numerics.md, "Sampling" -- fp32 in a fixed order, one Philox4x32-10 draw keyed by
// the seed at counter (request low, request high, position low, position high). Fails on a NaN.
uint32_t SampleToken(std::span<const float> logits, const SamplingParams& params, uint64_t request,
                     int64_t position);

struct Request {
  uint64_t id = 0;  // keys the request's draws: its tokens do not depend on the other requests
  std::vector<uint32_t> prompt;  // 1 .. seq_len ids
};
// The most requests one generation -- a --batch, and so a receipt -- may hold: generate refuses
// a larger batch and verify-generation a larger receipt before anything else is read of them.
inline constexpr size_t kMaxRequests = 4096;
// A --batch file's text (`source` names it in errors): one JSON object per line,
// {"prompt": TEXT} (encoded with `tokenizer`, which must then be given) or {"prompt_tokens":
// [ids]}, with an optional "id" (a decimal string; default: the line's index from 0); 1 to
// kMaxRequests lines, the ids distinct. Fails naming the line and the key.
std::vector<Request> ParseBatch(std::string_view text, const data::Tokenizer* tokenizer,
                                const std::string& source);
// The first two requests (positions, in order) that share an id, found in O(n log n); nothing
// when every id is distinct. Each request's draws are keyed by its id, so ids must be distinct.
std::optional<std::pair<size_t, size_t>> FirstSharedId(std::span<const Request> requests);
enum class Stop { kEndOfDocument, kMaxTokens, kSeqLen };
std::string_view StopName(Stop stop);  // "end_of_document", "max_tokens", "seq_len"
struct Generation {
  std::vector<uint32_t> tokens;  // generated, the end-of-document id included when it stopped
  // chain[i] = BLAKE2b-256(chain[i-1] || the logits that chose tokens[i], fp32 little-endian),
  // chain[-1] = PromptDigest(prompt) (docs/formats/receipt.md).
  std::vector<Digest> logits_chain;
  Stop stop = Stop::kMaxTokens;
};
// BLAKE2b-256 of the ids as uint32 little-endian.
Digest PromptDigest(std::span<const uint32_t> ids);
// Fails, naming the sizes, unless the KV caches of `requests` (each request's prompt and
// max_tokens positions, at most seq_len), the prefill's activations and the decoder's copies of
// weights without those of the linears (KvDecoder::CopyBytes; `on_cpu`: no executor) fit in
// `available` bytes; returns whether the copies of the linears fit too. Generate checks it
// against MemAvailable before it allocates anything, and makes those copies only when they fit
// (KvDecoder::set_linear_copies: the same bits either way).
bool CheckGenerationFits(const ModelConfig& config, std::span<const Request> requests,
                         const SamplingParams& params, uint64_t available, bool on_cpu);
// Every request decoded side by side with one KvDecoder (a slot each): the prompts prefilled in
// one call, then one token per unfinished request per call, each chosen by SampleToken from its
// own logits; a request stops at `eod` (when given), at max_tokens, or when its next token would
// lie past seq_len. on_token(request index, token) is called as each token is chosen. Fails
// naming the request for an empty or too long prompt or an id outside the vocabulary, and
// (CheckGenerationFits) for a batch this machine's memory cannot hold.
std::vector<Generation> Generate(const VerifiedModel& model, std::span<const Request> requests,
                                 const SamplingParams& params, std::optional<uint32_t> eod,
                                 const OpHooks& hooks,
                                 const std::function<void(size_t, uint32_t)>& on_token = {});

// ---- receipts (docs/formats/receipt.md) ------------------------------------------------------
// What a receipt binds besides the requests: the tokenizer ({"kind": "bytes"}, {"kind": "file",
// "name": ..., "blake2b": ...}, or none when the prompts were given as ids), and the end-of-
// document id generation stopped at (none: it ran to max_tokens or seq_len).
struct ReceiptTokenizer {
  std::optional<data::Vocabulary> vocabulary;
  std::optional<uint32_t> eod;
};
// The receipt of `generations` of `requests` under `model`, as its file's text, signed with
// `key` when given.
std::string GenerationReceipt(const VerifiedModel& model, const ReceiptTokenizer& tokenizer,
                              const SamplingParams& params, std::span<const Request> requests,
                              std::span<const Generation> generations,
                              const Ed25519Seed* key = nullptr);
// A receipt re-executed: every check in order, the first failure named.
struct ReceiptVerdict {
  bool match = false;
  std::string detail;  // MATCH: what was re-executed; else the first difference
};
// Parses the receipt at `path` (refusing, naming the field, anything not in the format); checks
// its signature (which must exist and verify under `trusted` when given; one present is checked
// under its own key otherwise); checks that `model` is the receipt's checkpoint, and its
// tokenizer and eod against `data` (the vocabulary of the dataset the checkpoint trained on) when
// given; re-executes every request and compares tokens and the logits chain position by
// position. Without `data`, a MATCH says that the tokenizer and eod were not checked.
ReceiptVerdict VerifyGenerationReceipt(const std::filesystem::path& path,
                                       const VerifiedModel& model, const Ed25519PublicKey* trusted,
                                       const data::Vocabulary* data, const OpHooks& hooks);

// ---- export ---------------------------------------------------------------------------------
// A verified checkpoint written for another runtime, exactly or not at all (docs/export.md):
// kHf a Hugging Face transformers directory (config.json, model.safetensors, ...), kGguf one
// GGUF v3 file for llama.cpp, F32 tensors, kGgufBf16 the same with the matrices of a
// bf16-compute-weight model as BF16 (llama.cpp then rounds its activations to bf16 as well: a
// nearby model, docs/export.md). A model the target cannot express exactly is refused
// naming the feature and the config key. `data` (optional): the dataset the run trained on,
// whose manifest digest must equal the descriptor's; its tokenizer is written when the target
// can express it. The output appears whole or not at all (written beside it, then renamed); it
// must not exist (an empty directory for kHf is fine) nor lie inside an input.
enum class ExportFormat { kHf, kGguf, kGgufBf16 };
struct ExportResult {
  std::string architecture;        // e.g. "LlamaForCausalLM", "llama", "mimo2"
  std::vector<std::string> notes;  // one line each, for the user (the tokenizer, folds made)
};
ExportResult Export(const VerifiedModel& model, ExportFormat format,
                    const std::filesystem::path& out, const std::filesystem::path& data);

// The architecture the format expresses `config` with; fails naming the feature and the config
// key when none does exactly.
std::string ExportArchitecture(const ModelConfig& config, ExportFormat format);
// Rows of a [heads * head_dim, cols] projection reordered from rotate-half RoPE pairs (i, i +
// head_dim/2) to interleaved pairs (2i, 2i + 1), per head: llama.cpp's "llama" architecture
// rotates adjacent elements, so its wq/wk rows are permuted (row h*hd + 2i + j of the result is
// row h*hd + j*hd/2 + i of `w`), as llama.cpp's own converter does.
std::vector<float> PermuteForInterleavedRope(std::span<const float> w, int64_t heads,
                                             int64_t head_dim, int64_t cols);

}  // namespace lockstep::infer
