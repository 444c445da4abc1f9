// `lockstep trace`, `lockstep dispute steps|ops|reveal` and `lockstep referee`
// (docs/disputes.md).
#include <fmt/format.h>

#include <array>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>

#include "lockstep/dispute.h"
#include "lockstep/state.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {
namespace {
namespace fs = std::filesystem;

void AddTraceCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<dispute::TraceOptions>();
  auto dump_ops = std::make_shared<std::vector<int64_t>>();
  CLI::App* cmd = app.add_subcommand(
      "trace",
      "replay step --step from a checkpoint at or before the step before it, recording every op "
      "of the step (each kernel call of forward and backward per microbatch and layer, the "
      "gradient sums, norm, clip and update per tensor) as a record of BLAKE2b-256 digests of its "
      "inputs and outputs; writes OUT/records.jsonl and OUT/trace.json (the Merkle root over the "
      "records). Prints a JSON summary. Exit 0, 2 on bad input");
  cmd->add_option("--checkpoint", o->checkpoint, "the checkpoint to replay from")->required();
  cmd->add_option("--data", o->data_dir, "the run's dataset directory")->required();
  AddUnsignedOption(cmd, "--step", &o->step, kMaxSteps, "the step to trace (after the checkpoint's)")
      ->required();
  cmd->add_option("--out", o->out, "the trace directory to create")
      ->required()
      ->check(OutputPath(OutputKind::kNewDirectory));
  cmd->add_option("--dump-op", *dump_ops,
                  "also write op K's input and output tensors to OUT/op_K.safetensors (what a "
                  "party reveals to the referee); may be given more than once")
      ->check(IntegerIn(0, INT64_MAX));
  cmd->add_option("--threads", o->threads, "worker threads (results do not depend on it)")
      ->capture_default_str()
      ->check(IntegerIn(1, 1024));
  cmd->add_flag("--progress,!--no-progress", o->progress, "show (default) or hide progress lines");
  AddTestFaultOptions(cmd, &o->faults, /*replica=*/false);
  auto device = std::make_shared<std::string>("cpu");
  AddDeviceOption(cmd, device.get());
  cmd->final_callback([o, dump_ops, exit_code, device] {
    std::string device_name;
    const std::unique_ptr<OpExecutor> executor = MakeExecutor(*device, &device_name);
    o->executor = executor.get();
    o->dump_ops.insert(dump_ops->begin(), dump_ops->end());
    RefuseOutputsOntoInputs({{"--out", o->out}},
                            {{"--checkpoint", o->checkpoint}, {"--data", o->data_dir}});
    const dispute::Trace t = dispute::WriteTrace(*o);
    const uint64_t bytes = fs::file_size(t.dir / "records.jsonl");
    fmt::print("{}\n", nlohmann::json{{"step", t.header.step},
                                      {"records", t.header.records},
                                      {"records_bytes", bytes},
                                      {"merkle_root", ToHex(t.header.merkle_root)},
                                      {"state_hash", ToHex(t.header.state_hash)},
                                      {"trace", t.dir.string()}}
                           .dump(2));
    *exit_code = 0;
  });
}

