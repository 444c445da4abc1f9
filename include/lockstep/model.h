// lockstep model: run configs, parameters, initialisation and the forward/backward of a
// Llama-3-style decoder, written as plain orchestration over the kernel library ("rk").
//
// docs/model.md gives the architecture, the canonical parameter order and names, the exact
// initialisation and the order in which kernels are called. Every result is a pure function of
// the inputs (docs/numerics.md): never of the thread count or the SIMD variant.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lockstep/kernels.h"

namespace lockstep {

// ---- configs --------------------------------------------------------------------------------
// How a layer's six linears (wq, wk, wv, wo, w_gate_up, w_down; not the head) compute
// (docs/model.md, "Linears"): in fp32, or as exact int8 GEMMs of per-row quantized activations
// and weights (docs/numerics.md, "Int8").
enum class Linear { kFp32, kInt8 };
std::string_view LinearName(Linear linear);  // "fp32", "int8"
// How a kind of tensor is stored (docs/model.md, "bf16 storage"): as binary32, or rounded to
// bfloat16 (rk::RoundToBf16); the arithmetic is binary32 either way.
enum class Storage { kFp32, kBf16 };
std::string_view StorageName(Storage storage);  // "fp32", "bf16"

// Real-valued fields keep the decimal value read from YAML (so the run descriptor shows "0.02",
// not its binary32 neighbour); they are rounded to binary32 where the arithmetic uses them.
struct ModelConfig {
  int64_t vocab = 0, d_model = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t ffn_hidden = 0, seq_len = 0;
  int64_t window = 0;                // sliding-window width; 0: every layer attends fully
  int64_t full_attention_every = 1;  // k: see LayerWindow
  double rope_theta = 0, norm_eps = 0;
  bool embedding_norm = false;  // RMSNorm (with gain) on the embedding output
  bool qk_norm = false;         // gain-free RMSNorm of every q and k head vector before RoPE
  double z_loss = 0;            // coefficient of lse²
  double init_std = 0.02;
  Linear linear = Linear::kFp32;  // optional in YAML (default fp32)
  // With linear = int8: the backward's GEMMs int8 too, after a Hadamard rotation along the length
  // they sum over (docs/model.md, "Linears"); optional in YAML (default false).
  bool int8_backward = false;
  // The activations and the activation gradients between ops, and the compute copy of the
  // weights that the forward and backward read (docs/model.md, "bf16 storage"); optional in YAML
  // (default fp32).
  Storage activations = Storage::kFp32;
  Storage compute_weights = Storage::kFp32;
};

struct TrainConfig {
  int64_t microbatch = 0;    // sequences per microbatch
  int64_t microbatches = 0;  // microbatches per step (M)
  // K: the microbatches form K groups of M/K consecutive ones; a group's gradient accumulates in
  // place, the group sums are added in group order (docs/training.md). A run of N processes
  // needs N to divide K. Optional in YAML (default 1).
  int64_t grad_groups = 1;
  int64_t steps = 0;  // default total number of steps
  double lr = 0, min_lr = 0;
  int64_t warmup_steps = 0;
  std::string schedule;  // "cosine" | "wsd"
  double wsd_decay_fraction = 0;
  double beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  double clip_norm = 0;         // 0: no clipping
  double spike_threshold = 0;   // grad norm above which the update is skipped
  int64_t spike_max_skips = 0;  // K: halt after K skips ...
  int64_t spike_window = 0;     // ... within this many steps
  int64_t ckpt_every = 0;       // 0: checkpoint only at the end
  uint64_t seed = 0;            // initialisation
  uint64_t data_seed = 0;       // data stream
  int64_t vocab_chunk = 0;      // fused cross-entropy chunk (a positive multiple of 256)
};

struct RunConfig {
  std::string name;
  ModelConfig model;
  TrainConfig train;
};

// `name_or_path`: an embedded config name (EmbeddedConfigNames()) or a path to a .yaml file.
// Every key is required and no other key is allowed. Fails (Error) naming the file or embedded
// config, the field path (e.g. "train.beta2") and the offending value.
RunConfig LoadRunConfig(const std::string& name_or_path);
// The same from YAML text; `source` names it in errors.
RunConfig ParseRunConfig(std::string_view yaml, const std::string& source);
std::vector<std::string> EmbeddedConfigNames();
// The run config a run descriptor (DescriptorJson) was made from: its "name", "model" and
// "train" keys, checked as ParseRunConfig checks a file (JSON is YAML). `source` names the
// descriptor in errors.
RunConfig ConfigOfDescriptor(std::string_view descriptor, const std::string& source);

// The canonical run descriptor: compact JSON with sorted keys holding the resolved config
// ("name", "model", "train"), "contract_version" and "format_versions".
std::string DescriptorJson(const RunConfig& config);

// The attention window of layer l (0-based): 0 (full causal attention) when config.window == 0,
// when (l + 1) % full_attention_every == 0, and on the last layer; config.window otherwise.
int64_t LayerWindow(const ModelConfig& config, int64_t layer);

// ---- parameters -----------------------------------------------------------------------------
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool weight_decay = false;  // AdamW decays it: the linear layers' matrices and output.weight
  bool is_matrix = false;     // 2-D: initialised from the truncated normal (else: ones)
  // An int8 linear's weight scales, one per output channel (docs/model.md, "Linears"): set from
  // its weight at the initialisation and after every update, never trained by AdamW.
  bool is_scale = false;
  int64_t layer = -1;  // the l of layers.l.*; -1 for the tensors outside the layers
  int64_t numel() const;
};

