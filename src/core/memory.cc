// What the process and the machine hold in memory, from the kernel's own accounting.
#include <string>

#include "lockstep/core.h"

namespace lockstep {
namespace {

// The value of a "Key:   123 kB" line of a /proc file, in bytes.
uint64_t ProcKibField(const char* file, std::string_view key) {
  for (const std::string& line : Lines(ReadFileText(file))) {
    if (!line.starts_with(key) || line.size() <= key.size() || line[key.size()] != ':') continue;
    const size_t digits = line.find_first_of("0123456789", key.size());
    if (digits == std::string::npos || !line.ends_with(" kB")) break;
    return std::stoull(line.substr(digits)) * 1024;
  }
  Fail("{}: no \"{}: <n> kB\" line", file, key);
}

}  // namespace

uint64_t PeakRssBytes() { return ProcKibField("/proc/self/status", "VmHWM"); }

bool ResetPeakRss() {
  // "5" resets VmHWM to the current VmRSS (proc(5), /proc/pid/clear_refs, Linux 4.0+).
  // Opened for appending: a /proc file is neither created nor truncated.
  try {
    File clear = File::OpenForAppend("/proc/self/clear_refs");
    clear.Write("5");
    clear.Close();
    return true;
  } catch (const Error&) {
    return false;  // an older kernel: the caller says the peak covers the whole process
  }
}

uint64_t CurrentRssBytes() { return ProcKibField("/proc/self/status", "VmRSS"); }

std::string MiB(uint64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

uint64_t ProcessReadBytes() {
  for (const std::string& line : Lines(ReadFileText("/proc/self/io"))) {
    if (line.starts_with("rchar: ")) return std::stoull(line.substr(7));
  }
  Fail("/proc/self/io: no \"rchar: <n>\" line");
}

uint64_t MemAvailableBytes() { return ProcKibField("/proc/meminfo", "MemAvailable"); }

}  // namespace lockstep
