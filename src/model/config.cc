// Run configs: YAML (configs/*.yaml, also embedded in the binary) -> RunConfig, validated, and
// the canonical run descriptor.
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <cctype>
#include <set>
#include <string>
#include <vector>

#include "lockstep/build_info.h"
#include "lockstep/core.h"
#include "lockstep/embedded_configs.h"
#include "lockstep/json.h"
#include "lockstep/kernels.h"
#include "lockstep/model.h"

namespace lockstep {
namespace {

// Whether `text` is printable ASCII, shown in a message as it is.
bool Printable(const std::string& text) {
  return std::ranges::all_of(text,
                             [](char c) { return std::isprint(static_cast<unsigned char>(c)); });
}

// Reads the keys of one YAML map, each exactly once; Finish() rejects any key not read.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string source, std::string path)
      : node_(node), source_(std::move(source)), path_(std::move(path)) {
    if (!node_.IsMap()) {
      Fail("{}: {} must be a map of keys to values, got {}", source_,
           path_.empty() ? "the document" : path_, Describe(node_));
    }
    // yaml-cpp keeps the first of two equal keys: a config must mean one thing to every reader.
    std::set<std::string> keys;
    for (const auto& entry : node_) {
      if (!entry.first.IsScalar()) Fail("{}: a key of {} is not a scalar", source_, Where());
      const std::string key = entry.first.Scalar();
      if (!keys.insert(key).second) Fail("{}: duplicate key {}", source_, FieldPath(key));
    }
  }
  std::string Where() const { return path_.empty() ? "the document" : path_; }

  const std::string& source() const { return source_; }
  std::string FieldPath(const std::string& key) const {
    return path_.empty() ? key : path_ + "." + key;
  }

  bool Has(const std::string& key) const { return static_cast<bool>(node_[key]); }
  YAML::Node Get(const std::string& key) {
    const YAML::Node value = node_[key];
    if (!value) Fail("{}: missing required key {}", source_, FieldPath(key));
    read_.insert(key);
    return value;
  }

  template <typename T>
  T Scalar(const std::string& key, const char* type_name) {
    const YAML::Node value = Get(key);
    T result{};
    if (!value.IsScalar() || !YAML::convert<T>::decode(value, result)) {
      Fail("{}: {} = {} is not {}", source_, FieldPath(key), Describe(value), type_name);
    }
    return result;
  }
  int64_t Int(const std::string& key) {
    return Scalar<int64_t>(key, "an integer");  // "2.5", "1e3" and "two" are all rejected
  }
  uint64_t Uint(const std::string& key) {
    const YAML::Node value = Get(key);
    uint64_t result = 0;
    if (!value.IsScalar() || value.Scalar().starts_with('-') ||
        !YAML::convert<uint64_t>::decode(value, result)) {
      Fail("{}: {} = {} is not an unsigned 64-bit integer", source_, FieldPath(key),
           Describe(value));
    }
    return result;
  }
  double Real(const std::string& key) {
    const double v = Scalar<double>(key, "a number");
    if (!std::isfinite(v)) Fail("{}: {} = {} is not finite", source_, FieldPath(key), v);
    return v;
  }
  // Exactly `true` or `false`, unquoted (not YAML 1.1's yes, on, True, nor the string "true").
  bool Bool(const std::string& key) {
    const YAML::Node value = Get(key);
    if (value.IsScalar() && value.Tag() != "!") {
      if (value.Scalar() == "true") return true;
      if (value.Scalar() == "false") return false;
    }
    Fail("{}: {} = {} is not a boolean (true or false)", source_, FieldPath(key), Describe(value));
  }
  std::string String(const std::string& key) { return Scalar<std::string>(key, "a string"); }

  void Finish() const {
    for (const auto& entry : node_) {
      const std::string key = entry.first.as<std::string>();
      if (read_.count(key)) continue;
      std::string shown = key.substr(0, 64);  // printable ASCII only, as the name is shown
      for (char& c : shown) c = std::isprint(static_cast<unsigned char>(c)) ? c : '?';
      Fail("{}: unknown key {}", source_, FieldPath(shown));
    }
  }