// The canonical order (docs/model.md): tok_embeddings.weight, [emb_norm.weight], per layer l:
// layers.l.{attn_norm, attn.wq, attn.wk, attn.wv, attn.wo, ffn_norm, ffn.w_gate_up,
// ffn.w_down}.weight, then final_norm.weight, output.weight; with model.linear = int8 then per
// layer l: layers.l.{attn.wq, attn.wk, attn.wv, attn.wo, ffn.w_gate_up, ffn.w_down}.scale.
std::vector<ParamSpec> ParameterSpecs(const ModelConfig& config);

// A layer's parameter tensors in ParameterSpecs order, and each one's name within its layer
// ("layers.<l>." + name): the one spelling of them, which ParameterSpecs, the model, the decoder
// and the export use.
enum LayerTensor : size_t { kAttnNorm, kWq, kWk, kWv, kWo, kFfnNorm, kWGateUp, kWDown };
inline constexpr std::array<std::string_view, 8> kLayerTensorNames = {
    "attn_norm.weight", "attn.wq.weight",  "attn.wk.weight",       "attn.wv.weight",
    "attn.wo.weight",   "ffn_norm.weight", "ffn.w_gate_up.weight", "ffn.w_down.weight"};
inline constexpr size_t kTensorsPerLayer = kLayerTensorNames.size();
static_assert(kWDown + 1 == kTensorsPerLayer);
// The six linear weights of a layer, in the order of their scale tensors, and those names.
inline constexpr std::array<LayerTensor, 6> kLayerLinears = {kWq, kWk, kWv, kWo, kWGateUp, kWDown};
inline constexpr std::array<std::string_view, 6> kLayerScaleNames = {
    "attn.wq.scale", "attn.wk.scale",       "attn.wv.scale",
    "attn.wo.scale", "ffn.w_gate_up.scale", "ffn.w_down.scale"};
// A layer's opened tensors: its kTensorsPerLayer in LayerTensor order, then (int8 linears; else
// empty) the scale of each of kLayerLinears at ScaleSlot.
inline constexpr size_t kLayerSlots = kTensorsPerLayer + kLayerLinears.size();
constexpr size_t LinearIndex(LayerTensor which) {  // its position in kLayerLinears
  return which <= kWo ? which - kWq : which - kWGateUp + 4;
}
constexpr size_t ScaleSlot(LayerTensor which) { return kTensorsPerLayer + LinearIndex(which); }
static_assert(kLayerLinears[LinearIndex(kWo)] == kWo &&
              kLayerLinears[LinearIndex(kWDown)] == kWDown);
using LayerTensors = std::array<std::span<const float>, kLayerSlots>;

