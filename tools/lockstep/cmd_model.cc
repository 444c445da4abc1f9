// `lockstep model describe --config NAME|PATH`: every parameter's name, shape and element
// count in the canonical order, and the totals.
#include <fmt/format.h>

#include <string>

#include "lockstep/model.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// 1607569408 -> "1.61B", 10742784 -> "10.74M".
std::string Abbreviated(int64_t count) {
  const double c = static_cast<double>(count);
  return c >= 1e9 ? fmt::format("{:.2f}B", c / 1e9) : fmt::format("{:.2f}M", c / 1e6);
}

int Describe(const std::string& config_name) {
  const RunConfig config = LoadRunConfig(config_name);
  const std::vector<ParamSpec> specs = ParameterSpecs(config.model);
  size_t name_width = 4;
  for (const ParamSpec& spec : specs) name_width = std::max(name_width, spec.name.size());
  fmt::print(
      "config {}: {} layers, d_model {}, vocab {}, {} linears{}, {} activations, {} compute "
      "weights\n",
      config.name, config.model.n_layers, config.model.d_model, config.model.vocab,
      LinearName(config.model.linear), config.model.int8_backward ? " with an int8 backward" : "",
      StorageName(config.model.activations), StorageName(config.model.compute_weights));
  fmt::print("{:<{}}  {:<14}  {:>13}\n", "name", name_width, "shape", "count");
  int64_t total = 0, embedding = 0, scales = 0;
  for (const ParamSpec& spec : specs) {
    fmt::print("{:<{}}  {:<14}  {:>13}\n", spec.name, name_width, ShapeText(spec.shape),
               spec.numel());
    if (spec.is_scale) {
      scales += spec.numel();
      continue;
    }
    total += spec.numel();
    // Embedding parameters: the token table and the (untied) output head.
    if (spec.name == "tok_embeddings.weight" || spec.name == "output.weight") {
      embedding += spec.numel();
    }
  }
  fmt::print("tensors: {}\n", specs.size());
  fmt::print("parameters: {} ({})\n", total, Abbreviated(total));
  fmt::print("embedding parameters (tok_embeddings + output): {}\n", embedding);
  fmt::print("non-embedding parameters: {}\n", total - embedding);
  if (scales > 0) {
    fmt::print(
        "weight scales (the int8 linears' *.scale tensors: state, set from their weights after "
        "every update, not trained): {}\n",
        scales);
  }
  fmt::print("model FLOPs per step: {:.1f} GFLOP ({} sequences of {} tokens)\n",
             ModelFlopsPerStep(config) * 1e-9,
             config.train.microbatches * config.train.microbatch, config.model.seq_len);
  return 0;
}

}  // namespace

void AddModelCommands(CLI::App& app, int* exit_code) {
  CLI::App* model = app.add_subcommand("model", "inspect model configs");
  model->require_subcommand(1);
  CLI::App* describe = model->add_subcommand(
      "describe", "print every parameter's name, shape and element count, and the totals");
  auto config = std::make_shared<std::string>();
  describe->add_option("--config", *config, ConfigHelp())->required();
  describe->final_callback([config, exit_code] { *exit_code = Describe(*config); });
}

}  // namespace lockstep::cli