  static std::string Describe(const YAML::Node& node) {
    if (node.IsScalar()) {
      return Printable(node.Scalar()) ? "'" + node.Scalar() + "'" : ShownJson(node.Scalar());
    }
    if (node.IsMap()) return "a map";
    if (node.IsSequence()) return "a list";
    return "null";
  }

 private:
  YAML::Node node_;
  std::string source_, path_;
  std::set<std::string> read_;
};

// Fails unless ok, naming the field, its value and the rule it breaks.
template <typename T>
void Require(bool ok, const MapReader& r, const char* key, const T& value, const char* rule) {
  if (!ok) Fail("{}: {} = {} is invalid: {}", r.source(), r.FieldPath(key), value, rule);
}
// A string value is shown as it is when printable, else as a JSON string, its control
// characters escaped (a NUL or an escape sequence from a file must neither cut the message
// short nor reach the terminal).
void Require(bool ok, const MapReader& r, const char* key, const std::string& value,
             const char* rule) {
  Require<std::string>(ok, r, key, Printable(value) ? value : ShownJson(value), rule);
}

ModelConfig ReadModel(MapReader r) {
  ModelConfig m;
  m.vocab = r.Int("vocab");
  m.d_model = r.Int("d_model");
  m.n_layers = r.Int("n_layers");
  m.n_heads = r.Int("n_heads");
  m.n_kv_heads = r.Int("n_kv_heads");
  m.head_dim = r.Int("head_dim");
  m.ffn_hidden = r.Int("ffn_hidden");
  m.seq_len = r.Int("seq_len");
  m.window = r.Int("window");
  m.full_attention_every = r.Int("full_attention_every");
  m.rope_theta = r.Real("rope_theta");
  m.norm_eps = r.Real("norm_eps");
  m.embedding_norm = r.Bool("embedding_norm");
  m.qk_norm = r.Bool("qk_norm");
  m.z_loss = r.Real("z_loss");
  m.init_std = r.Real("init_std");
  if (r.Has("linear")) {
    const std::string linear = r.String("linear");
    if (linear == LinearName(Linear::kInt8)) {
      m.linear = Linear::kInt8;
    } else {
      Require(linear == LinearName(Linear::kFp32), r, "linear", linear, "must be fp32 or int8");
    }
  }
  if (r.Has("int8_backward")) m.int8_backward = r.Bool("int8_backward");
  for (const auto& [key, storage] : {std::pair{"activations", &m.activations},
                                     std::pair{"compute_weights", &m.compute_weights}}) {
    if (!r.Has(key)) continue;
    const std::string name = r.String(key);
    if (name == StorageName(Storage::kBf16)) {
      *storage = Storage::kBf16;
    } else {
      Require(name == StorageName(Storage::kFp32), r, key, name, "must be fp32 or bf16");
    }
  }
  r.Finish();

  // Token ids are uint32 and the byte tokenizer needs 256 byte ids plus end-of-document.
  Require(m.vocab >= 257 && m.vocab <= (int64_t{1} << 31), r, "vocab", m.vocab,
          "must be in [257, 2^31] (the byte tokenizer needs 257 ids)");
  // Upper bounds keep every size product of the model and its activations inside int64 (so
  // that a hostile config is refused by name, never overflows an allocation).
  Require(m.d_model >= 1 && m.d_model <= (1 << 16), r, "d_model", m.d_model, "must be in [1, 2^16]");
  Require(m.n_layers >= 1 && m.n_layers <= (1 << 12), r, "n_layers", m.n_layers,
          "must be in [1, 2^12]");
  Require(m.n_heads >= 1 && m.n_heads <= (1 << 12), r, "n_heads", m.n_heads, "must be in [1, 2^12]");
  Require(m.n_kv_heads >= 1, r, "n_kv_heads", m.n_kv_heads, "must be >= 1");
  if (m.n_heads % m.n_kv_heads != 0) {
    Fail("{}: model.n_heads = {} is invalid: must be a multiple of model.n_kv_heads = {}",
         r.source(), m.n_heads, m.n_kv_heads);
  }
  Require(m.head_dim >= 2 && m.head_dim % 2 == 0 && m.head_dim <= (1 << 12), r, "head_dim",
          m.head_dim, "must be even and in [2, 2^12] (RoPE rotates pairs)");
  Require(m.ffn_hidden >= 1 && m.ffn_hidden <= (1 << 20), r, "ffn_hidden", m.ffn_hidden,
          "must be in [1, 2^20]");
  Require(m.seq_len >= 1 && m.seq_len <= (1 << 20), r, "seq_len", m.seq_len, "must be in [1, 2^20]");
  Require(m.window >= 0, r, "window", m.window, "must be >= 0 (0: no sliding window)");
  Require(m.full_attention_every >= 1, r, "full_attention_every", m.full_attention_every,
          "must be >= 1");
  Require(m.rope_theta > 1, r, "rope_theta", m.rope_theta, "must be > 1");
  Require(m.norm_eps > 0, r, "norm_eps", m.norm_eps, "must be > 0");
  Require(m.z_loss >= 0, r, "z_loss", m.z_loss, "must be >= 0");
  Require(m.init_std > 0, r, "init_std", m.init_std, "must be > 0");
  if (m.linear == Linear::kInt8) {
    // Every int8 linear's int32 sums must be exact: K, the length they sum over, is the input
    // width of wq/wk/wv/w_gate_up (d_model), of wo (n_heads · head_dim) and of w_down.
    const auto exact = [&](const char* key, int64_t k) {
      Require(k <= rk::kInt8MaxK, r, key, k,
              "must be at most 133144 with model.linear = int8 (an input width of an int8 linear: "
              "k · 127² must stay below 2^31)");
    };
    exact("d_model", m.d_model);
    exact("ffn_hidden", m.ffn_hidden);
    // The int8 backward's input-gradient GEMMs sum over each linear's output width: 2 ·
    // ffn_hidden for w_gate_up (the others are d_model and the heads' widths, checked here too).
    if (m.int8_backward && 2 * m.ffn_hidden > rk::kInt8MaxK) {
      Fail(
          "{}: model.ffn_hidden = {} is invalid: 2 · model.ffn_hidden must be at most {} with "
          "model.int8_backward = true (the output width of w_gate_up, which the backward sums "
          "over)",
          r.source(), m.ffn_hidden, rk::kInt8MaxK);
    }
    if (m.n_heads * m.head_dim > rk::kInt8MaxK) {
      Fail(
          "{}: model.n_heads · model.head_dim = {} is invalid: must be at most {} with "
          "model.linear = int8 (the input width of wo)",
          r.source(), m.n_heads * m.head_dim, rk::kInt8MaxK);
    }
  } else if (m.int8_backward) {
    Fail("{}: model.int8_backward = true is invalid: only with model.linear = int8", r.source());
  }
  return m;
}

TrainConfig ReadTrain(MapReader r) {
  TrainConfig t;
  t.microbatch = r.Int("microbatch");
  t.microbatches = r.Int("microbatches");
  t.grad_groups = r.Has("grad_groups") ? r.Int("grad_groups") : 1;
  t.steps = r.Int("steps");
  t.lr = r.Real("lr");
  t.min_lr = r.Real("min_lr");
  t.warmup_steps = r.Int("warmup_steps");
  t.schedule = r.String("schedule");
  t.wsd_decay_fraction = r.Real("wsd_decay_fraction");
  t.beta1 = r.Real("beta1");
  t.beta2 = r.Real("beta2");
  t.eps = r.Real("eps");
  t.weight_decay = r.Real("weight_decay");
  t.clip_norm = r.Real("clip_norm");
  t.spike_threshold = r.Real("spike_threshold");
  t.spike_max_skips = r.Int("spike_max_skips");
  t.spike_window = r.Int("spike_window");
  t.ckpt_every = r.Int("ckpt_every");
  t.seed = r.Uint("seed");
  t.data_seed = r.Uint("data_seed");
  t.vocab_chunk = r.Int("vocab_chunk");
  r.Finish();

  Require(t.microbatch >= 1 && t.microbatch <= (1 << 16), r, "microbatch", t.microbatch,
          "must be in [1, 2^16]");
  Require(t.microbatches >= 1 && t.microbatches <= (1 << 20), r, "microbatches", t.microbatches,
          "must be in [1, 2^20]");
  Require(t.grad_groups >= 1 && t.microbatches % t.grad_groups == 0, r, "grad_groups",
          t.grad_groups, fmt::format("must be >= 1 and divide train.microbatches = {}",
                                     t.microbatches).c_str());
  Require(t.steps >= 1 && t.steps <= (int64_t{1} << 40), r, "steps", t.steps, "must be in [1, 2^40]");
  Require(t.lr > 0 && t.lr <= 1, r, "lr", t.lr, "must be in (0, 1]");
  Require(t.min_lr >= 0 && t.min_lr <= t.lr, r, "min_lr", t.min_lr, "must be in [0, train.lr]");
  Require(t.warmup_steps >= 0, r, "warmup_steps", t.warmup_steps, "must be >= 0");
  Require(t.schedule == "cosine" || t.schedule == "wsd", r, "schedule", t.schedule,
          "must be 'cosine' or 'wsd'");
  Require(t.wsd_decay_fraction > 0 && t.wsd_decay_fraction <= 1, r, "wsd_decay_fraction",
          t.wsd_decay_fraction, "must be in (0, 1]");
  Require(t.beta1 >= 0 && t.beta1 < 1, r, "beta1", t.beta1, "must be in [0, 1)");
  Require(t.beta2 >= 0 && t.beta2 < 1, r, "beta2", t.beta2, "must be in [0, 1)");
  Require(t.eps > 0, r, "eps", t.eps, "must be > 0");
  Require(t.weight_decay >= 0 && t.weight_decay < 1, r, "weight_decay", t.weight_decay,
          "must be in [0, 1)");
  Require(t.clip_norm >= 0, r, "clip_norm", t.clip_norm, "must be >= 0 (0: no clipping)");
  Require(t.spike_threshold > 0, r, "spike_threshold", t.spike_threshold, "must be > 0");
  // The protocol halts after spike_max_skips skips within spike_window steps: it must be
  // possible to reach, or a diverged run would skip forever.
  Require(t.spike_window >= 1, r, "spike_window", t.spike_window, "must be >= 1");
  Require(t.spike_max_skips >= 1 && t.spike_max_skips <= t.spike_window, r, "spike_max_skips",
          t.spike_max_skips,
          "must be in [1, train.spike_window] (otherwise the run can never halt)");
  Require(t.ckpt_every >= 0, r, "ckpt_every", t.ckpt_every, "must be >= 0 (0: only at the end)");
  Require(t.vocab_chunk >= 256 && t.vocab_chunk % 256 == 0 && t.vocab_chunk <= (1 << 20), r,
          "vocab_chunk", t.vocab_chunk, "must be a positive multiple of 256, at most 2^20");
  return t;
}

}  // namespace