// Each tensor's index in ParameterSpecs order.
struct ParamIndex {
  size_t tok, emb_norm, first_layer, final_norm, output;
  explicit ParamIndex(const ModelConfig& c)
      : tok(0),
        emb_norm(1),
        first_layer(c.embedding_norm ? 2 : 1),
        final_norm(first_layer + kTensorsPerLayer * static_cast<size_t>(c.n_layers)),
        output(final_norm + 1),
        scales(c.linear == Linear::kInt8 ? output + 1 : 0) {}
  size_t Layer(int64_t l, size_t which) const {  // which: a LayerTensor
    return first_layer + kTensorsPerLayer * static_cast<size_t>(l) + which;
  }
  // The scale tensor of linear `which` of layer l (int8 linears only), and the weight whose
  // scales tensor `scale` (>= scales) holds.
  size_t Scale(int64_t l, LayerTensor which) const {
    return scales + kLayerLinears.size() * static_cast<size_t>(l) + LinearIndex(which);
  }
  size_t WeightOfScale(size_t scale) const {
    const size_t at = scale - scales;
    return Layer(static_cast<int64_t>(at / kLayerLinears.size()),
                 kLayerLinears[at % kLayerLinears.size()]);
  }
  size_t scales;  // the first scale tensor; 0 without int8 linears
};

// The model FLOPs of one training step of `config` (train.microbatches × train.microbatch
// sequences): the standard count, without recomputation -- 6 per matmul parameter per token
// (every 2-D weight but the embedding table, which is a lookup) plus 12·head_dim per visible
// (query, key) pair per head (QKᵀ and PV forward, four products backward). `lockstep model
// describe` prints it; throughput in TFLOP/s is this over the step's seconds.
double ModelFlopsPerStep(const RunConfig& config);

// One contiguous fp32 buffer holding every tensor of `specs`, each starting at a 64-byte
// aligned offset; the padding between tensors is zero. Used for the parameters, the gradients
// and both AdamW moments. Starts zeroed.
class ParamStore {
 public:
  explicit ParamStore(std::vector<ParamSpec> specs);
  // The floats of a store of `specs`, padding included (Flat().size()), without making one.
  static int64_t FlatFloats(const std::vector<ParamSpec>& specs);

  size_t size() const { return specs_.size(); }
  const ParamSpec& Spec(size_t i) const { return specs_.at(i); }
  const std::vector<ParamSpec>& Specs() const { return specs_; }
  std::span<float> Tensor(size_t i);
  std::span<const float> Tensor(size_t i) const;
  // Index of the tensor called `name`; fails naming it when there is none.
  size_t Find(std::string_view name) const;
  // The whole buffer, padding included.
  std::span<float> Flat() { return data_; }
  std::span<const float> Flat() const { return data_; }
  int64_t NumParameters() const;  // sum of the tensors' element counts (no padding)
  void Zero();

 private:
  std::vector<ParamSpec> specs_;
  std::vector<int64_t> offsets_;
  std::vector<float, CacheLineAllocator<float>> data_;
};

// Truncated-normal initialisation of every matrix (std = init_std, bounds ±2 std), ones for
// every norm gain, and each scale tensor's scales of its weight's initial rows (rk::ScalesOfMaxima
// of its rows' maxima), from one Philox4x32-10 stream keyed by PhiloxKeyFromSeed(seed); the exact
// definition is in docs/model.md. Generated tensor by tensor; the bits do not depend on the
// thread count. Returns the number of draws used (the stream's next draw index).
int64_t InitParameters(const ModelConfig& config, uint64_t seed, ParamStore& params);
// The same values in pieces, for streaming (RAM ~ one piece): elements [begin, begin + out.size())
// of tensor `spec`, whose first draw is first_draw (FirstDraws(specs)[i]).
void InitTensorRange(const ModelConfig& config, uint64_t seed, const ParamSpec& spec,
                     int64_t first_draw, int64_t begin, std::span<float> out);
// The init unit (`lockstep replay --from-init`) makes and hashes each tensor in pieces of this
// many floats (16 MiB: 16 hash chunks, enough for every core's hashing lanes).
inline constexpr int64_t kInitPieceFloats = int64_t{1} << 22;
// Fails, naming `what` (the checkpoint), the tensor, the row and both values, unless every scale
// tensor of `params` (int8 linears) holds its weight's scales (rk::ScalesOfMaxima of its rows'
// maxima) bit for bit, as the initialisation and every update leave them (docs/model.md,
// "Linears"). Nothing to check without int8 linears.
void CheckWeightScales(const ModelConfig& config, const ParamStore& params, std::string_view what);
// The first draw of each tensor in `specs`, plus the total number of draws as the last entry.
std::vector<int64_t> FirstDraws(const std::vector<ParamSpec>& specs);
// A matrix of at least this many elements makes the init's erfinv table (rk::InitErfinvTable,
// once per process, kInitTableBytes) and is initialised through it, as is every matrix after it
// in the process; before the table is made, smaller ones run dmath::Erfinv per draw. The bits are
// the same either way.
inline constexpr int64_t kInitTableDraws = int64_t{1} << 22;
inline constexpr uint64_t kInitTableBytes = rk::kInitErfinvTableBytes;
inline bool InitByTable(const ParamSpec& spec) {
  return spec.is_matrix && spec.numel() >= kInitTableDraws;
}
// Every parameter of `config` as InitParameters makes it, tensor by tensor in order, in pieces of
// at most piece_floats elements, handed to piece(i, begin, values). A scale tensor's scales are
// made from its weight's rows' maxima, folded as the weight's pieces pass (every weight precedes
// its scales), where InitTensorRange, given a range alone, draws the weight again: the same bits
// for half the draws. Holds one piece and the maxima: InitInPiecesFloats floats.
void InitInPieces(const ModelConfig& config, uint64_t seed, int64_t piece_floats,
                  const std::function<void(size_t, int64_t, std::span<const float>)>& piece);
