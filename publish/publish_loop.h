// publish::PublishLoop: kube::Publisher on a thread of its own, writing the
// kdm.io/devices annotation through kube::NodeAnnotationWriter and a
// kube::Client (docs/publish.md). The owner of the thread: Stop() (or the
// destructor) stops the publisher and joins it. A value over the API
// server's bound on annotations (k8s::kMaxAnnotationBytes) is never sent:
// the write fails without a request, is logged and counted.
//
// Thread-safety: Start and Stop from the owner's thread.
//
// Example:
//   publish::PublishOptions o;  o.node = "gpu-node-7";  o.topologies = ...;
//   auto loop = publish::PublishLoop::Start(std::move(o), std::move(source), std::move(client));
//   WaitForSignal();
//   loop->Stop();
#ifndef KDM_PUBLISH_PUBLISH_LOOP_H_
#define KDM_PUBLISH_PUBLISH_LOOP_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "kdm/k8s/attributes.h"
#include "kdm/kube/client.h"
#include "kdm/kube/node_annotation_writer.h"
#include "kdm/kube/publisher.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/topology.h"

namespace kdm::publish {

// Everything the loop runs with (checked by the caller).
struct PublishOptions {
  std::string node;
  // Resource -> its topology, device ids already the node's (ApplyIdsFile).
  std::map<std::string, topology::Topology> topologies;
  std::map<std::string, k8s::DeviceAttributes> attributes;
  // Resource -> its device plugin's policy (--plugin-policy).
  std::map<std::string, topology::Policy> policies;
  std::chrono::milliseconds interval{1000};
  std::chrono::milliseconds min_write_interval{1000};
  std::chrono::milliseconds resync{300'000};
  // Deadline of each write to the API server.
  std::chrono::milliseconds timeout{5000};
};

class PublishLoop {
 public:
  // Starts the thread, reading `source` and writing through `client`.
  // REQUIRES: source and client not null.
  static std::unique_ptr<PublishLoop> Start(PublishOptions options,
                                            std::unique_ptr<kube::DeviceSource> source,
                                            std::unique_ptr<kube::Client> client);
  ~PublishLoop();
  PublishLoop(const PublishLoop&) = delete;
  PublishLoop& operator=(const PublishLoop&) = delete;

  // Stops the loop and joins its thread: a write in flight is cancelled
  // (NodeAnnotationWriter::Cancel), a read of the source in flight is waited
  // for (bounded by its deadline). Idempotent; from the owner's thread.
  void Stop();

  // Values never sent because they were over k8s::kMaxAnnotationBytes (each
  // logged as event=publish_annotation_too_large). Any thread.
  uint64_t annotations_too_large() const;

 private:
  class SizeCheckingWriter;
  PublishLoop() = default;
  std::unique_ptr<kube::Client> client_;
  std::unique_ptr<kube::NodeAnnotationWriter> writer_;
  std::unique_ptr<SizeCheckingWriter> checked_writer_;
  std::unique_ptr<kube::DeviceSource> source_;
  std::unique_ptr<kube::Publisher> publisher_;
  std::thread thread_;
};

}  // namespace kdm::publish

#endif  // KDM_PUBLISH_PUBLISH_LOOP_H_
