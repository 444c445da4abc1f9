// Data parallelism's one small interface (DESIGN.md: "data parallelism over MPI lives here,
// behind one small interface"). Collectives move bytes; they never add floats for us: MPI_SUM
// may combine in any order, so every float sum of a distributed step happens in lockstep's own
// code, in the order docs/distributed.md gives.
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

namespace lockstep::train {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's `send` (all of one length) concatenated in rank order into `recv` at `root`
  // (recv has size() * send.size() bytes there; it is not touched elsewhere).
  virtual void Gather(std::span<const std::byte> send, std::span<std::byte> recv, int root) = 0;
  // Every rank's `send` (lengths may differ) concatenated in rank order into `recv` everywhere;
  // recv.size() must be the sum of the lengths.
  virtual void Allgather(std::span<const std::byte> send, std::span<std::byte> recv) = 0;
  // `bytes` of `root` copied into `bytes` of every other rank.
  virtual void Broadcast(std::span<std::byte> bytes, int root) = 0;
  // Point to point, for the checkpoint writer's requests (rank 0 asks an owner for a piece).
  virtual void Send(std::span<const std::byte> bytes, int to) = 0;
  virtual void Receive(std::span<std::byte> bytes, int from) = 0;
  // Time spent in blocking exchanges and bytes this rank sent, since the start (for metrics).
  struct Traffic {
    double seconds = 0;
    uint64_t bytes_sent = 0;
  };
  Traffic traffic() const { return traffic_; }

  // What the process is doing, for the message of a collective that waits too long.
  // (Read by the watchdog thread, hence the lock.)
  void set_phase(std::string phase) {
    std::lock_guard lock(phase_mutex_);
    phase_ = std::move(phase);
  }
  std::string phase() const {
    std::lock_guard lock(phase_mutex_);
    return phase_;
  }

 protected:
  Traffic traffic_;

 private:
  mutable std::mutex phase_mutex_;
  std::string phase_ = "start-up";
};

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
// makes mpirun stop the others.
std::unique_ptr<Comm> MakeWorldComm(double timeout_seconds);

// Whether this binary was built with MPI (cmake -DLOCKSTEP_WITH_MPI=ON, the default).
bool MpiBuiltIn();

}  // namespace lockstep::train