int64_t InitInPiecesFloats(const ModelConfig& config, int64_t piece_floats);

// ---- forward / backward -----------------------------------------------------------------------
// How Forward and Backward reach the parameters and the gradients: a tensor at a time (by its
// index in ParameterSpecs order), so that a caller may keep them anywhere -- in RAM, or on disk
// for a model larger than memory. Every Open is matched by a Close of the same tensor before the
// pass returns; at once a pass holds at most one layer's parameters (or one of the embedding,
// final_norm.weight, output.weight) and one gradient open.
class TensorAccess {
 public:
  virtual ~TensorAccess() = default;
  virtual std::span<const float> OpenParam(size_t i) = 0;
  virtual void CloseParam(size_t i) = 0;
  // With accumulate the buffer holds the gradient accumulated so far; without, its contents are
  // unspecified and Backward sets every element.
  virtual std::span<float> OpenGrad(size_t i, bool accumulate) = 0;
  // Tensor i's gradient is complete for this microbatch.
  virtual void CloseGrad(size_t i) = 0;
  // A hint: parameter i is opened soon (storage on disk starts reading it now).
  virtual void WillOpenParam(size_t /*i*/) {}
};

// TensorAccess to ParamStores in RAM (no copies). `grads` may be null for a forward pass.
class StoreAccess final : public TensorAccess {
 public:
  StoreAccess(const ParamStore& params, ParamStore* grads) : params_(params), grads_(grads) {}
  std::span<const float> OpenParam(size_t i) override { return params_.Tensor(i); }
  void CloseParam(size_t) override {}
  std::span<float> OpenGrad(size_t i, bool) override;
  void CloseGrad(size_t) override {}

 private:
  const ParamStore& params_;
  ParamStore* grads_;
};

// ---- operation observer (traces and test faults: docs/disputes.md) ----------------------------
// Told of every kernel call of a step, in execution order. Begin is called before the op runs
// (so inputs an op overwrites in place are seen as they were); End after, with the outputs, which
// the observer may change (the test-only fault). Context says which step and microbatch the next
// ops belong to (microbatch -1: the optimizer's part of the step).
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void Context(uint64_t step, int64_t microbatch) = 0;
  virtual void Begin(std::string_view op, int64_t layer, std::span<const OpArg> args,
                     std::span<const OpTensor> inputs) = 0;
  virtual void End(std::span<const OpOutput> outputs) = 0;
};

// What is installed around every op call: an observer (traces, test faults) and an executor.
struct OpHooks {
  OpObserver* observer = nullptr;
  OpExecutor* executor = nullptr;
};

// Fails (an internal error) unless a call of `op` records the arguments and roles its op-table
// entry lists (rk::OpSpec): every argument, optional ones or not; the roles in order, with their
// dtypes, an optional one left out or not.
void CheckOpCall(const rk::OpSpec& op, std::span<const OpArg> args,
                 std::span<const OpTensor> inputs, std::span<const OpOutput> outputs);

