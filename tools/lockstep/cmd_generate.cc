// `lockstep generate` and `lockstep verify-generation`: decoding with a KV cache on lockstep's
// kernels, and receipts that anyone can re-execute (docs/inference.md, docs/formats/receipt.md).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>

#include "lockstep/infer.h"
#include "lockstep/json.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {
namespace {

namespace fs = std::filesystem;

struct GenerateOptions {
  fs::path checkpoint, prompt_tokens, batch, data, receipt, sign_key;
  std::string prompt;
  bool have_prompt = false;
  infer::SamplingParams sampling;
  std::string device = "cpu";
  int threads = 1;
};

// --batch FILE (infer::ParseBatch).
std::vector<infer::Request> ReadBatch(const fs::path& path, const data::Tokenizer* tokenizer) {
  return infer::ParseBatch(ReadFileText(path, kMaxJsonBytes, "a --batch file"), tokenizer,
                           path.string());
}

int RunGenerate(const GenerateOptions& o) {
  SetThreads(o.threads);
  const int sources = int(o.have_prompt) + int(!o.prompt_tokens.empty()) + int(!o.batch.empty());
  if (sources != 1) Fail("give exactly one of --prompt, --prompt-tokens and --batch");
  RefuseOutputsOntoInputs({{"--receipt", o.receipt}}, {{"--checkpoint", o.checkpoint},
                                                       {"--data", o.data},
                                                       {"--prompt-tokens", o.prompt_tokens},
                                                       {"--batch", o.batch},
                                                       {"--sign-key", o.sign_key}});
  std::optional<Ed25519Seed> key;
  if (!o.sign_key.empty()) key = ReadSigningKey(o.sign_key);
  std::string device_name;
  const std::unique_ptr<OpExecutor> executor = MakeExecutor(o.device, &device_name);
  const infer::VerifiedModel model = infer::LoadVerified(o.checkpoint);

  std::optional<data::Dataset> dataset;
  std::unique_ptr<data::Tokenizer> tokenizer;
  infer::ReceiptTokenizer bound;
  if (!o.data.empty()) {
    dataset = infer::OpenTrainingData(model, o.data);
    tokenizer = infer::OpenTrainingTokenizer(*dataset);
    bound = {dataset->vocabulary(), dataset->vocabulary().eod};
  }
  std::vector<infer::Request> requests;
  if (o.have_prompt) {
    if (!tokenizer)
      Fail("--prompt needs --data (the dataset whose tokenizer made the model's ids)");
    requests.push_back({0, tokenizer->Encode(o.prompt, "--prompt")});
  } else if (!o.prompt_tokens.empty()) {
    const int64_t seq_len = model.config.model.seq_len;
    requests.push_back({0, infer::ReadTokenFile(o.prompt_tokens, 1, static_cast<uint64_t>(seq_len),
                                                fmt::format("the model's seq_len is {}", seq_len),
                                                model.config.model.vocab)});
  } else {
    requests = ReadBatch(o.batch, tokenizer.get());
  }
  // One request streams its text (or ids) as each token is chosen; a --batch prints each
  // request's output as a JSON line when all are done.
  const bool stream = o.batch.empty();
  std::vector<uint32_t> streamed;
  std::string shown;
  const auto on_token = [&](size_t, uint32_t token) {
    if (!stream) return;
    if (tokenizer) {
      streamed.push_back(token);
      const std::string text = tokenizer->Decode(streamed);
      if (text.starts_with(shown))
        std::fwrite(text.data() + shown.size(), 1, text.size() - shown.size(), stdout);
      shown = text;
    } else {
      fmt::print("{} ", token);
    }
    std::fflush(stdout);
  };
  const std::vector<infer::Generation> out =
      infer::Generate(model, requests, o.sampling, bound.eod, {nullptr, executor.get()}, on_token);
  if (stream) {
    fmt::print("\n");
  } else {
    for (size_t r = 0; r < requests.size(); ++r) {
      nlohmann::json line = {{"id", std::to_string(requests[r].id)},
                             {"output_tokens", out[r].tokens},
                             {"stop", infer::StopName(out[r].stop)}};
      if (tokenizer) line["text"] = tokenizer->Decode(out[r].tokens);
      fmt::print("{}\n", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    }
  }
  for (size_t r = 0; r < requests.size(); ++r) {
    fmt::print(stderr, "request {}: {} prompt tokens, {} generated, stopped at {}\n",
               requests[r].id, requests[r].prompt.size(), out[r].tokens.size(),
               infer::StopName(out[r].stop));
  }
  if (!o.receipt.empty()) {
    const std::string text =
        infer::GenerationReceipt(model, bound, o.sampling, requests, out, key ? &*key : nullptr);
    ReplaceFileSynced(o.receipt, text);
    fmt::print(stderr, "wrote {}{}\n", o.receipt.string(), key ? " (signed)" : "");
  }
  return 0;
}

struct VerifyOptions {
  fs::path receipt, checkpoint, trusted_key, data;
  std::string device = "cpu";
  int threads = 1;
};

int RunVerify(const VerifyOptions& o) {
  SetThreads(o.threads);
  std::optional<Ed25519PublicKey> trusted;
  if (!o.trusted_key.empty()) trusted = ReadPublicKey(o.trusted_key);
  std::string device_name;
  const std::unique_ptr<OpExecutor> executor = MakeExecutor(o.device, &device_name);
  const infer::VerifiedModel model = infer::LoadVerified(o.checkpoint);
  std::optional<data::Vocabulary> vocabulary;
  if (!o.data.empty()) vocabulary = infer::OpenTrainingData(model, o.data).vocabulary();
  const infer::ReceiptVerdict v = infer::VerifyGenerationReceipt(
      o.receipt, model, trusted ? &*trusted : nullptr, vocabulary ? &*vocabulary : nullptr,
      {nullptr, executor.get()});
  fmt::print("{}: {}\n", v.match ? "MATCH" : "MISMATCH", v.detail);
  return v.match ? 0 : 1;
}

}  // namespace

void AddGenerateCommands(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "generate text from a checkpoint with a KV cache on lockstep's kernels: every logit is the "
      "training forward's, bit for bit, on any CPU, thread count or device, whatever else is in "
      "the batch; sampling is a fixed fp32 recipe over one Philox draw per token keyed by (seed, "
      "request id, position) (docs/inference.md). One request streams its text to stdout; a "
      "--batch prints a JSON line per request. --receipt writes what anyone can re-execute with "
      "verify-generation (docs/formats/receipt.md)");
  cmd->add_option("--checkpoint", o->checkpoint,
                  "checkpoint directory (checkpoints/step_*), verified before use")
      ->required();
  cmd->add_option("--prompt", o->prompt, "the prompt as text (needs --data for the tokenizer)")
      ->each([o](const std::string&) { o->have_prompt = true; });
  cmd->add_option("--prompt-tokens", o->prompt_tokens,
                  "the prompt as raw little-endian uint32 token ids");
  cmd->add_option("--batch", o->batch,
                  "requests, one JSON object per line: {\"prompt\": TEXT} or {\"prompt_tokens\": "
                  "[ids]}, optionally with \"id\": a decimal string (default: the line's index "
                  "from 0) that keys the request's draws");
  cmd->add_option("--data", o->data,
                  "the dataset directory the run trained on (its manifest digest must be the "
                  "checkpoint descriptor's): its tokenizer encodes text prompts and decodes the "
                  "output, and its end-of-document id stops a request. Without it, prompts are "
                  "ids and a request stops only at --max-tokens or seq_len");
  cmd->add_option("--max-tokens", o->sampling.max_tokens, "tokens generated per request at most")
      ->capture_default_str()
      ->check(IntegerIn(1, infer::kMaxTokensLimit));
  cmd->add_option("--temperature", o->sampling.temperature,
                  "logits are divided by it before sampling; 0: greedy (the lowest id of the "
                  "largest logit)")
      ->capture_default_str()
      ->check(NonNegativeNumber());
  cmd->add_option("--top-k", o->sampling.top_k, "sample among the K most likely ids; 0: all")
      ->capture_default_str()
      ->check(IntegerIn(0, infer::kMaxTopK));
  cmd->add_option("--top-p", o->sampling.top_p,
                  "then among the fewest most likely ids whose weight reaches P of the total; 1: "
                  "all")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0))
      ->check(PositiveNumber());
  AddUnsignedOption(cmd, "--seed", &o->sampling.seed, UINT64_MAX, "the sampling seed (default 0)");
  cmd->add_option("--receipt", o->receipt,
                  "write a receipt of this generation (JSON) here; not over an input")
      ->check(OutputPath(OutputKind::kFile));
  cmd->add_option("--sign-key", o->sign_key,
                  "sign the receipt with this Ed25519 key (lockstep keygen)")
      ->check(CLI::ExistingFile);
  AddDeviceOption(cmd, &o->device);
  cmd->add_option("--threads", o->threads, "worker threads (results do not depend on it)")
      ->capture_default_str()
      ->check(IntegerIn(1, 1024));
  cmd->final_callback([o, exit_code] {
    if (!o->sign_key.empty() && o->receipt.empty()) Fail("--sign-key needs --receipt");
    *exit_code = RunGenerate(*o);
  });

  auto v = std::make_shared<VerifyOptions>();
  CLI::App* verify = app.add_subcommand(
      "verify-generation",
      "re-execute a generation receipt on a checkpoint: MATCH (exit 0) when every request's "
      "tokens and the chain of its logits' digests come out the same, else the first request and "
      "position where they part (exit 1). A signature present is checked; with --trusted-key one "
      "is required, by that key (docs/formats/receipt.md)");
  verify->add_option("receipt", v->receipt, "the receipt (JSON)")
      ->required()
      ->check(CLI::ExistingFile);
  verify
      ->add_option("--checkpoint", v->checkpoint,
                   "the checkpoint the receipt names (verified before use)")
      ->required();
  verify
      ->add_option("--trusted-key", v->trusted_key,
                   "the signer's public key (KEY.pub): the receipt must be signed by it")
      ->check(CLI::ExistingFile);
  verify
      ->add_option("--data", v->data,
                   "the dataset directory the checkpoint trained on (its manifest digest must be "
                   "the checkpoint descriptor's): the receipt's tokenizer and eod must be its. "
                   "Without it they are the receipt's word, and MATCH says they were not checked")
      ->check(CLI::ExistingDirectory);
  AddDeviceOption(verify, &v->device);
  verify->add_option("--threads", v->threads, "worker threads (results do not depend on it)")
      ->capture_default_str()
      ->check(IntegerIn(1, 1024));
  verify->final_callback([v, exit_code] { *exit_code = RunVerify(*v); });
}

}  // namespace lockstep::cli
