#include "kdm/kube/node_annotation_writer.h"

#include <nlohmann/json.hpp>

#include "kdm/k8s/devices_annotation.h"
#include "kdm/k8s/names.h"

namespace kdm::kube {
namespace {

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s.substr(0, 64)) {
    out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  }
  return out + (s.size() > 64 ? "...'" : "'");
}

}  // namespace

std::string DevicesAnnotationPatch(const std::string& value) {
  nlohmann::json patch;
  patch["metadata"]["annotations"][std::string(k8s::kDevicesAnnotationKey)] = value;
  // The value is kdm's own JSON (UTF-8); replace rather than throw if it were not.
  return patch.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Status NodeAnnotationWriter::Write(const std::string& node, const std::string& value) {
  // A Node's name is a DNS-1123 subdomain, and all that may go into the URL
  // path unescaped.
  if (!k8s::IsDns1123Subdomain(node)) {
    return InvalidArgumentError("node " + Quote(node) +
                                ": not a DNS-1123 subdomain, not a Node's name");
  }
  Status patched = client_->MergePatch("/api/v1/nodes/" + node, DevicesAnnotationPatch(value),
                                       timeout_, &cancel_);
  if (!patched.ok()) {
    return Status(patched.code(), "node '" + node + "': " + std::string(patched.message()));
  }
  return OkStatus();
}

}  // namespace kdm::kube