// Runs op `op`: on the executor when one is installed and runs it, else `kernel` (its CPU
// kernel); between observer->Begin and ->End when an observer is installed, the call checked
// against the op table whenever a hook is. The model, the decoder and the trainer call ops through
// the typed functions of lockstep/op_calls.h, which make the record from the op table.
template <typename Kernel>
void ObservedOp(const OpHooks& hooks, rk::Op op, int64_t layer, std::span<const OpArg> args,
                std::span<const OpTensor> in, std::span<const OpOutput> out, Kernel&& kernel) {
  if (hooks.observer == nullptr && hooks.executor == nullptr) {
    kernel();
    return;
  }
  const rk::OpSpec& spec = rk::Spec(op);
  CheckOpCall(spec, args, in, out);
  OpExecutor* const executor = hooks.executor;
  // The host reads the inputs (an observer, or the CPU kernel) and writes the outputs (the CPU
  // kernel, or the test fault in the observer's End).
  const auto inputs_to_host = [&] {
    for (const OpTensor& t : in) executor->ToHost(t.view);
  };
  const auto host_writes_outputs = [&] {
    for (const OpOutput& o : out) executor->HostWrites(o.view);
  };
  if (hooks.observer != nullptr) {
    if (executor != nullptr) inputs_to_host();
    hooks.observer->Begin(spec.name, layer, args, in);
  }
  if (executor == nullptr) {
    kernel();
  } else if (!executor->Run(op, args, in, out)) {
    inputs_to_host();
    host_writes_outputs();
    kernel();
  }
  if (hooks.observer != nullptr) {
    if (executor != nullptr) {
      for (const OpOutput& o : out) executor->ToHost(o.view);
      host_writes_outputs();
    }
    hooks.observer->End(out);
  }
}

// ---- one layer's forward: the model's own, run by training and by the KV-cache decoder ---------
// What RoPE and attention see of the rows: the training batch's own sequences (Model), or each
// row's sequence in a KV cache (infer::KvDecoder). Attend rotates q and k in place at the rows'
// positions and writes attn, each row's attention over the keys it sees, its ops called with
// `hooks` under `layer`.
class AttentionContext {
 public:
  virtual ~AttentionContext() = default;
  virtual void Attend(const OpHooks& hooks, int64_t layer, std::span<float> q, std::span<float> k,
                      std::span<const float> v, std::span<float> attn) = 0;
};
// The scratch of the int8 linears (model.linear = int8, docs/model.md "Linears") over up to
// `rows` rows: an input's int8 rows and scales, a weight's int8 rows, and for the backward the
// dequantized operands it reads in place of the input and the weight (or the int8 backward's
// buffers).
struct Int8Scratch {
  std::vector<int8_t> qx, qw;
  std::vector<float> sx, x_hat, w_hat;
  // With model.int8_backward, in place of x_hat and w_hat: the backward GEMM's operands rotated
  // and quantized (qa, qb), their scales (sa, sb), and a product to add.
  std::vector<float> sa, sb, sum;
  std::vector<int8_t> qa, qb;
  // Sized for `rows` rows of every linear of `config`; the backward's buffers only with
  // `backward`.
  void Resize(const ModelConfig& config, int64_t rows, bool backward);
  // Their bytes, and those of the int8 GEMMs' packed operands (the kernels' own scratch, kept by
  // the thread at its largest, under the active variant): what a memory plan counts.
  static int64_t Bytes(const ModelConfig& config, int64_t rows, bool backward);
};
// The buffers of one layer's forward over its rows. x_out may be x_in's memory (x_in is not read
// once x_mid is made), and h2 h's; the rstd buffers are outputs only.
// A layer's six fp32 linear weights packed for few rows (rk::PackForGemv), in kLayerLinears
// order.
using LayerPackings = std::array<rk::GemvPacking, kLayerLinears.size()>;
// An int8 linear's weight quantized by its scales (ops::QuantizeRowsByScale) and packed for the
// int8 GEMM (rk::PackI8ForGemm, which reads q in place), and a layer's six, in kLayerLinears
// order.
struct QuantizedLinear {
  std::vector<int8_t> q;
  rk::I8Packing packed;
};
using LayerInt8Weights = std::array<QuantizedLinear, kLayerLinears.size()>;
struct LayerBuffers {
  std::span<const float> x_in;
  std::span<float> h, attn_rstd, q_raw, k_raw, q_rstd, k_rstd, q, k, v, attn, x_mid, h2, ffn_rstd,
      gu, act, x_out;
  Int8Scratch* int8 = nullptr;  // with model.linear = int8, sized for the rows (Resize)
  // With model.linear = fp32 and at most rk::kGemvMaxRows rows, the linears' weights packed: the
  // linears run rk::GemmXWtPacked on them (the same bits, read as one stream).
  const LayerPackings* packed = nullptr;
  // With model.linear = int8, the linears' weights quantized by their scales once, for every
  // forward of the same parameters (a decoder's); without it each linear quantizes its weight
  // into int8->qw.
  const LayerInt8Weights* quantized = nullptr;
};
// Layer `layer`'s forward over `rows` rows (docs/model.md) with its parameters w
// (LayerTensors' slots): every activation its backward reads, and with
// `output` the layer's output x_out (without it the forward stops after the SwiGLU: what a
// backward recomputes).
void LayerForward(const OpHooks& hooks, const ModelConfig& config, int64_t layer, int64_t rows,
                  std::span<const std::span<const float>> w, const LayerBuffers& b,
                  AttentionContext& attention, bool output = true);

