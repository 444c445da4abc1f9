// lockstep: one binary, one subcommand per file; the README lists the commands and their exit
// statuses, and each has a complete --help.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "lockstep/build_info.h"
#include "lockstep/core.h"
#include "lockstep/device.h"
#include "lockstep/kernels.h"
#include "tools/lockstep/commands.h"

namespace lockstep::cli {
namespace {

std::string IsaNames(const std::vector<rk::Isa>& isas) {
  std::string s;
  for (const rk::Isa& isa : isas) s += (s.empty() ? "" : " ") + isa.name;
  return s;
}

// The OpenCL and CUDA devices, each with whether it meets the numerics contract
// (docs/devices.md).
void PrintDevices() {
  const auto gib = [](uint64_t b) { return static_cast<double>(b) / (1 << 30); };
  if (!device::OpenClBuiltIn()) {
    fmt::print("OpenCL devices: none (built without OpenCL)\n");
  } else {
    std::vector<device::DeviceInfo> devices;
    try {
      devices = device::ListDevices();
      if (devices.empty()) {
        fmt::print("OpenCL devices: none (no OpenCL platform installed{})\n",
                   device::NoOpenClPlatformBecause());
      }
    } catch (const Error& e) {
      fmt::print("OpenCL devices: the driver failed to list them: {}\n", e.what());
    }
    if (!devices.empty()) fmt::print("OpenCL devices:\n");
    for (const device::DeviceInfo& d : devices) {
      const std::string missing = d.Missing();
      fmt::print("  {}  {} ({}; {}, {:.1f} GiB): {}\n", d.choice.Flag(), d.name, d.platform_name,
                 d.c_version, gib(d.global_memory),
                 !missing.empty() ? "refused, lacks " + missing
                 : d.fp64         ? std::string("meets the contract")
                                  : std::string("meets the contract (no fp64: the norm's block "
                                                        "sums run on the CPU)"));
    }
  }
  device::CudaDevices cuda;
  try {
    cuda = device::ListCudaDevices();
  } catch (const Error& e) {
    fmt::print("CUDA devices: the driver failed to list them: {}\n", e.what());
    return;
  }
  if (cuda.devices.empty()) {
    fmt::print("CUDA devices: none ({})\n", cuda.none_because);
    return;
  }
  fmt::print("CUDA devices ({} programs' PTX built in):\n", device::CudaProgramsBuiltIn());
  for (const device::DeviceInfo& d : cuda.devices) {
    fmt::print("  {}  {} ({}; driver {}, {:.1f} GiB): {}\n", d.choice.Flag(), d.name, d.version,
               d.driver, gib(d.global_memory),
               d.refused_because.empty()
                   ? "meets the contract (proven by a known-answer check of its ops when opened)"
                   : "refused: " + d.refused_because);
  }
}

// A first word that names no command (`lockstep NOSUCH`, `lockstep kit NOSUCH`) is refused naming
// the commands, before CLI11 sees it: with --help after it, CLI11 would print the parent's help
// and exit 0, so that a script probing for a command would believe it exists.
void RefuseUnknownCommands(const CLI::App& app, int argc, char** argv) {
  const CLI::App* parent = &app;
  std::string path = "lockstep";
  for (int i = 1; i < argc && argv[i][0] != '-'; ++i) {
    const std::vector<const CLI::App*> commands = parent->get_subcommands({});
    if (commands.empty()) return;
    const auto it =
        std::ranges::find_if(commands, [&](const CLI::App* c) { return c->get_name() == argv[i]; });
    if (it == commands.end()) {
      std::string names;
      for (const CLI::App* c : commands) names += (names.empty() ? "" : ", ") + c->get_name();
      Fail("{} has no command '{}': the commands are {}", path, argv[i], names);
    }
    parent = *it;
    path += " " + (*it)->get_name();
  }
}

void PrintVersion() {
  fmt::print("lockstep {}\n", build::kVersion);
  fmt::print("git commit: {}\n", build::kGitCommit);
  fmt::print("compiler: {}\n", build::kCompiler);
  fmt::print("numerics contract: v{}\n", build::kContractVersion);
  fmt::print("SIMD variants compiled: {}\n", IsaNames(rk::CompiledIsas()));
  fmt::print("SIMD variants usable on this CPU: {}\n", IsaNames(rk::UsableIsas()));
  fmt::print("active variant: {}\n", rk::ActiveIsa().name);
  fmt::print("BLAKE2b of hash chunks: {}\n", Blake2bImplementation());
  PrintDevices();
}

int Run(int argc, char** argv) {
  CLI::App app{"lockstep: bitwise-auditable transformer training"};
  app.require_subcommand(0, 1);
  bool version = false;
  app.add_flag("--version", version,
               "print version, commit, compiler, contract, SIMD variants, the BLAKE2b "
               "implementation and the OpenCL devices with whether each meets the contract");
  int exit_code = 0;
  AddSelftestCommand(app, &exit_code);
  AddDataCommands(app, &exit_code);
  AddTokenizerCommands(app, &exit_code);
  AddModelCommands(app, &exit_code);
  AddTrainCommand(app, &exit_code);
  AddForwardCommand(app, &exit_code);
  AddGenerateCommands(app, &exit_code);
  AddExportCommand(app, &exit_code);
  AddReplayCommands(app, &exit_code);
  AddKitCommands(app, &exit_code);
  AddDisputeCommands(app, &exit_code);
  RequireDecimalNumbers(app);
  RefuseUnknownCommands(app, argc, argv);
  RequireIeeeFloatingPoint();  // the contract needs IEEE subnormals: before any command runs
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (version) {
    PrintVersion();
    return 0;
  }
  if (app.get_subcommands().empty()) {
    fmt::print("{}", app.help());
    return 2;
  }
  return exit_code;
}

}  // namespace
}  // namespace lockstep::cli

namespace {

// A closed standard stream (`>&-`) is held open read-only on /dev/null, so that no file the
// command opens takes its descriptor (and its output), and a write to it fails (EBADF).
void HoldStandardStreams() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int held = ::open("/dev/null", O_RDONLY);
    if (held != fd && held >= 0) ::close(held);  // fd was taken meanwhile: nothing to hold
  }
}

// What a command printed must have reached its standard output: a full disk or a closed stdout
// is an error naming stdout, never a silent exit 0 (a script reading the output would take the
// little that arrived for all of it). Keeps a non-zero status the command chose.
int CheckStdout(int status) {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  if (flushed && !std::ferror(stdout)) return status;
  std::fprintf(stderr,
               "lockstep: error: writing to standard output failed%s%s: its output is lost\n",
               flushed ? "" : ": ", flushed ? "" : std::strerror(errno));
  return status == 0 ? 2 : status;
}

int RunReportingErrors(int argc, char** argv) {
  try {
    return lockstep::cli::Run(argc, argv);
  } catch (const lockstep::InternalError& e) {
    std::fprintf(stderr, "lockstep: %s\n", e.what());
    return lockstep::kInternalErrorExit;
  } catch (const lockstep::Error& e) {
    std::fprintf(stderr, "lockstep: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    // Every known failure is an Error naming its cause; anything else (a file system or
    // library error) still ends as a message and exit 2, never an abort.
    std::fprintf(stderr, "lockstep: error: %s\n", e.what());
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) {
  HoldStandardStreams();
  return CheckStdout(RunReportingErrors(argc, argv));
}
