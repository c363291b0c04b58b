#include "kdm/kube/binding.h"

#include <nlohmann/json.hpp>

#include "kdm/base/log_value.h"
#include "kdm/k8s/names.h"

namespace kdm::kube {
namespace {

constexpr size_t kQuotedNameBytes = 80;

Status BadBindingName(const char* field, const std::string& value, const char* rule) {
  return InvalidArgumentError("binding: " + std::string(field) + " " +
                              QuoteLogValue(value, kQuotedNameBytes) + " is not " + rule);
}

Status CheckBinding(const Binding& b) {
  if (!k8s::IsDns1123Label(b.namespace_name)) {
    return BadBindingName("namespace", b.namespace_name, "a DNS-1123 label");
  }
  if (!k8s::IsDns1123Subdomain(b.name)) {
    return BadBindingName("pod name", b.name, "a DNS-1123 subdomain");
  }
  if (!k8s::IsDns1123Subdomain(b.node)) {
    return BadBindingName("node", b.node, "a DNS-1123 subdomain");
  }
  if (b.uid.size() > kMaxBindingUidBytes) {
    return InvalidArgumentError("binding: uid is " + std::to_string(b.uid.size()) +
                                " bytes, more than " + std::to_string(kMaxBindingUidBytes));
  }
  for (char c : b.uid) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      return InvalidArgumentError("binding: uid " + QuoteLogValue(b.uid, kQuotedNameBytes) +
                                  " has a control character");
    }
  }
  return OkStatus();
}

}  // namespace

std::string BindingPath(const Binding& b) {
  return "/api/v1/namespaces/" + b.namespace_name + "/pods/" + b.name + "/binding";
}

std::string BindingBody(const Binding& b) {
  nlohmann::ordered_json metadata = {{"name", b.name}, {"namespace", b.namespace_name}};
  if (!b.uid.empty()) metadata["uid"] = b.uid;
  nlohmann::ordered_json body = {
      {"apiVersion", "v1"},
      {"kind", "Binding"},
      {"metadata", std::move(metadata)},
      {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", b.node}}}};
  // A uid is any text: never let a bad UTF-8 byte throw.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Status CreateBinding(Client& client, const Binding& binding, std::chrono::milliseconds timeout) {
  KDM_RETURN_IF_ERROR(CheckBinding(binding));
  return client.Post(BindingPath(binding), BindingBody(binding), timeout);
}

}  // namespace kdm::kube