// With model.activations = bf16, x (written by an op of layer `layer`) rounded in place to
// bf16 (ops::RoundToBf16); else untouched. docs/model.md, "bf16 storage".
void StoreActivation(const OpHooks& hooks, const ModelConfig& config, int64_t layer,
                     std::span<float> x);
// The embedding's output x, the rows it looked up: rounded to bf16 with bf16 activations or bf16
// compute weights (rows of the bf16 compute copy of the table: the table rounded).
void StoreEmbedding(const OpHooks& hooks, const ModelConfig& config, std::span<float> x);

struct LossSums {
  float loss = 0;   // Σ over rows of the cross-entropy (rk::RowSum lane rule, fp32)
  float zloss = 0;  // Σ over rows of z_loss · lse²
  Digest backward{};  // ForwardBackward: its Backward's digest; zero after a Forward alone
};

// Logits kept from the forward for the backward when rows x vocab is at most this many floats
// (64 MiB); larger heads compute them again in the backward. Either way the bits are the same.
inline constexpr int64_t kKeptLogitsFloats = int64_t{1} << 24;
// Whether a Model of `rows` rows keeps its logits (and so holds rows x vocab floats for them).
inline bool KeepsLogits(int64_t rows, int64_t vocab) { return rows * vocab <= kKeptLogitsFloats; }

// The activations of one (batch, seq) shape, planned once in a single arena, and the kernels'
// orchestration. tokens is [batch, seq + 1] row-major: row b's inputs are its first seq ids,
// its targets the last seq. seq may be shorter than config.seq_len (never longer).
class Model : private AttentionContext {
 public:
  // Whether the forward keeps every layer's activations for the backward, or only each layer's
  // input, the backward computing the layer's forward again (less memory, one more forward of
  // the layers' compute; the same bits: docs/training.md, "Memory").
  enum class Activations { kKept, kRecomputed };
  Model(const ModelConfig& config, int64_t vocab_chunk, int64_t batch, int64_t seq,
        Activations activations = Activations::kKept);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  int64_t batch() const { return batch_; }
  int64_t seq() const { return seq_; }

  // The bytes a Model of this shape allocates (activation arena, RoPE table, token buffers),
  // for memory planning. Allocates none of them.
  static int64_t AllocatedBytes(const ModelConfig& config, int64_t vocab_chunk, int64_t batch,
                                int64_t seq, Activations activations = Activations::kKept);

  // Runs the forward pass and keeps the activations for Backward.
  LossSums Forward(TensorAccess& access, std::span<const uint32_t> tokens);
  // Gradient of grad_scale · Σ_rows (loss + zloss) for the tokens of the last Forward (the same
  // params). accumulate = false overwrites every gradient tensor; accumulate = true adds this
  // microbatch's gradient to it as docs/model.md defines ("Gradient accumulation"). Returns the
  // backward digest (docs/training.md, "The backward digest"): BLAKE2b-256 of the gradient with
  // respect to each layer's input [rows, d_model], last layer first, each binary32
  // little-endian: what only a backward through every layer computes, and no checkpoint holds.
  Digest Backward(TensorAccess& access, float grad_scale, bool accumulate);
  LossSums ForwardBackward(TensorAccess& access, std::span<const uint32_t> tokens, float grad_scale,
                           bool accumulate);
  // The same on ParamStores in RAM (their tensors must be the model's, by name and shape).
  LossSums Forward(const ParamStore& params, std::span<const uint32_t> tokens);
  LossSums ForwardBackward(const ParamStore& params, std::span<const uint32_t> tokens,
                           float grad_scale, bool accumulate, ParamStore& grads);

