#include "kdm/kube/publisher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "kdm/base/log_value.h"

namespace kdm::kube {
k8s::DevicesAnnotation BuildDevicesAnnotation(
    const std::string& node, const std::string& updated, const NodeDevices& devices,
    const std::map<std::string, topology::Topology>& topologies,
    const std::map<std::string, k8s::DeviceAttributes>& attributes,
    std::vector<std::string>* warnings, const std::map<std::string, topology::Policy>& policies) {
  k8s::DevicesAnnotation a;
  a.node = node;
  a.updated = updated;
  std::vector<uint64_t> pods;
  pods.reserve(devices.holders.size());
  for (const auto& [ns, name] : devices.holders) pods.push_back(k8s::PodFingerprint(ns, name));
  std::sort(pods.begin(), pods.end());
  pods.erase(std::unique(pods.begin(), pods.end()), pods.end());
  a.pods = std::move(pods);
  std::set<std::string> names;
  for (const auto& [r, _] : devices.allocatable) names.insert(r);
  for (const auto& [r, _] : topologies) names.insert(r);
  for (const auto& [r, _] : attributes) names.insert(r);
  static const std::map<std::string, std::optional<int>> kNone;
  static const std::set<std::string> kNoIds;
  for (const std::string& r : names) {
    k8s::ResourceInput in;
    auto alloc = devices.allocatable.find(r);
    in.allocatable = alloc == devices.allocatable.end() ? kNone : alloc->second;
    auto used = devices.in_use.find(r);
    in.in_use = used == devices.in_use.end() ? kNoIds : used->second;
    auto topo = topologies.find(r);
    in.topology = topo == topologies.end() ? nullptr : &topo->second;
    auto attrs = attributes.find(r);
    if (attrs != attributes.end()) in.attributes = attrs->second;
    std::string warning;
    k8s::ResourceDevices& built = a.resources[r] = k8s::BuildResourceDevices(in, &warning);
    if (auto p = policies.find(r); p != policies.end()) built.policy = p->second;
    if (!warning.empty() && warnings) warnings->push_back(r + ": " + warning);
  }
  return a;
}

Publisher::Publisher(Options options, DeviceSource* source, AnnotationWriter* writer)
    : options_(std::move(options)),
      source_(source),
      writer_(writer),
      clock_(options_.clock ? options_.clock : NewRealClock()) {}

Publisher::StepResult Publisher::Step() {
  StatusOr<NodeDevices> read = source_->Read();
  if (!read.ok()) {
    // Logged when it starts failing and when it recovers, not every poll.
    if (!read_failing_) {
      spdlog::warn("event=publish_read_failed error={}",
                   QuoteLogValue(read.status().message(), kMaxLogValueBytes));
    }
    read_failing_ = true;
    return StepResult::kReadFailed;
  }
  if (read_failing_) spdlog::info("event=publish_read_recovered");
  read_failing_ = false;

  // A --topology for a resource the node does not have (yet: its plugin may
  // register later) is said once and not published, never an empty entry;
  // it is published from the first read that has the resource.
  std::map<std::string, topology::Topology> topologies;
  for (const auto& [resource, topo] : options_.topologies) {
    if (read->allocatable.contains(resource)) {
      topologies.emplace(resource, topo);
      if (missing_topologies_.erase(resource) > 0) {
        spdlog::info("event=publish_topology_resource_appeared resource={}",
                     QuoteLogValue(resource, kMaxLogValueBytes));
      }
    } else if (missing_topologies_.insert(resource).second) {
      spdlog::warn(
          "event=publish_topology_without_resource resource={} detail={}",
          QuoteLogValue(resource, kMaxLogValueBytes),
          QuoteLogValue("--topology names " + resource +
                            ", which the node does not have (is its device plugin registered?); "
                            "not published until it appears",
                        kMaxLogValueBytes));
    }
  }
  std::vector<std::string> warnings;
  k8s::DevicesAnnotation a = BuildDevicesAnnotation(
      options_.node, "", *read, topologies, options_.attributes, &warnings, options_.policies);
  for (const std::string& w : warnings) {
    if (warned_.insert(w).second) {
      spdlog::warn("event=publish_without_matrix detail={}", QuoteLogValue(w, kMaxLogValueBytes));
    }
  }
  std::string content = k8s::EncodeDevicesAnnotation(a);
  const auto now = clock_->Now();
  const bool changed = !last_content_ || *last_content_ != content;
  const bool resync_due = last_success_ && now - *last_success_ >= options_.resync;
  if (!changed && !resync_due) return StepResult::kUnchanged;
  if (last_attempt_ && now - *last_attempt_ < options_.min_write_interval) {
    return StepResult::kRateLimited;
  }
  a.updated = k8s::FormatRfc3339(clock_->WallNow());
  std::string value = k8s::EncodeDevicesAnnotation(a);
  last_attempt_ = now;
  Status s = writer_->Write(options_.node, value);
  if (!s.ok()) {
    ++write_failures_;
    spdlog::log(write_failing_ ? spdlog::level::debug : spdlog::level::warn,
                "event=publish_write_failed node={} error={}",
                QuoteLogValue(options_.node, kMaxLogValueBytes),
                QuoteLogValue(s.message(), kMaxLogValueBytes));
    write_failing_ = true;
    return StepResult::kWriteFailed;
  }
  if (write_failing_) spdlog::info("event=publish_write_recovered failures={}", write_failures_);
  write_failing_ = false;
  ++writes_;
  last_content_ = std::move(content);
  last_written_ = std::move(value);
  last_success_ = now;
  LogWritten(*read, !changed, now);
  return StepResult::kWritten;
}

void Publisher::LogWritten(const NodeDevices& devices, bool resync,
                           std::chrono::steady_clock::time_point now) {
  size_t allocatable = 0, in_use = 0;
  for (const auto& [r, ids] : devices.allocatable) allocatable += ids.size();
  for (const auto& [r, ids] : devices.in_use) in_use += ids.size();
  const std::string node = QuoteLogValue(options_.node, kMaxLogValueBytes);
  if (writes_ == 1) {
    // The one line that says the annotation is there at last.
    spdlog::info("event=first_publish node={} resources={} devices={} in_use={} bytes={}", node,
                 devices.allocatable.size(), allocatable, in_use, last_written_.size());
    return;
  }
  // A write a second at most (min_write_interval): at info a few a minute,
  // the rest at -v, counted in the next info line's suppressed=N.
  const std::optional<int64_t> suppressed = written_log_.Admit("publish_written", now);
  spdlog::log(suppressed ? spdlog::level::info : spdlog::level::debug,
              "event=publish_written node={} resources={} devices={} in_use={} bytes={} resync={} "
              "writes={} suppressed={}",
              node, devices.allocatable.size(), allocatable, in_use, last_written_.size(), resync,
              writes_, suppressed.value_or(0));
}

void Publisher::Run() {
  while (!stop_.woken()) {
    Step();
    if (clock_->SleepFor(options_.interval, stop_)) return;
  }
}

void Publisher::Stop() { stop_.Wake(); }

}  // namespace kdm::kube
