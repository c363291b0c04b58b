// kdm::kube::NodeAnnotationWriter: the AnnotationWriter that stores the
// kdm.io/devices annotation on a Node object of the API server. Each Write
// is one JSON merge patch of /api/v1/nodes/<node>,
//   {"metadata":{"annotations":{"kdm.io/devices":"<value>"}}}
// sent through Client::MergePatch with the writer's deadline (its retries on
// 409/429/5xx included). Other annotations and fields of the Node are left
// as they are. See docs/publish.md ("Writing to the API server").
//
// Errors: INVALID_ARGUMENT for a node name that is not a DNS-1123 subdomain
// (it becomes part of the URL path, so nothing else is sent); otherwise the
// client's error, prefixed with the node: "node 'n1': ... 404 ...".
//
// Thread-safety: Write may be called from any thread; the Client is.
//
// Example:
//   kdm::kube::NodeAnnotationWriter writer(client.get(), std::chrono::seconds(5));
//   kdm::kube::Publisher p(options, &source, &writer, kdm::kube::RealPublishClock());
#ifndef KDM_KUBE_NODE_ANNOTATION_WRITER_H_
#define KDM_KUBE_NODE_ANNOTATION_WRITER_H_

#include <chrono>
#include <string>

#include "kdm/base/status.h"
#include "kdm/kube/client.h"
#include "kdm/kube/publisher.h"

namespace kdm::kube {

// The merge patch that sets the kdm.io/devices annotation to `value`.
std::string DevicesAnnotationPatch(const std::string& value);

class NodeAnnotationWriter final : public AnnotationWriter {
 public:
  // REQUIRES: `client` outlives the writer. `timeout` bounds each Write,
  // retries included.
  NodeAnnotationWriter(Client* client, std::chrono::milliseconds timeout)
      : client_(client), timeout_(timeout) {}

  Status Write(const std::string& node, const std::string& value) override;

  // Ends a Write in flight at once (it fails with CANCELLED, its retries
  // too) and fails every later one: a stop does not wait for a slow or hung
  // API server. Thread-safe; sticky.
  void Cancel() { cancel_.Cancel(); }

 private:
  Client* const client_;
  const std::chrono::milliseconds timeout_;
  Cancellation cancel_;
};

}  // namespace kdm::kube

#endif  // KDM_KUBE_NODE_ANNOTATION_WRITER_H_