RunConfig ParseRunConfig(std::string_view yaml, const std::string& source) {
  // yaml-cpp parses recursively: bound the text and its flow nesting before it sees it.
  constexpr size_t kMaxYamlBytes = size_t{1} << 20;
  constexpr int kMaxFlowDepth = 16;
  if (yaml.size() > kMaxYamlBytes) Fail("{}: {} bytes (a config is at most 1 MiB)", source, yaml.size());
  if (yaml.find('\0') != std::string_view::npos) Fail("{}: holds a NUL byte", source);
  int depth = 0;
  for (const char c : yaml) {
    if (c == '[' || c == '{') {
      if (++depth > kMaxFlowDepth) Fail("{}: nested deeper than {} levels", source, kMaxFlowDepth);
    } else if (c == ']' || c == '}') {
      --depth;
    } else if (c == '\n') {
      depth = 0;  // flow collections in configs are one line; a new line starts over
    }
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    Fail("{}: not valid YAML: {}", source, e.what());
  }
  MapReader top(root, source, "");
  RunConfig config;
  config.name = top.String("name");
  // The name goes into the run descriptor (JSON) and into messages: a safe, short word.
  const bool word = !config.name.empty() && config.name.size() <= 64 &&
                    std::all_of(config.name.begin(), config.name.end(), [](char c) {
                      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ||
                             c == '.';
                    });
  if (!word) {
    std::string shown = config.name.substr(0, 64);  // printable ASCII only: it may reach JSON
    for (char& c : shown) c = std::isprint(static_cast<unsigned char>(c)) ? c : '?';
    Fail("{}: name = '{}' is invalid: must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_', '-'",
         source, shown);
  }
  config.model = ReadModel(MapReader(top.Get("model"), source, "model"));
  config.train = ReadTrain(MapReader(top.Get("train"), source, "train"));
  top.Finish();
  if (config.train.microbatch * config.model.seq_len > (int64_t{1} << 24)) {
    Fail("{}: train.microbatch = {} times model.seq_len = {} is {} tokens per microbatch (at most "
         "2^24)",
         source, config.train.microbatch, config.model.seq_len,
         config.train.microbatch * config.model.seq_len);
  }
  // The int8 backward's weight-gradient GEMMs sum over a microbatch's tokens.
  if (config.model.int8_backward &&
      config.train.microbatch * config.model.seq_len > rk::kInt8MaxK) {
    Fail(
        "{}: train.microbatch = {} times model.seq_len = {} is {} tokens per microbatch (at most "
        "{} with model.int8_backward = true: the weight gradients' int8 GEMMs sum over them)",
        source, config.train.microbatch, config.model.seq_len,
        config.train.microbatch * config.model.seq_len, rk::kInt8MaxK);
  }
  return config;
}

