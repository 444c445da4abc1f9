// DirectReader: a queue of block-aligned transfers and the threads that pread them.
#include "train/direct_reader.h"

#include <algorithm>
#include <exception>
#include <utility>

namespace lockstep::train {

DirectReader::~DirectReader() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void DirectReader::Read(Request& request, std::shared_ptr<const File> file, uint64_t offset,
                        std::span<uint8_t> to, size_t need) {
  {
    const std::lock_guard lock(mutex_);
    // Started before anything is queued: a thread that cannot start fails the read here.
    while (threads_.size() < kThreads) threads_.emplace_back([this] { Work(); });
    for (size_t at = 0; at < to.size(); at += kTransferBytes) {
      const size_t bytes = std::min(kTransferBytes, to.size() - at);
      jobs_.push_back({&request, file, offset + at, to.subspan(at, bytes),
                       need > at ? std::min(need - at, bytes) : 0});
      ++request.left;
    }
  }
  queued_.notify_all();
}

void DirectReader::Wait(Request& request) {
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return request.left == 0; });
}

void DirectReader::Cancel(Request& request) {
  std::unique_lock lock(mutex_);
  const auto mine = [&](const Job& job) { return job.request == &request; };
  request.left -= static_cast<int>(std::erase_if(jobs_, mine));
  done_.wait(lock, [&] { return request.left == 0; });
}

void DirectReader::Work() {
  for (;;) {
    std::unique_lock lock(mutex_);
    queued_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;
    const Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    std::string error;
    try {
      const size_t got = job.file->ReadUpTo(job.offset, job.to);
      if (got < job.need) {
        error = fmt::format(
            "{}: ends at byte {}, but {} bytes from byte {} were expected (truncated while "
            "read?)",
            job.file->path().string(), job.offset + got, job.need, job.offset);
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    lock.lock();
    if (!error.empty() && job.request->error.empty()) job.request->error = std::move(error);
    --job.request->left;
    lock.unlock();
    done_.notify_all();
  }
}

}  // namespace lockstep::train
