#include "kdm/kube/node_annotation_writer.h"

#include <nlohmann/json.hpp>

#include "kdm/kube/annotation.h"

namespace kdm::kube {
namespace {

// A DNS-1123 subdomain: what a Node's name is, and all that may go into the
// URL path unescaped.
bool IsNodeName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  size_t label_start = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == '.') {
      if (i == label_start || name[label_start] == '-' || name[i - 1] == '-') return false;
      label_start = i + 1;
      continue;
    }
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

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
  patch["metadata"]["annotations"][std::string(kDevicesAnnotationKey)] = value;
  // The value is kdm's own JSON (UTF-8); replace rather than throw if it were not.
  return patch.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Status NodeAnnotationWriter::Write(const std::string& node, const std::string& value) {
  if (!IsNodeName(node)) {
    return InvalidArgumentError("node " + Quote(node) +
                                ": not a DNS-1123 subdomain, not a Node's name");
  }
  StatusOr<std::string> patched =
      client_->MergePatch("/api/v1/nodes/" + node, DevicesAnnotationPatch(value), timeout_);
  if (!patched.ok()) {
    return Status(patched.status().code(), "node '" + node + "': " + patched.status().message());
  }
  return OkStatus();
}

}  // namespace kdm::kube
