// The extender protocol's JSON (docs/extender.md, "Protocol"): kube-scheduler's
// ExtenderArgs in, ExtenderFilterResult and HostPriorityList out, with the Go
// field names the scheduler uses (its types have no JSON tags).
//
// Decoding reads the body once with simdjson's On-Demand API and keeps only
// what scoring needs: the pod's effective request and NVIDIA_REQUIRE_* per
// container, and per node its name, its kdm.io/devices annotation and (for
// filter answers) the span of its object in the body, which the answer
// copies unchanged. Errors name the field ("Pod.spec.containers[1].resources
// .limits['nvidia.com/gpu']: '1.5' is not a whole number").
//
// Thread-safety: pure functions; safe from any thread.
#ifndef KDM_SCHEDULER_EXTENDER_JSON_H_
#define KDM_SCHEDULER_EXTENDER_JSON_H_

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/scheduler/scorer.h"

namespace kdm::scheduler {

// Bytes a body must have readable past its end for simdjson; PadBody makes
// room (without changing the body's size).
size_t BodyPadding();
void PadBody(std::string* body);

struct NodeItem {
  std::string name;
  // kdm.io/devices, when present; its capacity holds BodyPadding() more.
  std::optional<std::string> annotation;
  std::string_view raw;  // the node's JSON, inside the body
};

struct ExtenderArgs {
  PodRequest pod;
  std::optional<std::vector<NodeItem>> nodes;          // "Nodes": {"items": [...]}
  std::optional<std::vector<std::string>> node_names;  // "NodeNames"
};

// Decodes a request body. `body` must stay alive while the result's `raw`
// spans are used; when its capacity holds BodyPadding() bytes past its size
// it is read in place, otherwise copied. INVALID_ARGUMENT naming the field:
// not JSON, not an object, a missing or null Pod, neither Nodes nor
// NodeNames, wrong types, a quantity that is not a whole number, a
// malformed NVIDIA_REQUIRE_* value.
StatusOr<ExtenderArgs> DecodeExtenderArgs(const std::string& body);

struct FilterAnswer {
  std::optional<std::vector<std::string_view>> nodes;  // raw node objects
  std::optional<std::vector<std::string>> node_names;
  std::map<std::string, std::string> failed;
  std::map<std::string, std::string> unresolvable;
  std::string error;
};

std::string EncodeFilterAnswer(const FilterAnswer& answer);
// [{"Host":"n1","Score":10},...]
std::string EncodePriorityList(const std::vector<std::pair<std::string, int>>& scores);
// {"Error":"..."}: the body of a 400.
std::string EncodeError(std::string_view message);
// kube-scheduler's ExtenderBindingArgs (the bindVerb's body).
struct BindArgs {
  std::string pod_name;
  std::string pod_namespace;
  std::string pod_uid;
  std::string node;
};
// INVALID_ARGUMENT naming the field: not a JSON object, a field that is not
// a string, a name that is not a DNS name (PodName and Node subdomains,
// PodNamespace a label: they go into an API path), a PodUID empty or over
// 253 bytes. Unknown fields are ignored.
StatusOr<BindArgs> DecodeBindingArgs(const std::string& body);
// ExtenderBindingResult: {"Error":"..."}; "" when bound.
std::string EncodeBindingResult(std::string_view error);
// A JSON string literal with quotes.
void AppendJsonString(std::string_view s, std::string* out);

}  // namespace kdm::scheduler

#endif  // KDM_SCHEDULER_EXTENDER_JSON_H_
