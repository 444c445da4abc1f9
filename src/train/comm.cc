// The solo Comm and, when built with MPI, the MPI one (src/train/comm.h).
#include "train/comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "lockstep/core.h"

#ifdef LOCKSTEP_WITH_MPI
// The C API only (Open MPI would otherwise pull in its deprecated C++ bindings).
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace lockstep::train {
namespace {

class SoloComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void Gather(std::span<const std::byte> send, std::span<std::byte> recv, int) override {
    std::ranges::copy(send, recv.begin());
  }
  void Allgather(std::span<const std::byte> send, std::span<std::byte> recv) override {
    std::ranges::copy(send, recv.begin());
  }
  void Broadcast(std::span<std::byte>, int) override {}
  void Send(std::span<const std::byte>, int to) override {
    Fail("Comm: send to rank {} in a single-process run", to);
  }
  void Receive(std::span<std::byte>, int from) override {
    Fail("Comm: receive from rank {} in a single-process run", from);
  }
};

#ifdef LOCKSTEP_WITH_MPI

// MPI counts are int: larger transfers go in pieces of this many bytes.
constexpr size_t kMpiPiece = size_t{1} << 30;

class MpiComm final : public Comm {
 public:
  explicit MpiComm(double timeout_seconds) : timeout_(timeout_seconds) {
    int provided = 0;
    // Only the main thread calls MPI (the worker pool never does).
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // Every rank's host, for the watchdog's message.
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int length = 0;
    MPI_Get_processor_name(name, &length);
    std::vector<char> names(static_cast<size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
    MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME,
                  MPI_CHAR, MPI_COMM_WORLD);
    for (int r = 0; r < size_; ++r) {
      hosts_.emplace_back(&names[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]);
    }
    watchdog_ = std::thread([this] { Watch(); });
  }
  ~MpiComm() override {
    stop_ = true;
    watchdog_.join();
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void Gather(std::span<const std::byte> send, std::span<std::byte> recv, int root) override {
    if (send.size() > kMpiPiece) Fail("Comm::Gather: {} bytes (at most {})", send.size(), kMpiPiece);
    const Waiting waiting(this, rank_ == root ? 0 : send.size(), rank_ == root ? kAll : root);
    Check(MPI_Gather(send.data(), static_cast<int>(send.size()), MPI_BYTE, recv.data(),
                     static_cast<int>(send.size()), MPI_BYTE, root, MPI_COMM_WORLD),
          "MPI_Gather");
  }

  void Allgather(std::span<const std::byte> send, std::span<std::byte> recv) override {
    const Waiting waiting(this, send.size() * static_cast<size_t>(size_ - 1), kAll);
    std::vector<int64_t> lengths(static_cast<size_t>(size_));
    const auto mine = static_cast<int64_t>(send.size());
    Check(MPI_Allgather(&mine, 1, MPI_INT64_T, lengths.data(), 1, MPI_INT64_T, MPI_COMM_WORLD),
          "MPI_Allgather");
    std::vector<int> counts, displacements;
    int64_t total = 0;
    for (const int64_t n : lengths) {
      displacements.push_back(static_cast<int>(total));
      counts.push_back(static_cast<int>(n));
      total += n;
      if (total > INT_MAX) Fail("Comm::Allgather: {} bytes in all (at most {})", total, INT_MAX);
    }
    if (total != static_cast<int64_t>(recv.size())) {
      Fail("Comm::Allgather: the ranks sent {} bytes, the receiver expects {}", total, recv.size());
    }
    Check(MPI_Allgatherv(send.data(), static_cast<int>(send.size()), MPI_BYTE, recv.data(),
                         counts.data(), displacements.data(), MPI_BYTE, MPI_COMM_WORLD),
          "MPI_Allgatherv");
  }

  void Broadcast(std::span<std::byte> bytes, int root) override {
    const Waiting waiting(this, rank_ == root ? bytes.size() * static_cast<size_t>(size_ - 1) : 0,
                          rank_ == root ? kAll : root);
    for (size_t at = 0; at < bytes.size(); at += kMpiPiece) {
      const size_t n = std::min(kMpiPiece, bytes.size() - at);
      Check(MPI_Bcast(bytes.data() + at, static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD),
            "MPI_Bcast");
    }
  }

  void Send(std::span<const std::byte> bytes, int to) override {
    const Waiting waiting(this, bytes.size(), to);
    for (size_t at = 0; at < bytes.size() || at == 0; at += kMpiPiece) {
      const size_t n = std::min(kMpiPiece, bytes.size() - at);
      Check(MPI_Send(bytes.data() + at, static_cast<int>(n), MPI_BYTE, to, 0, MPI_COMM_WORLD),
            "MPI_Send");
      if (bytes.empty()) break;
    }
  }

  void Receive(std::span<std::byte> bytes, int from) override {
    const Waiting waiting(this, 0, from);
    for (size_t at = 0; at < bytes.size() || at == 0; at += kMpiPiece) {
      const size_t n = std::min(kMpiPiece, bytes.size() - at);
      MPI_Status status;
      Check(MPI_Recv(bytes.data() + at, static_cast<int>(n), MPI_BYTE, from, 0, MPI_COMM_WORLD,
                     &status),
            "MPI_Recv");
      if (bytes.empty()) break;
    }
  }

 private:
  // Marks the span of one blocking call for the watchdog, and counts its time and the bytes
  // this rank sends in it (as the ring or tree inside MPI may differ, the bytes are those a
  // direct exchange would send: a broadcast root's to every other rank, and so on).
  static constexpr int kAll = -1;  // a collective that waits for every other rank
  class Waiting {
   public:
    // `peer`: the rank the call waits for, or kAll.
    Waiting(MpiComm* comm, size_t bytes_sent, int peer)
        : comm_(comm), start_(std::chrono::steady_clock::now()) {
      comm_->peer_.store(peer);
      comm_->since_.store(start_.time_since_epoch().count());
      comm_->traffic_.bytes_sent += bytes_sent;
    }
    ~Waiting() {
      comm_->since_.store(0);
      comm_->traffic_.seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }

   private:
    MpiComm* comm_;
    std::chrono::steady_clock::time_point start_;
  };

  void Check(int code, const char* call) const {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    Fail("rank {}: {} failed during {}: {}", rank_, call, phase(), std::string(text, length));
  }

  // A blocking call that has waited longer than the timeout means another rank died or hangs:
  // say so and end this process (mpirun then stops the rest), rather than wait forever.
  void Watch() {
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const int64_t since = since_.load();
      if (since == 0) continue;
      const double waited = std::chrono::duration<double>(
                                std::chrono::steady_clock::now().time_since_epoch() -
                                std::chrono::steady_clock::duration(since))
                                .count();
      if (waited > timeout_) {
        const std::string peers = Peers(peer_.load());
        std::fprintf(stderr,
                     "lockstep: error: rank %d of %d (%s): waited %.0f s for %s during %s "
                     "(--comm-timeout %.0f): it died or hangs, or the network to it is down; "
                     "stopping\n",
                     rank_, size_, hosts_[static_cast<size_t>(rank_)].c_str(), waited,
                     peers.c_str(), phase().c_str(), timeout_);
        std::fflush(stderr);
        std::_Exit(3);
      }
    }
  }

  // "rank R (HOST)" for one peer; with kAll, every other rank ("rank 1 (HOST)" when there is
  // one, else "the other ranks (R on HOST, ...)").
  std::string Peers(int peer) const {
    const auto one = [&](int r) {
      return fmt::format("rank {} ({})", r, hosts_[static_cast<size_t>(r)]);
    };
    if (peer != kAll) return one(peer);
    if (size_ == 2) return one(1 - rank_);
    std::vector<std::string> others;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) others.push_back(fmt::format("{} on {}", r, hosts_[static_cast<size_t>(r)]));
    }
    return fmt::format("the other ranks ({})", fmt::join(others, ", "));
  }

  double timeout_;
  int rank_ = 0, size_ = 1;
  std::vector<std::string> hosts_;
  std::atomic<int> peer_{kAll};
  std::atomic<int64_t> since_{0};
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

