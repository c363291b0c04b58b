#include "kdm/scheduler/pod_watch.h"

#include <utility>

#include "kdm/k8s/names.h"
#include "kdm/k8s/pod.h"

namespace kdm::scheduler {

std::optional<BoundPod> BoundPodOf(const kube::PodObject& pod) {
  if (pod.node_name.empty() || pod.phase == "Succeeded" || pod.phase == "Failed") {
    return std::nullopt;
  }
  if (!pod.error.empty()) return std::nullopt;
  StatusOr<std::map<std::string, int64_t>> requests = k8s::EffectiveDeviceRequests(
      pod.pod, [](const std::string& r) { return k8s::IsExtendedResourceName(r); });
  if (!requests.ok() || requests->empty()) return std::nullopt;
  BoundPod out{.uid = pod.uid,
               .namespace_name = pod.namespace_name,
               .name = pod.name,
               .node = pod.node_name,
               .requests = std::move(*requests)};
  return out;
}

Status PodWatch::Start(kube::Client* client, kube::PodInformer::Options options) {
  options.client = client;
  options.on_list = [this](std::vector<kube::PodObject> pods) { Replace(pods); };
  options.on_event = [this](kube::PodEventType type, const kube::PodObject& pod) {
    Apply(type, pod);
  };
  KDM_ASSIGN_OR_RETURN(informer_, kube::PodInformer::Start(std::move(options)));
  return OkStatus();
}

void PodWatch::Stop() {
  if (informer_) informer_->Stop();
}

std::optional<kube::PodInformer::Stats> PodWatch::informer_stats() const {
  if (!informer_) return std::nullopt;
  return informer_->stats();
}

void PodWatch::Replace(const std::vector<kube::PodObject>& pods) {
  std::vector<BoundPod> bound;
  bound.reserve(pods.size());
  for (const kube::PodObject& p : pods) {
    if (std::optional<BoundPod> b = BoundPodOf(p)) bound.push_back(std::move(*b));
  }
  assumptions_->ReplaceBound(bound);
  MutexLock lock(&mu_);
  listed_pods_ = pods.size();
  synced_ = true;
}

bool PodWatch::synced() const {
  MutexLock lock(&mu_);
  return synced_;
}

size_t PodWatch::listed_pods() const {
  MutexLock lock(&mu_);
  return listed_pods_;
}

void PodWatch::Apply(kube::PodEventType type, const kube::PodObject& pod) {
  if (type == kube::PodEventType::kDeleted) {
    assumptions_->Gone(pod.uid);
    return;
  }
  if (std::optional<BoundPod> b = BoundPodOf(pod)) {
    assumptions_->Bound(*b, Assumptions::Source::kWatch);
  } else {
    assumptions_->Gone(pod.uid);
  }
}

}  // namespace kdm::scheduler