  // After Forward: per-row results [batch * seq] and the logits [batch * seq, vocab]
  // (one GemmXWt of the final hidden state with output.weight, or with bf16 compute weights its
  // compute copy: the logits the loss used).
  std::span<const float> RowLoss() const;
  std::span<const float> RowZLoss() const;
  void Logits(const ParamStore& params, std::span<float> logits) const;

  // Every kernel call of Forward and Backward is reported to `hooks.observer` (null: none), but
  // those of how activations are kept (recomputation, bf16 saving), with layer -1 for the
  // embedding and the head, and run by `hooks.executor` where it runs it, which
  // may keep the activations (OpExecutor::Keep) until another executor is set or the Model ends.
  void set_hooks(const OpHooks& hooks);

 private:
  struct PlanOnly {};
  // Plans the arena (every Span, arena_floats_) without allocating it.
  Model(const ModelConfig& config, int64_t vocab_chunk, int64_t batch, int64_t seq,
        Activations activations, PlanOnly);

  struct Span {
    int64_t offset = 0, size = 0;
  };
  struct LayerActivations {
    Span x_in, attn_rstd, h, q_raw, q_rstd, k_raw, k_rstd, q, k, v, attn, attn_lse;
    Span x_mid, ffn_rstd, h2, gu, act;
  };
  // The activations a layer's backward reads but its input and the statistics (rstd, lse): with
  // bf16 activations kept (Bf16Saved) each layer but the last keeps these in bf16_.
  static constexpr Span LayerActivations::*kBf16Saved[] = {
      &LayerActivations::h,    &LayerActivations::q_raw, &LayerActivations::k_raw,
      &LayerActivations::q,    &LayerActivations::k,     &LayerActivations::v,
      &LayerActivations::attn, &LayerActivations::x_mid, &LayerActivations::h2,
      &LayerActivations::gu,   &LayerActivations::act};
  using Bf16Spans = std::array<Span, std::size(kBf16Saved)>;
  // Whether the layers share one binary32 set of those activations and keep them as bf16
  // between their forward and backward: kept activations of a model that stores activations
  // as bf16 (docs/model.md, "bf16 storage"), of more than one layer.
  bool Bf16Saved() const;
  void PlanBf16();  // bf16_spans_ and bf16_elements_ for every layer but the last
  std::span<BFloat16> B(Span s) { return {bf16_.data() + s.offset, static_cast<size_t>(s.size)}; }
  // Layer l's activations (the shared set) into its bf16 spans, or back; neither is reported to
  // an observer (like recomputation, how the activations are kept is not part of the run).
  void SaveBf16(int64_t l);
  void RestoreBf16(int64_t l);
  std::span<float> A(Span s) { return {arena_.data() + s.offset, static_cast<size_t>(s.size)}; }
  std::span<const float> A(Span s) const {
    return {arena_.data() + s.offset, static_cast<size_t>(s.size)};
  }
  // A(s) for the host to read: the executor's newer bytes copied back first.
  std::span<const float> OnHost(Span s) const;
  void CheckParams(const ParamStore& params, const char* what) const;
  // Opens parameter i, checking its size against the model's: what the forward and backward
  // read of it, its compute copy with model.compute_weights = bf16 (ComputeCopy).
  std::span<const float> Param(TensorAccess& access, size_t i);
  // With model.compute_weights = bf16, where parameter i's compute copy is made when it is
  // opened (a copy rounded to bf16); empty for the embedding table (StoreEmbedding rounds the
  // rows looked up: the same values), the int8 scales, and without bf16 compute weights.
  Span ComputeCopy(size_t i) const;
  // access.WillOpenParam for every tensor of `layer`.
  void WillOpenLayer(TensorAccess& access, int64_t layer) const;
  // Layer `layer`'s parameters opened into w (the scales' slots empty without int8 linears),
  // and closed.
  void OpenLayer(TensorAccess& access, int64_t layer, LayerTensors& w);
  void CloseLayer(TensorAccess& access, int64_t layer) const;
  std::span<float> Grad(TensorAccess& access, size_t i, bool accumulate) const;
  // Layer l's forward (LayerForward) from its input with parameters w into its activations, and
  // with `output` the layer's output (the next layer's input, or x_final_).
  void ForwardLayer(const OpHooks& hooks, int64_t l, std::span<const std::span<const float>> w,
                    bool output);
  // AttentionContext: RoPE over the batch's sequences from position 0, and causal attention.
  void Attend(const OpHooks& hooks, int64_t layer, std::span<float> q, std::span<float> k,
              std::span<const float> v, std::span<float> attn) override;
  // Layer l's backward from its activations with parameters w: on entry dx_ holds the gradient
  // of the layer's output, on exit that of its input; the layer's parameter gradients are
  // written through `access` (stored, or with accumulate added to the accumulated ones).
  void BackwardLayer(TensorAccess& access, int64_t l, std::span<const std::span<const float>> w,
                     bool accumulate);
  // The input gradient dx[rows, in] = dy[rows, out] · W of the linear with weight w[out, in]
  // (docs/model.md, "Linears"; the straight-through backward's Ŵ from w and its scales w_scale),
  // stored or with `add` added to dx.
  void InputGrad(int64_t layer, std::span<const float> dy, std::span<const float> w,
                 std::span<const float> w_scale, std::span<float> dx, int64_t out, int64_t in,
                 bool add);
  // Gradient i = dyᵀ · x [out, in] of a linear (x: the input, or the straight-through backward's
  // operand in its place), stored or added to the accumulated one.
  void WeightGrad(TensorAccess& access, int64_t layer, size_t i, std::span<const float> dy,
                  std::span<const float> x, int64_t out, int64_t in, bool accumulate);
  // Whether the backward multiplies by dequantized operands (model.linear = int8 without
  // model.int8_backward).
  bool SteOperands() const { return config_.linear == Linear::kInt8 && !config_.int8_backward; }
  // Whether the linears' backward GEMMs are int8 (model.linear = int8 and model.int8_backward).
  bool RotatedInt8Backward() const {
    return config_.linear == Linear::kInt8 && config_.int8_backward;
  }
  // The straight-through backward's operand in place of an input x[rows_, cols]: the values its
  // quantized rows stand for (QuantizeRows, then DequantizeRows into the scratch's x_hat).
  std::span<const float> DequantizedInput(int64_t layer, std::span<const float> x, int64_t cols);
  // The int8 backward's GEMM: y[m, n] = A · Bᵀ (with `add`, added to y) for A[m, k] given as a
  // (a[k, m] when a_transposed) and B[n, k] as b likewise: both rotated along k and their rows
  // quantized (HadamardQuantizeRows), the exact int8 GEMM.
  void RotatedInt8Gemm(int64_t layer, std::span<const float> a, bool a_transposed,
                       std::span<const float> b, bool b_transposed, std::span<float> y, int64_t m,
                       int64_t n, int64_t k, bool add);
  // Gradient i of a norm gain from dgain_ (RmsNormBackward overwrites it there): copied, or
  // added to the accumulated one.
  void GainGrad(TensorAccess& access, int64_t layer, size_t i, bool accumulate);
  // Gradient i opened for a kernel that accumulates into it (the embedding's and the output
  // head's): zeroed first unless accumulate.
  std::span<float> ScatterGrad(TensorAccess& access, size_t i, bool accumulate);
  rk::AttentionShape AttentionShape(int64_t layer) const;
  rk::CrossEntropyShape CrossEntropyShape() const;
  OpHooks hooks_;

  ModelConfig config_;
  Activations activations_;
  int64_t vocab_chunk_, batch_, seq_, rows_;
  std::vector<ParamSpec> specs_;
  rk::RopeTable rope_;
  std::vector<LayerActivations> layers_;
  Span emb_, emb_rstd_, x_final_, final_rstd_, xf_, loss_, zloss_, lse_, logits_;
  // Backward scratch.
  Span dx_, dh_, dq_, dk_, dv_, dattn_, dgu_, dact_, dgain_;
  // The compute copies (ComputeCopy): one per layer tensor kind, shared by the layers.
  std::array<Span, kTensorsPerLayer> compute_layer_{};
  Span compute_emb_norm_, compute_final_norm_, compute_output_;
  int64_t arena_floats_ = 0;
  std::vector<float> arena_;
  std::vector<Bf16Spans> bf16_spans_;  // per layer (Bf16Saved)
  int64_t bf16_elements_ = 0;
  std::vector<BFloat16> bf16_;
  std::vector<uint32_t> inputs_, targets_;
  Int8Scratch int8_;  // model.linear = int8 only
  bool have_forward_ = false;
  bool logits_kept_ = false;  // logits_ holds the last Forward's logits (a Backward consumes them)
};

}  // namespace lockstep
