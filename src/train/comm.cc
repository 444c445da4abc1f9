// The solo Comm and, when built with MPI, the MPI one (src/train/comm.h).
#include "train/comm.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <string_view>
#include <thread>
#include <tuple>
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
  Ticket StartGather(std::span<const std::byte> send, int, AtRoot at_root) override {
    at_root(send);
    return 0;
  }
  Ticket StartAllgather(std::span<const std::byte> send, std::span<std::byte> recv) override {
    if (send.size() != recv.size()) {
      LOCKSTEP_INTERNAL("Comm::Allgather: {} bytes sent, {} expected", send.size(), recv.size());
    }
    std::ranges::copy(send, recv.begin());
    return 0;
  }
  void Wait(Ticket) override {}
  bool Done(Ticket) override { return true; }
  void Gather(std::span<const std::byte> send, std::span<std::byte> recv, int) override {
    std::ranges::copy(send, recv.begin());
  }
  void Broadcast(std::span<std::byte>, int) override {}
  void Send(std::span<const std::byte>, int to) override {
    LOCKSTEP_INTERNAL("Comm: send to rank {} in a single-process run", to);
  }
  void Receive(std::span<std::byte>, int from) override {
    LOCKSTEP_INTERNAL("Comm: receive from rank {} in a single-process run", from);
  }
};

#ifdef LOCKSTEP_WITH_MPI

// MPI counts are int: larger transfers go in pieces of this many bytes.
constexpr size_t kMpiPiece = size_t{1} << 30;

