// `lockstep export`: a verified checkpoint as a Hugging Face directory or a GGUF file, exactly or
// not at all (docs/export.md).
#include <fmt/format.h>

#include <memory>

#include "lockstep/infer.h"
#include "lockstep/state.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {
namespace {

struct ExportOptions {
  std::filesystem::path checkpoint, out, data;
  std::string format;
};

int RunExport(const ExportOptions& o) {
  const infer::ExportFormat format = o.format == "hf"     ? infer::ExportFormat::kHf
                                     : o.format == "gguf" ? infer::ExportFormat::kGguf
                                                          : infer::ExportFormat::kGgufBf16;
  CheckOutput({"--out", o.out}, format == infer::ExportFormat::kHf ? OutputKind::kNewDirectory
                                                                   : OutputKind::kNewFile);
  RefuseOutputsOntoInputs({{"--out", o.out}}, {{"--checkpoint", o.checkpoint}, {"--data", o.data}});
  // Refuse what the target cannot express before reading gigabytes of weights, naming the
  // checkpoint.
  try {
    infer::ExportArchitecture(infer::ConfigOfCheckpoint(OpenCheckpoint(o.checkpoint)).model,
                              format);
  } catch (const Error& e) {
    Fail("--checkpoint {}: {}", o.checkpoint.string(), e.what());
  }
  const infer::VerifiedModel loaded = infer::LoadVerified(o.checkpoint);
  const infer::ExportResult result = infer::Export(loaded, format, o.out, o.data);
  fmt::print("wrote {} ({} {}, step {}, state hash {})\n", o.out.string(), o.format,
             result.architecture, loaded.step, ToHex(loaded.state_hash));
  for (const std::string& note : result.notes) fmt::print("{}\n", note);
  return 0;
}

}  // namespace

void AddExportCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<ExportOptions>();
  CLI::App* cmd = app.add_subcommand(
      "export",
      "write a checkpoint's model for another runtime, exactly or not at all: --format hf, a "
      "Hugging Face transformers directory (config.json, model.safetensors, "
      "generation_config.json, tokenizer files); --format gguf, one GGUF v3 file for llama.cpp "
      "(F32); --format gguf-bf16, the same with the matrices of a model with "
      "model.compute_weights = bf16 as BF16 (half the bytes; llama.cpp then rounds its "
      "activations to bf16 too, a nearby model, not lockstep's). The architecture is chosen per "
      "config (hf: LlamaForCausalLM, Qwen2ForCausalLM for "
      "sliding windows, Qwen3ForCausalLM for QK-norm; gguf: llama, qwen3 for QK-norm, mimo2 for "
      "sliding windows); a model the format cannot express exactly is refused (exit 2) naming the "
      "feature and the config key. The embedding norm is folded into the table with lockstep's "
      "own kernel. The output must not exist (hf: an empty directory is accepted) nor lie inside "
      "an input; it is written beside its place and renamed, so it appears whole or not at all "
      "(docs/export.md)");
  cmd->add_option("--checkpoint", o->checkpoint,
                  "checkpoint directory (checkpoints/step_*), verified before use")
      ->required();
  cmd->add_option("--format", o->format, "hf (a directory), gguf or gguf-bf16 (a file)")
      ->required()
      ->check(CLI::IsMember({"hf", "gguf", "gguf-bf16"}));
  cmd->add_option("--out", o->out,
                  "output: a directory for hf, a .gguf file for gguf and gguf-bf16")
      ->required();
  cmd->add_option("--data", o->data,
                  "the dataset directory the run trained on (its manifest digest must be the "
                  "checkpoint descriptor's data_manifest_blake2b): its tokenizer is written where "
                  "the format expresses it exactly (hf: the byte vocabulary as a tokenizer.json, "
                  "a SentencePiece tokenizer.model copied, with a tokenizer.json for a BPE model, "
                  "or an imported tokenizer.json copied, when it is in the dataset directory; "
                  "gguf: the byte vocabulary, a SentencePiece BPE model or a byte-level BPE "
                  "tokenizer.json; docs/export.md). Without it no tokenizer is written, and the "
                  "output says so");
  cmd->final_callback([o, exit_code] { *exit_code = RunExport(*o); });
}

}  // namespace lockstep::cli
