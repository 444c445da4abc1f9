// DirectReader: reads of files opened with O_DIRECT, on threads of its own; SpillStore's pieces
// are read ahead through it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/core.h"

namespace lockstep::train {

// Bytes rounded up to whole blocks of direct I/O (kDirectIoAlignment).
inline size_t DirectBytes(size_t bytes) {
  return (bytes + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
}

// Reads ranges of files opened with O_DIRECT on threads of its own: the disk works while the
// caller computes, and the bytes go from the disk into the caller's buffer, with no page cache
// and no copy. Read through the page cache, the kernel's copy of file pages into the process
// cost a spilled replay more CPU than hashing the same bytes (docs/performance.md, "Checkpoints
// and spilled state"; bench/replay_open1b.sh measures the replay). Threads blocked in pread
// cost no CPU and need no library (io_uring would do the same with liburing and a ring to
// manage).
class DirectReader {
 public:
  // The reads of one range: done when `left` is zero; `error` is the first failure's message.
  struct Request {
    int left = 0;
    std::string error;
  };

  DirectReader() = default;
  DirectReader(const DirectReader&) = delete;
  DirectReader& operator=(const DirectReader&) = delete;
  ~DirectReader();

  // Queues the reads of `to.size()` bytes at `offset` of `file` into `to`, all multiples of
  // kDirectIoAlignment, in transfers of kTransferBytes. The first `need` bytes must be in the
  // file (the rest is padding to whole blocks, which may lie past its end).
  void Read(Request& request, std::shared_ptr<const File> file, uint64_t offset,
            std::span<uint8_t> to, size_t need);
  // Waits until the request's reads are done.
  void Wait(Request& request);
  // Drops the request's queued reads and waits for those under way.
  void Cancel(Request& request);

 private:
  // Two threads, each with one transfer of 8 MiB under way: two sequential streams of direct
  // reads reach a disk's read bandwidth where one stream of smaller reads, or four streams,
  // fall short (`dd` with iflag=direct; docs/performance.md, "Checkpoints and spilled state").
  static constexpr size_t kThreads = 2;
  static constexpr size_t kTransferBytes = size_t{8} << 20;

  struct Job {
    Request* request;
    std::shared_ptr<const File> file;
    uint64_t offset;
    std::span<uint8_t> to;
    size_t need;
  };

  void Work();

  std::mutex mutex_;
  std::condition_variable queued_, done_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;  // started by the first Read
};

}  // namespace lockstep::train
