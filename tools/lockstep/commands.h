// The subcommands of the lockstep binary, one .cc file each. Each Add*Command registers its
// subcommand(s) on the app; when one is chosen, its final callback runs it and stores the
// process exit code (0 success, 1 a negative verdict such as a mismatch, 2 usage or input
// errors). lockstep::Error escaping a command is reported by main() with exit code 2.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <cstdint>
#include <string>

#include "lockstep/model.h"
#include "lockstep/train.h"

namespace lockstep::cli {

// cmd_selftest.cc: selftest
void AddSelftestCommand(CLI::App& app, int* exit_code);
// cmd_data.cc: data synth|tokenize|import|inspect, tokenizer train
void AddDataCommands(CLI::App& app, int* exit_code);
void AddTokenizerCommands(CLI::App& app, int* exit_code);
// cmd_model.cc: model describe
void AddModelCommands(CLI::App& app, int* exit_code);
// cmd_train.cc: train
void AddTrainCommand(CLI::App& app, int* exit_code);
// cmd_forward.cc: forward
void AddForwardCommand(CLI::App& app, int* exit_code);
// cmd_generate.cc: generate, verify-generation
void AddGenerateCommands(CLI::App& app, int* exit_code);
// cmd_export.cc: export
void AddExportCommand(CLI::App& app, int* exit_code);
// cmd_replay.cc: replay, verify-handoff
void AddReplayCommands(CLI::App& app, int* exit_code);
// cmd_kit.cc: kit build|inspect|verify|fetch, audit, report
void AddKitCommands(CLI::App& app, int* exit_code);
// cmd_dispute.cc: trace, dispute steps|ops|reveal, referee, keygen
void AddDisputeCommands(CLI::App& app, int* exit_code);

// device_option.cc: --device cpu|opencl[:P:D]|cuda[:N] into `flag`; the device it names as the
// executor (null for cpu; device::OpenForRun) and its name, e.g. "opencl:0:0" or "cuda:0".
void AddDeviceOption(CLI::App* cmd, std::string* flag);
std::unique_ptr<OpExecutor> MakeExecutor(const std::string& flag, std::string* name);
// --recompute-activations (train, replay): Model::Activations::kRecomputed when given.
// Every numeric option of `app` and its subcommands (typed INT, UINT or FLOAT) takes decimal
// digits only: no octal "010", hex "0x10", spaces or '+' (CLI11 would read them); the
// text-typed integer options (AddUnsignedOption, IntegerIn) hold to the same rule.
void RequireDecimalNumbers(CLI::App& app);
void AddRecomputeOption(CLI::App* cmd, Model::Activations* activations);

// options.cc: the help of a --config option, "embedded config name (every embedded config) or a
// YAML file".
std::string ConfigHelp();
// An unsigned integer option parsed strictly (no sign, no wrapping) within [0, max];
// --test-fault-op STEP:K and --test-fault-token STEP:I into `faults`, and with `replica`
// --test-corrupt-replica RANK:STEP.
CLI::Option* AddUnsignedOption(CLI::App* cmd, const std::string& name, uint64_t* value,
                               uint64_t max, const std::string& help);
void AddTestFaultOptions(CLI::App* cmd, train::TestFaults* faults, bool replica);
// An output path of `kind` (lockstep::OutputProblem: no link, device, FIFO or socket; a file
// that names a file in an existing directory; a new directory empty or absent), refused when the
// command line is read, before any work: "--out: /dev/null: a character device: ...". Unnamed,
// so --help (and docs/cli.md) show the option's type unchanged.
CLI::Validator OutputPath(OutputKind kind);
// A number > 0 and a number >= 0, refused as "must be > 0, not X". (CLI11's PositiveNumber
// and NonNegativeNumber print their range's upper end, DBL_MAX, in 300-odd digits.)
const CLI::Validator& PositiveNumber();
const CLI::Validator& NonNegativeNumber();
// A decimal integer from `min` to `max` (no sign, no other notation), refused as "expected an
// integer from MIN to MAX, not X" when the command line is parsed: for an integer option, whose
// value would otherwise wrap (-1 as 2^64 - 1) or saturate (2^64 as 2^64 - 1) in conversion.
CLI::Validator IntegerIn(uint64_t min, uint64_t max);
// The most steps a run or a replay may name (2^40): --steps, --until-step, trace --step.
inline constexpr uint64_t kMaxSteps = uint64_t{1} << 40;

}  // namespace lockstep::cli
