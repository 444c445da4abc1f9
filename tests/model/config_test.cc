// Run configs: the embedded set, the published shapes, and errors that name file, field, value.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "lockstep/core.h"
#include "lockstep/model.h"

namespace lockstep {
namespace {

int64_t CountParameters(const ModelConfig& config) {
  int64_t n = 0;
  for (const ParamSpec& spec : ParameterSpecs(config)) n += spec.numel();
  return n;
}

TEST(Config, EveryEmbeddedConfigLoads) {
  const std::vector<std::string> names = EmbeddedConfigNames();
  for (const char* expected : {"tiny", "smoke", "bench-8x512", "open-100m", "open-1b"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
  for (const std::string& name : names) {
    const RunConfig config = LoadRunConfig(name);
    EXPECT_EQ(config.name, name);
    std::printf("%-12s %12lld parameters\n", name.c_str(),
                static_cast<long long>(CountParameters(config.model)));
  }
}

// The model FLOPs of a step, counted by hand from the config: bench-8x512 (8 layers, d 512,
// 8 query heads and 2 kv heads of 64, FFN 1408, vocab 8192, 8 sequences of 256, full attention)
// and a sliding window, which counts only the visible pairs.
TEST(Config, ModelFlopsPerStepCountsMatmulsAndVisiblePairs) {
  RunConfig config = LoadRunConfig("bench-8x512");
  const double layer_matmul = 512.0 * 512 + 2 * 128.0 * 512 + 512.0 * 512 + 2816.0 * 512 +
                              512.0 * 1408;
  const double matmul = 8 * layer_matmul + 8192.0 * 512;  // the head; the table is a lookup
  const double tokens = 8 * 256;
  const double pairs = 8 * (256.0 * 257 / 2);  // per sequence, over the layers
  EXPECT_DOUBLE_EQ(ModelFlopsPerStep(config), 6 * matmul * tokens + 12 * 64 * 8 * pairs * 8);
  config.model.window = 16;  // with full attention every 8th layer: layers 0-6 windowed
  config.model.full_attention_every = 8;
  const double windowed = 16.0 * 17 / 2 + 16.0 * (256 - 16);  // q < 16 see q + 1, then 16
  EXPECT_DOUBLE_EQ(ModelFlopsPerStep(config),
                   6 * matmul * tokens + 12 * 64 * 8 * (7 * windowed + 256.0 * 257 / 2) * 8);
}

TEST(Config, SizesOfTheNamedModels) {
  EXPECT_EQ(CountParameters(LoadRunConfig("open-1b").model), 1607569408);  // "1.61B"
  const int64_t tiny = CountParameters(LoadRunConfig("tiny").model);
  EXPECT_GT(tiny, 800000);
  EXPECT_LT(tiny, 1300000);
  const int64_t smoke = CountParameters(LoadRunConfig("smoke").model);
  EXPECT_GE(smoke, 10000000);
  EXPECT_LE(smoke, 20000000);

  const ModelConfig bench = LoadRunConfig("bench-8x512").model;
  EXPECT_EQ(bench.n_layers, 8);
  EXPECT_EQ(bench.d_model, 512);
  EXPECT_EQ(bench.n_heads, 8);
  EXPECT_EQ(bench.n_kv_heads, 2);
  EXPECT_EQ(bench.head_dim, 64);
  EXPECT_EQ(bench.ffn_hidden, 1408);
  EXPECT_EQ(bench.vocab, 8192);
  EXPECT_EQ(bench.seq_len, 256);
  EXPECT_EQ(LoadRunConfig("bench-8x512").train.microbatch, 8);
  const std::vector<ParamSpec> specs = ParameterSpecs(bench);
  ASSERT_FALSE(bench.embedding_norm);  // so layer 0 starts at index 1
  EXPECT_EQ(specs[3].name, "layers.0.attn.wk.weight");
  EXPECT_EQ(specs[3].shape, (std::vector<int64_t>{128, 512}));
  EXPECT_EQ(specs[7].name, "layers.0.ffn.w_gate_up.weight");
  EXPECT_EQ(specs[7].shape, (std::vector<int64_t>{2816, 512}));

  const ModelConfig m100 = LoadRunConfig("open-100m").model;
  EXPECT_EQ(m100.n_layers, 6);
  EXPECT_EQ(m100.d_model, 768);
  EXPECT_EQ(m100.n_heads, 12);
  EXPECT_EQ(m100.n_kv_heads, 4);
  EXPECT_EQ(m100.head_dim, 64);
  EXPECT_EQ(m100.ffn_hidden, 2048);
  EXPECT_EQ(m100.vocab, 128256);
}

TEST(Config, ParameterOrderAndGroups) {
  const std::vector<ParamSpec> specs = ParameterSpecs(LoadRunConfig("tiny").model);
  std::vector<std::string> names;
  for (const ParamSpec& s : specs) names.push_back(s.name);
  const std::vector<std::string> expected = {
      "tok_embeddings.weight",         "emb_norm.weight",
      "layers.0.attn_norm.weight",     "layers.0.attn.wq.weight",
      "layers.0.attn.wk.weight",       "layers.0.attn.wv.weight",
      "layers.0.attn.wo.weight",       "layers.0.ffn_norm.weight",
      "layers.0.ffn.w_gate_up.weight", "layers.0.ffn.w_down.weight",
      "layers.1.attn_norm.weight",     "layers.1.attn.wq.weight",
      "layers.1.attn.wk.weight",       "layers.1.attn.wv.weight",
      "layers.1.attn.wo.weight",       "layers.1.ffn_norm.weight",
      "layers.1.ffn.w_gate_up.weight", "layers.1.ffn.w_down.weight",
      "final_norm.weight",             "output.weight"};
  EXPECT_EQ(names, expected);
  for (const ParamSpec& s : specs) {
    EXPECT_EQ(s.is_matrix, s.shape.size() == 2) << s.name;
    EXPECT_EQ(s.weight_decay, s.is_matrix && s.name != "tok_embeddings.weight") << s.name;
    EXPECT_EQ(s.layer, s.name.starts_with("layers.") ? s.name[7] - '0' : -1) << s.name;
  }
}

TEST(Config, LayerWindowPattern) {
  const ModelConfig open1b = LoadRunConfig("open-1b").model;
  for (int64_t l = 0; l < open1b.n_layers; ++l) {
    const bool full = (l + 1) % 5 == 0 || l == 23;
    EXPECT_EQ(LayerWindow(open1b, l), full ? 0 : 512) << l;
  }
  const ModelConfig tiny = LoadRunConfig("tiny").model;
  EXPECT_GT(LayerWindow(tiny, 0), 0);
  EXPECT_EQ(LayerWindow(tiny, 1), 0);
}

TEST(Config, DescriptorIsCanonicalJson) {
  const RunConfig config = LoadRunConfig("tiny");
  const std::string text = DescriptorJson(config);
  EXPECT_EQ(text.find(' '), std::string::npos) << text;  // compact
  EXPECT_EQ(text.rfind("{\"contract_version\":", 0), 0u) << text;  // keys sorted
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["format_versions"], (nlohmann::json{{"state_hash", 2}, {"checkpoint", 3}, {"shards", 2}}));
  EXPECT_EQ(j["model"]["init_std"].dump(), "0.02");
  EXPECT_EQ(j["train"]["vocab_chunk"], 256);
  EXPECT_EQ(j["name"], "tiny");
  EXPECT_EQ(j.dump(), text);
  // model.linear is in the descriptor only where it is not fp32 (so fp32 descriptors are the
  // ones they were before the key existed), and it is read back.
  EXPECT_FALSE(j["model"].contains("linear")) << text;
  const RunConfig int8 = LoadRunConfig("tiny-int8");
  const std::string int8_text = DescriptorJson(int8);
  EXPECT_EQ(nlohmann::json::parse(int8_text)["model"]["linear"], "int8");
  EXPECT_EQ(ConfigOfDescriptor(int8_text, "d").model.linear, Linear::kInt8);
  EXPECT_EQ(ConfigOfDescriptor(text, "d").model.linear, Linear::kFp32);
  // model.int8_backward likewise, only where it is true (tiny-int8 has it).
  EXPECT_EQ(nlohmann::json::parse(int8_text)["model"]["int8_backward"], true) << int8_text;
  EXPECT_TRUE(ConfigOfDescriptor(int8_text, "d").model.int8_backward);
  RunConfig straight = int8;
  straight.model.int8_backward = false;
  const std::string straight_text = DescriptorJson(straight);
  EXPECT_FALSE(nlohmann::json::parse(straight_text)["model"].contains("int8_backward"));
  EXPECT_FALSE(ConfigOfDescriptor(straight_text, "d").model.int8_backward);
  // model.activations and model.compute_weights likewise, only where they are bf16.
  EXPECT_FALSE(j["model"].contains("activations")) << text;
  EXPECT_FALSE(j["model"].contains("compute_weights")) << text;
  const RunConfig bf16 = LoadRunConfig("tiny-bf16");
  const std::string bf16_text = DescriptorJson(bf16);
  const nlohmann::json bf16_model = nlohmann::json::parse(bf16_text)["model"];
  EXPECT_EQ(bf16_model["activations"], "bf16") << bf16_text;
  EXPECT_EQ(bf16_model["compute_weights"], "bf16") << bf16_text;
  for (const Storage activations : {Storage::kFp32, Storage::kBf16}) {
    for (const Storage weights : {Storage::kFp32, Storage::kBf16}) {
      RunConfig one = bf16;
      one.model.activations = activations;
      one.model.compute_weights = weights;
      const ModelConfig back = ConfigOfDescriptor(DescriptorJson(one), "d").model;
      EXPECT_EQ(back.activations, activations);
      EXPECT_EQ(back.compute_weights, weights);
    }
  }
}

// A descriptor is read back with its values' own types: the string "512" is not the number 512.
TEST(Config, ADescriptorsValuesKeepTheirTypes) {
  const RunConfig config = LoadRunConfig("tiny");
  nlohmann::json j = nlohmann::json::parse(DescriptorJson(config));
  EXPECT_EQ(ConfigOfDescriptor(j.dump(), "d").model.vocab, 512);
  for (const auto& [section, field, value] : {std::tuple{"model", "vocab", nlohmann::json("512")},
                                              {"train", "lr", nlohmann::json("0.003")},
                                              {"model", "qk_norm", nlohmann::json("true")},
                                              {"train", "schedule", nlohmann::json(1)},
                                              {"model", "linear", nlohmann::json(8)},
                                              {"model", "window", nlohmann::json(nullptr)}}) {
    nlohmann::json forged = j;
    forged[section][field] = value;
    try {
      ConfigOfDescriptor(forged.dump(), "forged");
      ADD_FAILURE() << section << "." << field << " = " << value.dump() << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(section) + "." + field), std::string::npos)
          << e.what();
    }
  }
}

// tiny.yaml with `from` (a whole line fragment) replaced by `to`.
std::string TinyWith(const std::string& from, const std::string& to) {
  std::string text = ReadFileText(std::filesystem::path(LOCKSTEP_SOURCE_DIR) / "configs/tiny.yaml");
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

std::string ErrorOf(const std::string& yaml) {
  try {
    ParseRunConfig(yaml, "bad.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Config, BadConfigsNameTheFieldAndTheValue) {
  struct Case {
    std::string from, to;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"  d_model: 128",
       "  d_model: 128\n  dmodel: 64",
       {"bad.yaml", "unknown key", "model.dmodel"}},
      {"  beta2: 0.95\n", "", {"bad.yaml", "missing", "train.beta2"}},
      {"  n_layers: 2", "  n_layers: two", {"bad.yaml", "model.n_layers", "'two'", "integer"}},
      {"  n_layers: 2", "  n_layers: 2.5", {"model.n_layers", "'2.5'"}},
      {"  qk_norm: true", "  qk_norm: 3", {"model.qk_norm", "'3'", "boolean"}},
      // A boolean is exactly true or false, unquoted.
      {"  qk_norm: true", "  qk_norm: yes", {"model.qk_norm = 'yes' is not a boolean"}},
      {"  qk_norm: true", "  qk_norm: True", {"model.qk_norm = 'True' is not a boolean"}},
      {"  qk_norm: true", "  qk_norm: \"true\"", {"model.qk_norm = 'true' is not a boolean"}},
      // A string that is not printable is shown escaped, whole: a NUL cuts nothing short, an
      // escape sequence never reaches the terminal.
      {"  z_loss: 1.0e-4",
       "  z_loss: 1.0e-4\n  linear: \"int8\\0\"",
       {"model.linear = \"int8\\u0000\" is invalid: must be fp32 or int8"}},
      {"  z_loss: 1.0e-4",
       "  z_loss: 1.0e-4\n  linear: \"fp32\\e[2J\"",
       {"model.linear = \"fp32\\u001b[2J\" is invalid"}},
      {"  n_layers: 2",
       "  n_layers: \"2\\0\"",
       {"model.n_layers = \"2\\u0000\" is not an integer"}},
      {"train:", "\"ex\\etra\": 1\ntrain:", {"unknown key ex?tra"}},
      {"  n_kv_heads: 2",
       "  n_kv_heads: 3",
       {"bad.yaml", "model.n_heads = 4", "model.n_kv_heads = 3"}},
      {"  head_dim: 32", "  head_dim: 33", {"model.head_dim = 33", "even"}},
      {"  vocab: 512", "  vocab: 256", {"model.vocab = 256", "257"}},
      {"  spike_max_skips: 3",
       "  spike_max_skips: 11",
       {"bad.yaml", "train.spike_max_skips = 11", "never halt"}},
      {"  spike_max_skips: 3", "  spike_max_skips: 0", {"train.spike_max_skips = 0"}},
      {"  vocab_chunk: 256",
       "  vocab_chunk: 300",
       {"bad.yaml", "train.vocab_chunk = 300", "multiple of 256"}},
      {"  vocab_chunk: 256", "  vocab_chunk: 0", {"train.vocab_chunk = 0"}},
      {"  beta2: 0.95", "  beta2: 1.5", {"train.beta2 = 1.5"}},
      {"  lr: 3.0e-3", "  lr: -1", {"train.lr = -1"}},
      {"  schedule: cosine", "  schedule: linear", {"train.schedule = linear"}},
      {"  seed: 1234", "  seed: -5", {"train.seed", "'-5'"}},
      {"  norm_eps: 1.0e-5", "  norm_eps: .nan", {"model.norm_eps", "not finite"}},
      {"train:", "extra: 1\ntrain:", {"unknown key extra"}},
      {"name: tiny", "name: \"ti\\xffny\"", {"bad.yaml", "name = 'ti", "' is invalid"}},
      {"name: tiny", "name: a/b", {"name = 'a/b' is invalid"}},
      {"  microbatches: 2",
       "  microbatches: 2\n  grad_groups: 3",
       {"bad.yaml", "train.grad_groups = 3", "divide train.microbatches = 2"}},
      {"  microbatches: 2", "  microbatches: 2\n  grad_groups: 0", {"train.grad_groups = 0"}},
      {"  vocab: 512", "  vocab: 512\n  vocab: 600", {"bad.yaml", "duplicate key model.vocab"}},
      {"  d_model: 128", "  d_model: 4611686018427387904", {"model.d_model = 4611686018427387904"}},
      {"  n_layers: 2", "  n_layers: 2147483647", {"model.n_layers = 2147483647"}},
      {"  seq_len: 64", "  seq_len: 9223372036854775807", {"model.seq_len"}},
      {"  steps: 30", "  steps: 99999999999999999999", {"train.steps"}},
      {"name: tiny", "name: [[[[[[[[[[[[[[[[[[x]]]]]]]]]]]]]]]]]]", {"nested deeper than 16"}},
      {"  z_loss: 1.0e-4",
       "  z_loss: 1.0e-4\n  linear: int4",
       {"bad.yaml", "model.linear = int4", "fp32 or int8"}},
      {"  z_loss: 1.0e-4", "  z_loss: 1.0e-4\n  linear: true", {"model.linear"}},
      {"  z_loss: 1.0e-4",
       "  z_loss: 1.0e-4\n  activations: fp16",
       {"bad.yaml", "model.activations = fp16", "fp32 or bf16"}},
      {"  z_loss: 1.0e-4",
       "  z_loss: 1.0e-4\n  compute_weights: BF16",
       {"bad.yaml", "model.compute_weights = BF16", "fp32 or bf16"}},
      {"  z_loss: 1.0e-4", "  z_loss: 1.0e-4\n  activations: 16", {"model.activations"}},
      {"  ffn_hidden: 1024",
       "  ffn_hidden: 133145\n  linear: int8",
       {"bad.yaml", "model.ffn_hidden = 133145", "133144"}},
      {"  n_heads: 4\n  n_kv_heads: 2\n  head_dim: 32",
       "  n_heads: 64\n  n_kv_heads: 2\n  head_dim: 4096\n  linear: int8",
       {"bad.yaml", "model.n_heads · model.head_dim = 262144", "133144", "wo"}},
      {"  z_loss: 1.0e-4",
       "  z_loss: 1.0e-4\n  int8_backward: true",
       {"bad.yaml", "model.int8_backward = true", "only with model.linear = int8"}},
      {"  z_loss: 1.0e-4", "  z_loss: 1.0e-4\n  int8_backward: 1", {"model.int8_backward"}},
      {"  ffn_hidden: 1024",
       "  ffn_hidden: 66573\n  linear: int8\n  int8_backward: true",
       {"bad.yaml", "model.ffn_hidden = 66573", "2 · model.ffn_hidden", "133144", "w_gate_up"}},
      {"  seq_len: 64",
       "  seq_len: 66573\n  linear: int8\n  int8_backward: true",
       {"bad.yaml", "train.microbatch = 2 times model.seq_len = 66573", "133144"}},
  };
  for (const Case& c : cases) {
    const std::string message = ErrorOf(TinyWith(c.from, c.to));
    for (const std::string& part : c.expect) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "case '" << c.to << "': expected '" << part << "' in: " << message;
    }
  }
  EXPECT_NE(ErrorOf("name: [unclosed").find("bad.yaml"), std::string::npos);
  // Each size within its bound, their product not: tokens per microbatch.
  std::string big = TinyWith("  seq_len: 64", "  seq_len: 1048576");
  big.replace(big.find("  microbatch: 2"), 15, "  microbatch: 32");
  EXPECT_NE(ErrorOf(big).find("train.microbatch = 32 times model.seq_len = 1048576"),
            std::string::npos)
      << ErrorOf(big);
}

TEST(Config, GradGroupsDefaultToOneAndEnterTheDescriptor) {
  const RunConfig tiny = LoadRunConfig("tiny");
  EXPECT_EQ(tiny.train.grad_groups, 1);  // tiny.yaml has no grad_groups
  EXPECT_NE(DescriptorJson(tiny).find("\"grad_groups\":1"), std::string::npos);
  const RunConfig dp = LoadRunConfig("tiny-dp");
  EXPECT_EQ(dp.train.grad_groups, 8);
  EXPECT_EQ(dp.train.microbatches, 8);
  EXPECT_NE(DescriptorJson(dp).find("\"grad_groups\":8"), std::string::npos);
}

TEST(Config, FileErrorsNameThePath) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "lockstep_model_bad_config.yaml";
  WriteFileSynced(path, TinyWith("  vocab_chunk: 256", "  vocab_chunk: 100"));
  try {
    LoadRunConfig(path.string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string() + ": train.vocab_chunk = 100"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
  EXPECT_THROW(LoadRunConfig("no-such-config"), Error);
}

}  // namespace
}  // namespace lockstep