// Runs a party's command for its hash at `step` ({step} in the template is replaced): the first
// "state_hash": "<hex>" of its output, or its first 64-hex word.
std::optional<Digest> AskParty(const std::string& command_template, uint64_t step) {
  std::string command = command_template;
  for (size_t at; (at = command.find("{step}")) != std::string::npos;) {
    command.replace(at, 6, std::to_string(step));
  }
  std::FILE* pipe = ::popen((command + " 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) Fail("cannot run '{}'", command);
  // An answer is a hash, or a replay's JSON result: a command that prints without end is cut
  // off (closing the pipe ends it with SIGPIPE at its next write) rather than read into memory.
  constexpr size_t kMaxAnswerBytes = size_t{16} << 20;
  std::string output;
  std::array<char, 4096> buf;
  for (size_t n;
       output.size() <= kMaxAnswerBytes && (n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0;) {
    output.append(buf.data(), n);
  }
  ::pclose(pipe);
  if (output.size() > kMaxAnswerBytes) {
    Fail("'{}' printed more than {} MiB: its answer should be a state hash or a replay's result",
         command, kMaxAnswerBytes >> 20);
  }
  std::smatch m;
  if (std::regex_search(output, m, std::regex("\"state_hash\"\\s*:\\s*\"([0-9a-f]{64})\"")) ||
      std::regex_search(output, m, std::regex("\\b([0-9a-f]{64})\\b"))) {
    return DigestFromHex(m[1].str(), "a party's answer");
  }
  std::fprintf(stderr, "dispute steps: '%s' gave no hash\n", command.c_str());
  return std::nullopt;
}

void AddDisputeSubcommands(CLI::App& app, int* exit_code) {
  CLI::App* dispute = app.add_subcommand(
      "dispute", "find where two parties' runs part: the first divergent step, then the first "
                 "divergent op (docs/disputes.md)");
  dispute->require_subcommand(1);

  struct StepsFlags {
    fs::path a, b;
    std::string ask_a, ask_b;
  };
  auto s = std::make_shared<StepsFlags>();
  CLI::App* steps = dispute->add_subcommand(
      "steps",
      "compare two parties' chains (a run directory, a kit, or a state_hashes.jsonl file each) "
      "and name the first divergent step. Where a party committed only some steps, bisect "
      "between the last agreed and the first differing committed step by asking the parties "
      "(--ask-a/--ask-b) for their hashes. Prints JSON. Exit 0 when the chains agree, 1 when "
      "they diverge, 2 on bad input");
  steps->add_option("A", s->a, "party A's chain")->required();
  steps->add_option("B", s->b, "party B's chain")->required();
  steps->add_option("--ask-a", s->ask_a,
                    "a command that prints party A's state hash at step {step} (e.g. its "
                    "`lockstep replay --checkpoint ... --until-step {step} --data ...`); it runs "
                    "as long as it takes (prefix `timeout SECONDS` to bound a party that may "
                    "not answer), and at most 16 MiB of its output is read");
  steps->add_option("--ask-b", s->ask_b, "the same for party B");
  steps->final_callback([s, exit_code] {
    dispute::AskHash ask;
    if (!s->ask_a.empty() || !s->ask_b.empty()) {
      ask = [s](int party, uint64_t step) -> std::optional<Digest> {
        const std::string& command = party == 0 ? s->ask_a : s->ask_b;
        if (command.empty()) return std::nullopt;
        return AskParty(command, step);
      };
    }
    const dispute::StepsVerdict v =
        dispute::DisputeSteps(dispute::ReadChain(s->a), dispute::ReadChain(s->b), ask);
    fmt::print("{}\n", v.Json());
    *exit_code = v.diverged ? 1 : 0;
  });

  auto traces = std::make_shared<std::array<fs::path, 2>>();
  CLI::App* ops = dispute->add_subcommand(
      "ops",
      "compare two parties' traces of the same step and name the first record whose outputs "
      "differ while its inputs agree (the op to referee), or whose inputs differ. Prints JSON. "
      "Exit 0 when the traces are identical, 1 when they differ, 2 on bad input");
  ops->add_option("TRACE_A", (*traces)[0], "party A's trace directory")->required();
  ops->add_option("TRACE_B", (*traces)[1], "party B's trace directory")->required();
  ops->final_callback([traces, exit_code] {
    const dispute::OpsVerdict v =
        dispute::DisputeOps(dispute::ReadTrace((*traces)[0]), dispute::ReadTrace((*traces)[1]));
    fmt::print("{}\n", v.Json());
    *exit_code = v.kind == dispute::OpsVerdict::Kind::kIdentical ? 0 : 1;
  });

  auto reveal_trace = std::make_shared<fs::path>();
  auto reveal_op = std::make_shared<int64_t>(0);
  CLI::App* reveal = dispute->add_subcommand(
      "reveal",
      "print record K of a trace with its Merkle inclusion proof against the trace's root, so "
      "one record can be shown without the others. Exit 0, 2 on bad input");
  reveal->add_option("TRACE", *reveal_trace, "the trace directory")->required();
  reveal->add_option("--op", *reveal_op, "the record's index")
      ->required()
      ->check(IntegerIn(0, INT64_MAX));
  reveal->final_callback([reveal_trace, reveal_op, exit_code] {
    const dispute::Trace t = dispute::ReadTrace(*reveal_trace);
    if (*reveal_op < 0 || *reveal_op >= t.header.records) {
      Fail("--op {}: the trace has {} records", *reveal_op, t.header.records);
    }
    std::vector<Digest> leaves;
    for (const dispute::TraceRecord& r : t.records) leaves.push_back(LeafHash(r.line));
    const auto k = static_cast<size_t>(*reveal_op);
    nlohmann::json proof = nlohmann::json::array();
    for (const Digest& d : InclusionProof(leaves, k)) proof.push_back(ToHex(d));
    fmt::print("{}\n", nlohmann::json{{"index", k},
                                      {"records", t.header.records},
                                      {"record", t.records[k].line},
                                      {"leaf", ToHex(leaves[k])},
                                      {"proof", proof},
                                      {"merkle_root", ToHex(t.header.merkle_root)}}
                           .dump(2));
    *exit_code = 0;
  });
}

void AddKeygenCommand(CLI::App& app, int* exit_code) {
  auto out = std::make_shared<fs::path>();
  CLI::App* cmd = app.add_subcommand(
      "keygen",
      "create an Ed25519 signing key (libsodium) for lockstep train --sign-key: KEY (the secret "
      "seed, mode 0600) and KEY.pub (the public key to publish); prints the public key. An "
      "existing file is never overwritten. Exit 0, 2 on error");
  cmd->add_option("--out", *out, "the secret key file to create (KEY.pub beside it)")
      ->required()
      ->check(OutputPath(OutputKind::kNewFile));
  cmd->final_callback([out, exit_code] {
    WriteSigningKey(*out, NewEd25519Seed());
    fs::path pub = *out;
    pub += ".pub";
    fmt::print("public key: {} ({})\n", ToHex(ReadPublicKey(pub)), pub.string());
    *exit_code = 0;
  });
}

void AddRefereeCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<dispute::RefereeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "referee",
      "decide one disputed op: check both parties' record --op (same op, same input digests), "
      "the revealed inputs against those digests and each party's revealed outputs against its "
      "record, recompute the op with the reference kernels and name who is right. Prints a JSON "
      "verdict. Exit 0 party A right, 1 party B right, 3 neither, 4 both (no dispute), 2 bad "
      "input");
  cmd->add_option("--trace-a", o->trace_a, "party A's trace directory")->required();
  cmd->add_option("--trace-b", o->trace_b, "party B's trace directory")->required();
  cmd->add_option("--op", o->op, "the disputed record (dispute ops names it)")
      ->required()
      ->check(IntegerIn(0, INT64_MAX));
  cmd->add_option("--dump-a", o->dump_a, "party A's op dump (trace --dump-op)")->required();
  cmd->add_option("--dump-b", o->dump_b, "party B's op dump")->required();
  cmd->final_callback([o, exit_code] {
    const dispute::RefereeVerdict v = dispute::Referee(*o);
    fmt::print("{}\n", v.json);
    *exit_code = v.ExitCode();
  });
}

}  // namespace

void AddDisputeCommands(CLI::App& app, int* exit_code) {
  AddTraceCommand(app, exit_code);
  AddDisputeSubcommands(app, exit_code);
  AddRefereeCommand(app, exit_code);
  AddKeygenCommand(app, exit_code);
}

}  // namespace lockstep::cli