bool LaunchedByMpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

#endif  // LOCKSTEP_WITH_MPI

}  // namespace

std::vector<std::string> AllgatherStrings(Comm& comm, const std::string& mine) {
  const auto n = static_cast<size_t>(comm.size());
  std::vector<uint64_t> lengths(n);
  const uint64_t length = mine.size();
  comm.Allgather(std::as_bytes(std::span(&length, 1)), std::as_writable_bytes(std::span(lengths)));
  uint64_t total = 0;
  for (const uint64_t l : lengths) total += l;
  std::string all(total, '\0');
  comm.Allgather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)));
  std::vector<std::string> strings;
  for (size_t r = 0, at = 0; r < n; at += lengths[r], ++r) strings.push_back(all.substr(at, lengths[r]));
  return strings;
}

void AgreeOrFail(Comm& comm, const std::function<void()>& check) {
  if (comm.size() == 1) {
    check();
    return;
  }
  std::string error;
  try {
    check();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "failed";
  }
  const std::vector<std::string> errors = AllgatherStrings(comm, error);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    if (static_cast<int>(r) == comm.rank()) Fail("{}", errors[r]);
    Fail("stopped with rank {}, which refused: {}", r, errors[r]);
  }
}

void RequireSameOnEveryRank(Comm& comm,
                            const std::vector<std::pair<std::string, std::string>>& fields) {
  if (comm.size() == 1) return;
  for (const auto& [name, value] : fields) {
    const std::vector<std::string> values = AllgatherStrings(comm, value);
    for (size_t r = 1; r < values.size(); ++r) {
      if (values[r] == values[0]) continue;
      const auto shown = [](const std::string& v) {
        return v.size() <= 200 ? v : v.substr(0, 200) + "...";
      };
      Fail("rank {} was started with another {} than rank 0: every rank must run the same job\n"
           "  rank 0: {}\n  rank {}: {}",
           r, name, shown(values[0]), r, shown(values[r]));
    }
  }
}

std::unique_ptr<Comm> MakeSoloComm() { return std::make_unique<SoloComm>(); }

std::unique_ptr<Comm> MakeWorldComm(double timeout_seconds) {
  if (!(timeout_seconds > 0)) Fail("--comm-timeout = {} (must be > 0 seconds)", timeout_seconds);
#ifdef LOCKSTEP_WITH_MPI
  if (LaunchedByMpi()) return std::make_unique<MpiComm>(timeout_seconds);
#endif
  return MakeSoloComm();
}

bool MpiBuiltIn() {
#ifdef LOCKSTEP_WITH_MPI
  return true;
#else
  return false;
#endif
}

}  // namespace lockstep::train
