// kdm::sim: a simulation of kube-scheduler placing GPU pods through
// `kdm extender` (issue 29, item 4), every part but the scheduler loop a
// real process: six nodes, each a `kdm kubelet --publish` with a
// `kdm plugin` (3 x dgx1-v100, 2 x pcie-8gpu, 1 x hgx-h100: the clearly best
// node), default publish settings, annotating their Nodes in a FakeCluster
// (test/kube/fake_cluster.h); `kdm extender --kubeconfig` keeps its node
// cache from it and is asked with NodeNames (nodeCacheCapable).
//
// The loop does what kube-scheduler does with an extender: serial cycles,
// each POSTs /filter then /prioritize with the full Pod and picks the
// highest extender score among the nodes that passed (ties: seeded
// random), then hands the Binding to an asynchronous binder (a small
// thread pool POSTing pods/binding over HTTPS, as the default binder) and
// starts the next cycle at once or at a given rate. The kubelets learn
// their pods from the API server's bindings (FakeCluster::on_bound): the
// manifest is written in binding order, with the pod's uid.
//
// Bursts of 1-, 2- and 4-GPU pods (seeded) ask about 70 % of the free
// GPUs; after each, every pod's admission (R/status) is read, the pods are
// deleted and the run waits until the nodes publish them free again.
// Regret: each decision is replayed on the true committed free sets (the
// devices the status files say earlier pods got) and scored with kdm's
// Scorer on every node that fits; a pod on a node below the best, a
// rejected pod and an unplaced pod are regrets.
//
// Thread-safety: a Cluster is used from one thread at a time.
//
// Example:
//   auto cluster = sim::Cluster::Start({.kdm_binary = KdmBinary()});
//   KDM_RETURN_IF_ERROR((*cluster)->StartExtender("best-set", {}));
//   StatusOr<sim::Results> r = (*cluster)->Run({.bursts = 2, .partly_busy = true});
#ifndef KDM_TEST_SIM_SCHEDULING_SIM_H_
#define KDM_TEST_SIM_SCHEDULING_SIM_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kdm/base/status.h"

namespace kdm::sim {

struct ClusterOptions {
  // The kdm binary to run.
  std::string kdm_binary;
  // A short fresh directory (Unix socket paths live under it); "" makes one
  // under $TMPDIR (removed by the destructor).
  std::string root;
  // Bound of every wait (publishing, admission).
  std::chrono::milliseconds wait_bound{30'000};
};

struct ScenarioOptions {
  int bursts = 2;
  int pods_per_burst = 18;
  // Of the free GPUs at the burst's start.
  double burst_fraction = 0.7;
  // Scheduling cycles per second; 0: the loop's full speed.
  double rate_per_second = 0;
  // Before the bursts, a fixed seeded set of pods placed directly (bound
  // and admitted), kept for the scenario.
  bool partly_busy = false;
  // Also apply the scheduler's own GPU count (NodeResourcesFit with the
  // loop's assumed pods).
  bool scheduler_gpu_count = false;
  uint64_t seed = 29;
  int binder_threads = 4;
  // Bind through the extender (kube-scheduler's bindVerb: POST /bind, which
  // posts the Binding itself) instead of the default binder.
  bool bind_through_extender = false;
};

struct Results {
  int pods = 0;
  int rejections = 0;  // Rejected at admission
  int unplaced = 0;    // no node passed the filter, or the bind failed
  int regrets = 0;     // below the best, rejected, or unplaced
  double regret_percent = 0;
  double decision_ms_mean = 0;
  double decision_ms_p99 = 0;
  // Every rejection's reason/message, and each regret, one line each.
  std::vector<std::string> notes;
  // "pods=36 rejections=0 regret=2.8% (1) unplaced=0 decision_ms=1.2/3.4"
  std::string Summary() const;
};

class Cluster {
 public:
  // Starts the fake API server and the six nodes, and waits until every
  // node has published its devices. Errors name the step and the process.
  static StatusOr<std::unique_ptr<Cluster>> Start(ClusterOptions options);
  virtual ~Cluster() = default;

  // (Re)starts `kdm extender --listen 127.0.0.1:0 --kubeconfig K --policy
  // POLICY EXTRA...` and waits until it answers from a full node cache.
  virtual Status StartExtender(const std::string& policy,
                               const std::vector<std::string>& extra_args) = 0;
  // The extender's log so far ("" before one started).
  virtual std::string ExtenderLog() const = 0;
  // True when this kdm's `extender --help` lists `flag`.
  virtual bool ExtenderHasFlag(const std::string& flag) = 0;

  // One scenario with the running extender; the cluster is back to all
  // free afterwards (partly-busy pods removed too).
  virtual StatusOr<Results> Run(const ScenarioOptions& options) = 0;
};

}  // namespace kdm::sim

#endif  // KDM_TEST_SIM_SCHEDULING_SIM_H_
