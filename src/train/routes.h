// How a microbatch group's forward and backward reach the state: the route the Model's
// TensorAccess takes to the parameters it reads and the gradients it writes, chosen once per
// round of a step (docs/architecture.md, "Where state lives during a step"). Every route gives
// the bits of the one-process step in RAM.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "lockstep/kernels.h"
#include "lockstep/model.h"
#include "train/exchange.h"
#include "train/state_store.h"

namespace lockstep::train {

class GroupRoute : public TensorAccess {
 public:
  // After the group's last microbatch: every transfer done and every piece released, so the
  // group's gradients are where the step's fold (Trainer::FoldRound) or the global norm finds
  // them. `squares` (one entry per tensor) receives the block squares of each gradient the route
  // summed as the Model closed it (rk::BlockSquares); the rest are left as they are.
  virtual void Finish(std::vector<std::vector<double>>& squares) = 0;
};

// What the routes are built from; the references outlive the route.
struct RouteParts {
  StateStore& store;
  const Exchange& exchange;
  bool sharded = false;         // the store holds this rank's range of the parameters only
  ParamStore* group = nullptr;  // the group buffer (null when the run has none)
  OpExecutor* executor = nullptr;
  // Full sharding: per tensor, the owners' parameter chunk digests of the last step (empty after
  // a restore), which the gathered parameters are checked against.
  const std::vector<std::vector<Digest>>& param_chunks;
};

// The route of round `round` of `rounds` in step `step`:
// - one process, its first round: the store itself, the microbatches accumulating in place;
//   spilled and in one round, the gradients' block squares summed as the Model closes them (the
//   norm then need not read them back from disk);
// - full sharding: each parameter gathered from its owners as the Model opens it, each gradient
//   sent to its owners as it closes it (docs/distributed.md, "Full sharding"); with
//   `corrupt_copy` (a test fault) this rank's check of the gathered copies sees one corrupted;
// - otherwise the parameters from the store, the gradients into the group buffer.
std::unique_ptr<GroupRoute> MakeGroupRoute(const RouteParts& parts, int64_t round, int64_t rounds,
                                           uint64_t step, bool corrupt_copy);

}  // namespace lockstep::train
