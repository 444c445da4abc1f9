// Data parallelism's one small interface: only comm.cc calls MPI (docs/architecture.md, "Where
// the state lives"; docs/distributed.md). Collectives move bytes; they never add floats for us:
// MPI_SUM may combine in any order, so every float sum of a distributed step happens in
// lockstep's own code, in the order docs/distributed.md gives.
#pragma once

#include <cstddef>
#include <functional>
#include <utility>
#include <vector>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "lockstep/core.h"

namespace lockstep::train {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Transfers run one at a time in the order they are started, on every rank, so that every
  // rank's n-th transfer is the same collective. A Start* call returns at once with a ticket;
  // Wait(ticket) returns when that transfer and every one started before it have finished, or
  // fails with the first failure among them. What a transfer reads or writes stays valid, and
  // untouched by the caller, until its ticket is waited for. The other calls wait for their own
  // transfer. With MPI the transfers run on the exchange's own thread, beside the compute.
  using Ticket = uint64_t;
  // Every rank's `send` (all of one length) concatenated in rank order and given to `at_root` at
  // `root`, valid during that call only. `at_root` runs on the thread that transfers, beside the
  // caller's work: it may touch only what the caller leaves alone until the ticket is waited for
  // (views into RAM, not an OpExecutor), and its ParallelFor loops run inline.
  using AtRoot = std::function<void(std::span<const std::byte> all)>;
  virtual Ticket StartGather(std::span<const std::byte> send, int root, AtRoot at_root) = 0;
  // Every rank's `send` (lengths may differ) concatenated in rank order into `recv` everywhere;
  // recv.size() must be the sum of the lengths.
  virtual Ticket StartAllgather(std::span<const std::byte> send, std::span<std::byte> recv) = 0;
  virtual void Wait(Ticket ticket) = 0;
  // Whether Wait(ticket) would return at once.
  virtual bool Done(Ticket ticket) = 0;

  void Allgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    Wait(StartAllgather(send, recv));
  }
  // Every rank's `send` (all of one length) concatenated in rank order into `recv` at `root`
  // (recv has size() * send.size() bytes there; it is not touched elsewhere).
  virtual void Gather(std::span<const std::byte> send, std::span<std::byte> recv, int root) = 0;
  // `bytes` of `root` copied into `bytes` of every other rank.
  virtual void Broadcast(std::span<std::byte> bytes, int root) = 0;
  // Point to point, for the checkpoint writer's requests (rank 0 asks an owner for a piece).
  virtual void Send(std::span<const std::byte> bytes, int to) = 0;
  virtual void Receive(std::span<std::byte> bytes, int from) = 0;

  // Since the start: the seconds transfers ran (`seconds`), the seconds the caller spent waiting
  // for them (`waited_seconds`, at most `seconds`: the rest ran while the caller computed), and
  // the bytes this rank sent (those a direct exchange would send: a broadcast root's to every
  // other rank, and so on, whatever ring or tree MPI uses).
  struct Traffic {
    double seconds = 0, waited_seconds = 0;
    uint64_t bytes_sent = 0;
  };
  virtual Traffic traffic() const { return {}; }

  // What the process is doing, for the message of a transfer that waits too long: each transfer
  // keeps the phase it was started in. (Read by other threads, hence the lock.)
  void set_phase(std::string phase) {
    std::lock_guard lock(phase_mutex_);
    phase_ = std::move(phase);
  }
  std::string phase() const {
    std::lock_guard lock(phase_mutex_);
    return phase_;
  }

 private:
  mutable std::mutex phase_mutex_;
  std::string phase_ = "start-up";
};

// A transfer that failed (a rank died, the network to it is down): not the input's fault, so
// `lockstep train` exits 3, as when a transfer waits past the timeout.
class CommFailure : public Error {
 public:
  using Error::Error;
};
inline constexpr int kCommFailureExit = 3;

// One process: every collective is a copy.
std::unique_ptr<Comm> MakeSoloComm();

// Every rank's `mine`, in rank order, on every rank.
std::vector<std::string> AllgatherStrings(Comm& comm, const std::string& mine);
// Runs `check` on this rank, then every rank reaches one verdict: when any rank's check failed,
// every rank fails with the first failing rank's message, naming that rank. So a refusal that one
// rank makes (rank 0's of its run directory, a rank's of its own --data) stops every rank at once,
// instead of leaving the others waiting in their next collective until --comm-timeout.
void AgreeOrFail(Comm& comm, const std::function<void()>& check);
// Fails on every rank unless every rank passed the same value of every field (name, value),
// naming the first rank and field that differ from rank 0's.
void RequireSameOnEveryRank(Comm& comm,
                            const std::vector<std::pair<std::string, std::string>>& fields);

// The world of this process: MPI's COMM_WORLD when the process was started by mpirun or srun
// (OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_SIZE in the environment), a solo Comm otherwise. A
// collective that waits more than `timeout_seconds` for the other ranks (one died or hangs)
// prints an error naming this rank and the phase, then ends the process with exit code 3, which
// makes mpirun stop the others; a transfer that fails throws CommFailure. Transfers run on a
// thread of their own, the only one that calls MPI; the caller computes while they run. A binary
// built without MPI refuses to start as one of several processes (LauncherWorldSize > 1): each
// would train alone into the same run directory.
std::unique_ptr<Comm> MakeWorldComm(double timeout_seconds);

// The number of processes a launcher started this one among, from the environment
// (OMPI_COMM_WORLD_SIZE, else PMI_SIZE); 1 when neither is set. An unreadable value fails.
int LauncherWorldSize();

// Whether this binary was built with MPI (cmake -DLOCKSTEP_WITH_MPI=ON, the default).
bool MpiBuiltIn();

}  // namespace lockstep::train