// Every MPI call is made by one thread, the exchange's: it runs the transfers in the order they
// were started (every rank starts the same collectives in the same order, so they match), while
// the thread that started them computes. It waits for a transfer by polling MPI_Test, which is
// what moves the transfer on (Open MPI has no progress thread of its own), and sleeps between
// polls so that it takes little of a core the compute needs.
class MpiComm final : public Comm {
 public:
  explicit MpiComm(double timeout_seconds) : timeout_(timeout_seconds) {
    thread_ = std::thread([this] { Run(); });
    Wait(Submit(kAll, 0, [this] { Init(); }));
    watchdog_ = std::thread([this] { Watch(); });
  }
  ~MpiComm() override {
    Submit(kAll, 0, {});  // the thread's last act: MPI_Finalize
    thread_.join();
    stop_ = true;
    watchdog_.join();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Ticket StartGather(std::span<const std::byte> send, int root, AtRoot at_root) override {
    CheckPiece("Gather", send.size());
    const bool here = rank_ == root;
    return Submit(here ? kAll : root, here ? 0 : send.size(),
                  [this, send, root, here, at_root = std::move(at_root)] {
                    received_.resize(here ? send.size() * static_cast<size_t>(size_) : 0);
                    GatherInto(send, received_, root);
                    if (here) at_root(received_);
                  });
  }

  Ticket StartAllgather(std::span<const std::byte> send, std::span<std::byte> recv) override {
    return Submit(kAll, send.size() * static_cast<size_t>(size_ - 1), [this, send, recv] {
      std::vector<int64_t> lengths(static_cast<size_t>(size_));
      const auto mine = static_cast<int64_t>(send.size());
      MPI_Request request;
      Check(MPI_Iallgather(&mine, 1, MPI_INT64_T, lengths.data(), 1, MPI_INT64_T, MPI_COMM_WORLD,
                           &request),
            "MPI_Iallgather");
      Complete(request, "MPI_Iallgather");
      std::vector<int> counts, displacements;
      int64_t total = 0;
      for (const int64_t n : lengths) {
        displacements.push_back(static_cast<int>(total));
        counts.push_back(static_cast<int>(n));
        total += n;
        if (total > INT_MAX) Fail("Comm::Allgather: {} bytes in all (at most {})", total, INT_MAX);
      }
      if (total != static_cast<int64_t>(recv.size())) {
        LOCKSTEP_INTERNAL("Comm::Allgather: the ranks sent {} bytes, the receiver expects {}",
                          total, recv.size());
      }
      Check(
          MPI_Iallgatherv(send.data(), static_cast<int>(send.size()), MPI_BYTE, recv.data(),
                          counts.data(), displacements.data(), MPI_BYTE, MPI_COMM_WORLD, &request),
          "MPI_Iallgatherv");
      Complete(request, "MPI_Iallgatherv");
    });
  }

  void Wait(Ticket ticket) override {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock lock(mutex_);
    finished_cv_.wait(lock, [&] { return finished_ >= ticket; });
    traffic_.waited_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (failure_ && failed_ticket_ <= ticket) std::rethrow_exception(failure_);
  }

  bool Done(Ticket ticket) override {
    std::lock_guard lock(mutex_);
    return finished_ >= ticket;
  }

  void Gather(std::span<const std::byte> send, std::span<std::byte> recv, int root) override {
    CheckPiece("Gather", send.size());
    const bool here = rank_ == root;
    Wait(Submit(here ? kAll : root, here ? 0 : send.size(),
                [this, send, recv, root] { GatherInto(send, recv, root); }));
  }

  void Broadcast(std::span<std::byte> bytes, int root) override {
    const bool here = rank_ == root;
    Wait(Submit(here ? kAll : root, here ? bytes.size() * static_cast<size_t>(size_ - 1) : 0,
                [this, bytes, root] {
                  if (bytes.empty()) return;
                  InPieces(bytes.size(), "MPI_Ibcast", [&](size_t at, int n, MPI_Request* r) {
                    return MPI_Ibcast(bytes.data() + at, n, MPI_BYTE, root, MPI_COMM_WORLD, r);
                  });
                }));
  }

  void Send(std::span<const std::byte> bytes, int to) override {
    Wait(Submit(to, bytes.size(), [this, bytes, to] {
      InPieces(bytes.size(), "MPI_Isend", [&](size_t at, int n, MPI_Request* r) {
        return MPI_Isend(bytes.data() + at, n, MPI_BYTE, to, 0, MPI_COMM_WORLD, r);
      });
    }));
  }

  void Receive(std::span<std::byte> bytes, int from) override {
    Wait(Submit(from, 0, [this, bytes, from] {
      InPieces(bytes.size(), "MPI_Irecv", [&](size_t at, int n, MPI_Request* r) {
        return MPI_Irecv(bytes.data() + at, n, MPI_BYTE, from, 0, MPI_COMM_WORLD, r);
      });
    }));
  }

  Traffic traffic() const override {
    std::lock_guard lock(mutex_);
    return traffic_;
  }

 private:
  static constexpr int kAll = -1;  // a transfer that waits for every other rank

  // A transfer waiting for the thread: `run` makes its MPI calls (empty: the thread's end);
  // `peer` is the rank it waits for, or kAll; `bytes_sent` as Traffic counts them.
  struct Transfer {
    Ticket ticket = 0;
    std::function<void()> run;
    int peer = kAll;
    size_t bytes_sent = 0;
    std::string phase;
  };

  Ticket Submit(int peer, size_t bytes_sent, std::function<void()> run) {
    std::lock_guard lock(mutex_);
    queue_.push_back({++started_, std::move(run), peer, bytes_sent, phase()});
    queued_cv_.notify_one();
    return started_;
  }

  // The exchange's thread: initialises MPI, runs the transfers in order, finalises MPI.
  void Run() {
    KeepThisThreadSerial();  // a transfer's at_root may call kernels: not on the worker pool
    for (;;) {
      Transfer transfer;
      {
        std::unique_lock lock(mutex_);
        queued_cv_.wait(lock, [&] { return !queue_.empty(); });
        transfer = std::move(queue_.front());
        queue_.pop_front();
        if (!transfer.run) break;
        running_ = {transfer.peer, transfer.phase};
        since_.store(std::chrono::steady_clock::now().time_since_epoch().count());
      }
      const auto start = std::chrono::steady_clock::now();
      std::exception_ptr error;
      if (!failure_) {  // after a failure the rest are not run: their Wait fails with it
        try {
          transfer.run();
        } catch (...) {
          error = std::current_exception();
        }
      }
      {
        std::lock_guard lock(mutex_);
        since_.store(0);
        traffic_.seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        traffic_.bytes_sent += transfer.bytes_sent;
        if (error && !failure_) {
          failure_ = error;
          failed_ticket_ = transfer.ticket;
        }
        finished_ = transfer.ticket;
      }
      finished_cv_.notify_all();
    }
    if (initialised_) MPI_Finalize();
  }

  void Init() {
    int provided = 0;
    // This thread is MPI's main thread, the one that calls it.
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      Fail(
          "MPI did not start (MPI_Init_thread failed; Open MPI's message above says why): check "
          "the mpirun command line and the OMPI_MCA_* variables in the environment");
    }
    initialised_ = true;
    if (provided < MPI_THREAD_FUNNELED) {
      Fail(
          "this MPI library gives no thread support (MPI_THREAD_FUNNELED is needed: one thread "
          "of the process calls MPI, beside others): use an MPI built with threads (Debian's "
          "libopenmpi-dev is)");
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // Every rank's host, for the watchdog's message.
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int length = 0;
    MPI_Get_processor_name(name, &length);
    std::vector<char> names(static_cast<size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
    Check(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(),
                        MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD),
          "MPI_Allgather");
    for (int r = 0; r < size_; ++r) {
      hosts_.emplace_back(&names[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]);
    }
  }

  void CheckPiece(const char* call, size_t bytes) const {
    if (bytes > kMpiPiece) {
      LOCKSTEP_INTERNAL("Comm::{}: {} bytes in one piece (at most {})", call, bytes, kMpiPiece);
    }
  }

  void GatherInto(std::span<const std::byte> send, std::span<std::byte> recv, int root) {
    MPI_Request request;
    Check(MPI_Igather(send.data(), static_cast<int>(send.size()), MPI_BYTE, recv.data(),
                      static_cast<int>(send.size()), MPI_BYTE, root, MPI_COMM_WORLD, &request),
          "MPI_Igather");
    Complete(request, "MPI_Igather");
  }

  // A transfer of `size` bytes as calls of at most kMpiPiece bytes each (MPI counts are int), in
  // order, each waited for: start(at, n, &request) starts the call for [at, at + n). Empty, it is
  // one call of 0 bytes (a receiver waits for the sender's message even when it is empty).
  template <typename Start>
  void InPieces(size_t size, const char* call, const Start& start) const {
    size_t at = 0;
    do {
      const size_t n = std::min(kMpiPiece, size - at);
      MPI_Request request;
      Check(start(at, static_cast<int>(n), &request), call);
      Complete(request, call);
      at += n;
    } while (at < size);
  }

  // Polls until `request` is done: at once for a while (a transfer between ranks that are both
  // ready finishes within microseconds), then every kPollSleep, which hands the core to the
  // compute between polls.
  void Complete(MPI_Request& request, const char* call) const {
    static constexpr int kEagerPolls = 200;
    static constexpr auto kPollSleep = std::chrono::microseconds(50);
    for (int polls = 0;; ++polls) {
      int done = 0;
      Check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
      if (done) return;
      if (polls >= kEagerPolls) std::this_thread::sleep_for(kPollSleep);
    }
  }

  void Check(int code, const char* call) const {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    int peer = kAll;
    std::string phase;
    {
      std::lock_guard lock(mutex_);
      std::tie(peer, phase) = running_;
    }
    throw CommFailure(fmt::format(
        "the transfer with {} during {} failed ({}: {}): it died, or the network to it is down "
        "(its own message, if it printed one, says why)",
        Peers(peer), phase, call, std::string(text, length)));
  }

  // A transfer that has waited longer than the timeout means another rank died or hangs: say so
  // and end this process (mpirun then stops the rest), rather than wait forever.
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
        std::pair<int, std::string> running;
        {
          std::lock_guard lock(mutex_);
          running = running_;
        }
        const std::string peers = Peers(running.first);
        std::fprintf(stderr,
                     "lockstep: error: rank %d of %d (%s): waited %.0f s for %s during %s "
                     "(--comm-timeout %.0f): it died or hangs, or the network to it is down; "
                     "stopping\n",
                     rank_, size_, hosts_[static_cast<size_t>(rank_)].c_str(), waited,
                     peers.c_str(), running.second.c_str(), timeout_);
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
  // Set by Init on the exchange's thread, read after the constructor's Wait.
  int rank_ = 0, size_ = 1;
  bool initialised_ = false;
  std::vector<std::string> hosts_;
  std::vector<std::byte> received_;  // StartGather's buffer at the root (the exchange's thread)

  mutable std::mutex mutex_;  // guards what follows but since_ and stop_
  std::condition_variable queued_cv_, finished_cv_;
  std::deque<Transfer> queue_;
  Ticket started_ = 0, finished_ = 0;
  std::exception_ptr failure_;  // the first transfer's that failed, ticket failed_ticket_
  Ticket failed_ticket_ = 0;
  std::pair<int, std::string> running_{kAll, "start-up"};  // the running transfer's peer, phase
  Traffic traffic_;
  std::atomic<int64_t> since_{0};  // when the running transfer started; 0: none runs
  std::atomic<bool> stop_{false};
  std::thread thread_, watchdog_;
};

#endif  // LOCKSTEP_WITH_MPI

bool LaunchedByMpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

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
#else
  if (const int size = LauncherWorldSize(); size > 1) {
    Fail(
        "started as one of {} processes, but this lockstep was built without MPI (lockstep "
        "--version says so): each would train alone into the same run directory; build with "
        "MPI (libopenmpi-dev installed, cmake -DLOCKSTEP_WITH_MPI=ON) or start one process",
        size);
  }
#endif
  return MakeSoloComm();
}

int LauncherWorldSize() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    int size = 0;
    const std::string_view text(value);
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), size);
    if (error != std::errc() || end != text.data() + text.size() || size < 1) {
      Fail("the environment's {}={} is no number of processes", name, text);
    }
    return size;
  }
  return 1;
}

bool MpiBuiltIn() {
#ifdef LOCKSTEP_WITH_MPI
  return true;
#else
  return false;
#endif
}

}  // namespace lockstep::train
