// PodWatch: feeds Assumptions from the API server's view of bound pods
// (docs/extender.md, "Assumed allocations"): a kube::PodInformer on bound,
// non-terminal pods (kube::kBoundPodsPath), so that the extender learns
// every binding, whoever made it, as soon as the API server records it.
//
// A pod counts when it asks extended resources (k8s::EffectiveDeviceRequests
// with every extended resource a device resource, the rule the extender
// scores with). A pod the kubelet would refuse (a request != its limit, a
// fractional count) or whose containers did not read takes no devices: it is
// not assumed. DELETED, and a pod seen terminal or unbound, ends it.
//
// Thread-safety: Start/Stop by the owner; the callbacks run on the
// informer's thread.
#ifndef KDM_SCHEDULER_POD_WATCH_H_
#define KDM_SCHEDULER_POD_WATCH_H_

#include <cstddef>
#include <memory>
#include <optional>

#include "kdm/base/status.h"
#include "kdm/base/sync.h"
#include "kdm/kube/client.h"
#include "kdm/kube/pod_decode.h"
#include "kdm/kube/pod_informer.h"
#include "kdm/scheduler/assumptions.h"

namespace kdm::scheduler {

// The pod as Assumptions takes it; nullopt when it takes no devices here
// (unbound, terminal, no extended resource, refused by the request rules,
// or its containers did not read).
std::optional<BoundPod> BoundPodOf(const kube::PodObject& pod);

class PodWatch {
 public:
  explicit PodWatch(Assumptions* assumptions) : assumptions_(assumptions) {}
  ~PodWatch() { Stop(); }
  PodWatch(const PodWatch&) = delete;
  PodWatch& operator=(const PodWatch&) = delete;

  // Starts the informer on `client` (not owned; must outlive Stop()).
  // `options.client`, the path when empty, and the callbacks are set here.
  Status Start(kube::Client* client, kube::PodInformer::Options options);
  // With the informer's default options.
  Status Start(kube::Client* client) {
    kube::PodInformer::Options options;
    return Start(client, std::move(options));
  }
  void Stop();
  std::optional<kube::PodInformer::Stats> informer_stats() const;
  // True once the first LIST was handed over (Replace); never false again.
  bool synced() const;
  // The pods of the last LIST (bound, non-terminal; 0 before the first).
  size_t listed_pods() const;

  void Replace(const std::vector<kube::PodObject>& pods);
  void Apply(kube::PodEventType type, const kube::PodObject& pod);

 private:
  Assumptions* const assumptions_;
  std::unique_ptr<kube::PodInformer> informer_;
  mutable Mutex mu_;
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  size_t listed_pods_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kdm::scheduler

#endif  // KDM_SCHEDULER_POD_WATCH_H_