std::vector<std::string> EmbeddedConfigNames() {
  std::vector<std::string> names;
  for (const auto& [name, text] : embedded::kConfigs) names.emplace_back(name);
  return names;
}

RunConfig LoadRunConfig(const std::string& name_or_path) {
  for (const auto& [name, text] : embedded::kConfigs) {
    if (name == name_or_path) return ParseRunConfig(text, "embedded config '" + name_or_path + "'");
  }
  const std::filesystem::path path(name_or_path);
  if (path.extension() != ".yaml" && path.extension() != ".yml") {
    std::string known;
    for (const std::string& name : EmbeddedConfigNames()) known += (known.empty() ? "" : ", ") + name;
    Fail("config '{}' is neither an embedded config ({}) nor a .yaml file", name_or_path, known);
  }
  return ParseRunConfig(ReadFileText(path, kMaxJsonBytes, "a config"), path.string());
}

std::string DescriptorJson(const RunConfig& config) {
  const ModelConfig& m = config.model;
  const TrainConfig& t = config.train;
  // nlohmann::json objects keep their keys sorted, and dump() without indent is compact.
  nlohmann::json model = {
      {"vocab", m.vocab},
      {"d_model", m.d_model},
      {"n_layers", m.n_layers},
      {"n_heads", m.n_heads},
      {"n_kv_heads", m.n_kv_heads},
      {"head_dim", m.head_dim},
      {"ffn_hidden", m.ffn_hidden},
      {"seq_len", m.seq_len},
      {"window", m.window},
      {"full_attention_every", m.full_attention_every},
      {"rope_theta", m.rope_theta},
      {"norm_eps", m.norm_eps},
      {"embedding_norm", m.embedding_norm},
      {"qk_norm", m.qk_norm},
      {"z_loss", m.z_loss},
      {"init_std", m.init_std},
  };
  // Only where it is not the default: an fp32 config's descriptor is the one it always was.
  if (m.linear != Linear::kFp32) model["linear"] = LinearName(m.linear);
  if (m.int8_backward) model["int8_backward"] = true;
  if (m.activations != Storage::kFp32) model["activations"] = StorageName(m.activations);
  if (m.compute_weights != Storage::kFp32) {
    model["compute_weights"] = StorageName(m.compute_weights);
  }
  nlohmann::json train = {
      {"microbatch", t.microbatch},
      {"microbatches", t.microbatches},
      {"grad_groups", t.grad_groups},
      {"steps", t.steps},
      {"lr", t.lr},
      {"min_lr", t.min_lr},
      {"warmup_steps", t.warmup_steps},
      {"schedule", t.schedule},
      {"wsd_decay_fraction", t.wsd_decay_fraction},
      {"beta1", t.beta1},
      {"beta2", t.beta2},
      {"eps", t.eps},
      {"weight_decay", t.weight_decay},
      {"clip_norm", t.clip_norm},
      {"spike_threshold", t.spike_threshold},
      {"spike_max_skips", t.spike_max_skips},
      {"spike_window", t.spike_window},
      {"ckpt_every", t.ckpt_every},
      {"seed", t.seed},
      {"data_seed", t.data_seed},
      {"vocab_chunk", t.vocab_chunk},
  };
  nlohmann::json descriptor = {
      {"name", config.name},
      {"model", model},
      {"train", train},
      {"contract_version", build::kContractVersion},
      {"format_versions",
       {{"state_hash", kStateHashFormatVersion},
        {"checkpoint", kCheckpointFormatVersion},
        {"shards", kShardsFormatVersion}}},
  };
  return descriptor.dump();
}

