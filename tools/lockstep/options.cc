// Options several commands share: --config's help, unsigned integers with their ranges, and the
// test-only fault flags of `train`, `replay` and `trace` (docs/disputes.md, "Faults to test
// with"), which are flags, never environment variables: what changes a run's bits is on its
// command line.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/core.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {
namespace {

// Whether `text` is a number as lockstep's options take them: decimal digits, with no leading
// zero but the number 0 itself, no sign but a leading '-' where `negative` allows it, no space,
// and with `fraction`, an optional fraction and exponent (1.5, 2e-3). CLI11 itself would read
// "010" as octal 8, "0x10" as 16 and " 5" as 5.
bool Decimal(std::string_view text, bool negative, bool fraction) {
  size_t i = 0;
  const auto digits = [&] {
    const size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i - start;
  };
  const bool minus = negative && i < text.size() && text[i] == '-';
  if (minus) ++i;
  const size_t first = i;
  const size_t whole = digits();
  if (whole == 0 || (whole > 1 && text[first] == '0')) return false;
  if (fraction && i < text.size() && text[i] == '.') {
    ++i;
    if (digits() == 0) return false;
  }
  // A '-' only before a value below zero: "-0" (or -0.0, -0e5) is zero written as a negative.
  if (minus && text.substr(first, i - first).find_first_not_of("0.") == std::string_view::npos) {
    return false;
  }
  if (fraction && i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
    if (digits() == 0) return false;
  }
  return i == text.size();
}

// `text` as a decimal integer (ParseDecimalU64) from `min` to `max`, or nothing.
std::optional<uint64_t> StrictUnsigned(std::string_view text, uint64_t min, uint64_t max) {
  const std::optional<uint64_t> v = ParseDecimalU64(text);
  if (!v || *v < min || *v > max) return std::nullopt;
  return v;
}

// "A:B", two non-negative decimal integers.
std::pair<uint64_t, uint64_t> ParsePair(const std::string& text, const std::string& flag) {
  const size_t colon = text.find(':');
  const std::string_view all(text);
  const std::optional<uint64_t> a = colon == std::string::npos
                                        ? std::nullopt
                                        : StrictUnsigned(all.substr(0, colon), 0, UINT64_MAX);
  const std::optional<uint64_t> b =
      colon == std::string::npos ? std::nullopt
                                 : StrictUnsigned(all.substr(colon + 1), 0, uint64_t{1} << 62);
  if (!a || !b) Fail("{} {}: expected two non-negative integers A:B", flag, text);
  return {*a, *b};
}

}  // namespace

std::string ConfigHelp() {
  std::vector<std::string> sorted = EmbeddedConfigNames();
  std::sort(sorted.begin(), sorted.end());
  std::string names;
  for (const std::string& name : sorted) names += (names.empty() ? "" : ", ") + name;
  return "embedded config name (" + names + ") or a YAML file";
}

CLI::Option* AddUnsignedOption(CLI::App* cmd, const std::string& name, uint64_t* value,
                               uint64_t max, const std::string& help) {
  return cmd->add_option_function<std::string>(
      name,
      [name, value, max](const std::string& text) {
        const std::optional<uint64_t> v = StrictUnsigned(text, 0, max);
        if (!v) Fail("{} {}: expected an integer from 0 to {}", name, text, max);
        *value = *v;
      },
      fmt::format("{} (an integer from 0 to {})", help, max));
}

namespace {
CLI::Validator NumberAtLeast(bool strictly_positive) {
  return CLI::Validator(
      [strictly_positive](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "must be a number, not " + text;
        const bool ok = strictly_positive ? value > 0 : value >= 0;
        if (ok) return std::string();
        return fmt::format("must be {} 0, not {}", strictly_positive ? ">" : ">=", text);
      },
      strictly_positive ? "POSITIVE" : "NONNEGATIVE");
}
}  // namespace

CLI::Validator IntegerIn(uint64_t min, uint64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        if (StrictUnsigned(text, min, max)) return std::string();
        return fmt::format("expected an integer from {} to {}, not {}", min, max, text);
      },
      fmt::format("INT in [{} - {}]", min, max));
}

CLI::Validator OutputPath(OutputKind kind) {
  return CLI::Validator(
      [kind](std::string& text) -> std::string { return OutputProblem(text, kind).value_or(""); },
      "");
}

const CLI::Validator& PositiveNumber() {
  static const CLI::Validator validator = NumberAtLeast(true);
  return validator;
}
const CLI::Validator& NonNegativeNumber() {
  static const CLI::Validator validator = NumberAtLeast(false);
  return validator;
}

void RequireDecimalNumbers(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    const bool is_unsigned = type.starts_with("UINT"), is_float = type.starts_with("FLOAT");
    if (!is_unsigned && !is_float && !type.starts_with("INT")) continue;
    // No name, so the type --help shows (and docs/cli.md) is unchanged.
    option->check(CLI::Validator(
        [is_unsigned, is_float](std::string& text) -> std::string {
          if (Decimal(text, !is_unsigned, is_float)) return std::string();
          return fmt::format("expected a decimal number{}, not {}",
                             is_float      ? ""
                             : is_unsigned ? " (digits only)"
                                           : " (digits, or - and digits)",
                             text);
        },
        ""));
  }
  for (CLI::App* sub : app.get_subcommands({})) RequireDecimalNumbers(*sub);
}

void AddTestFaultOptions(CLI::App* cmd, train::TestFaults* faults, bool replica) {
  // A STEP:INDEX fault.
  const auto add = [cmd](const std::string& name, std::optional<train::StepAndIndex>* fault,
                         const std::string& help) {
    cmd->add_option_function<std::string>(
           name,
           [name, fault](const std::string& text) {
             const auto [step, index] = ParsePair(text, name);
             *fault = train::StepAndIndex{step, static_cast<int64_t>(index)};
           },
           help)
        ->group("Test faults");
  };
  add("--test-fault-op", &faults->op,
      "test only, STEP:K: move element 0 of the first output of op K (0-based, in trace order) "
      "of step STEP one ulp toward +inf (an integer or bf16 output: its lowest bit flipped), as a "
      "faulty party would (single process)");
  add("--test-fault-token", &faults->token,
      "test only, STEP:I: flip the lowest bit of token I of step STEP (the step's tokens in "
      "microbatch order), as a party that read other data would");
  if (!replica) return;
  cmd->add_option_function<std::string>(
         "--test-corrupt-replica",
         [faults](const std::string& text) {
           const auto [rank, step] = ParsePair(text, "--test-corrupt-replica");
           if (rank > 1u << 20) Fail("--test-corrupt-replica {}: no such rank", text);
           faults->replica = {static_cast<int>(rank), step};
         },
         "test only, RANK:STEP (multi-process runs): rank RANK changes one element of the first "
         "parameter tensor it receives at step STEP, as a faulty node would")
      ->group("Test faults");
}

void AddRecomputeOption(CLI::App* cmd, Model::Activations* activations) {
  cmd->add_flag_callback(
      "--recompute-activations", [activations] { *activations = Model::Activations::kRecomputed; },
      "keep only each layer's input in the forward and compute the layer's forward again in the "
      "backward: activations of one layer instead of all, for one more forward's compute. Same "
      "bits (docs/training.md, \"Memory\")");
}

}  // namespace lockstep::cli
