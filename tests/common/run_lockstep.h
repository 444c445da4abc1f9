// Runs the lockstep binary under test (LOCKSTEP_BINARY, a compile definition) with a command
// line and collects its exit code and combined stdout + stderr.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace lockstep::test {

struct Result {
  int exit_code = -1;  // -1 when it did not exit normally (e.g. killed)
  std::string output;  // stdout and stderr
};

// Runs a shell command line, collecting its exit code and its stdout and stderr.
inline Result Shell(const std::string& command) {
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {};
  Result r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline Result Lockstep(const std::string& args) {
  return Shell(std::string(LOCKSTEP_BINARY) + " " + args);
}

}  // namespace lockstep::test