std::string_view LinearName(Linear linear) { return linear == Linear::kInt8 ? "int8" : "fp32"; }
std::string_view StorageName(Storage storage) {
  return storage == Storage::kBf16 ? "bf16" : "fp32";
}

int64_t LayerWindow(const ModelConfig& config, int64_t layer) {
  const bool full = config.window == 0 || (layer + 1) % config.full_attention_every == 0 ||
                    layer == config.n_layers - 1;
  return full ? 0 : config.window;
}

RunConfig ConfigOfDescriptor(std::string_view descriptor, const std::string& source) {
  const nlohmann::json parsed = ParseJsonStrict(descriptor, source + " (the run descriptor)");
  if (!parsed.is_object()) Fail("{}: the run descriptor is not a JSON object", source);
  nlohmann::json config;
  for (const char* key : {"name", "model", "train"}) {
    if (!parsed.contains(key)) Fail("{}: the run descriptor has no \"{}\"", source, key);
    config[key] = parsed[key];
  }
  // JSON is YAML, but YAML reads the string "512" as 512: the descriptor's values must have
  // their own types (DescriptorJson writes numbers and booleans as such; the only strings are
  // the name, train.schedule, model.linear, model.activations and model.compute_weights).
  for (const char* section : {"model", "train"}) {
    const nlohmann::json& fields = config[section];
    if (!fields.is_object())
      Fail("{}: the run descriptor's \"{}\" is not an object", source, section);
    for (const auto& [field, value] : fields.items()) {
      const bool text =
          (std::string_view(section) == "train" && field == "schedule") ||
          (std::string_view(section) == "model" &&
           (field == "linear" || field == "activations" || field == "compute_weights"));
      if (value.is_string() != text || value.is_structured() || value.is_null()) {
        Fail("{}: the run descriptor's {}.{} is {}, not a {}", source, section, field,
             ShownJson(value), text ? "string" : "number or boolean");
      }
    }
  }
  return ParseRunConfig(config.dump(), source);
}

}  // namespace lockstep
