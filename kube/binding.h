// kube::CreateBinding: binds a pod to a node the way kube-scheduler's
// default binder does, by creating the pod's `binding` subresource:
//   POST /api/v1/namespaces/{namespace}/pods/{name}/binding
//   {"apiVersion":"v1","kind":"Binding",
//    "metadata":{"name":NAME,"namespace":NAMESPACE,"uid":UID},
//    "target":{"apiVersion":"v1","kind":"Node","name":NODE}}
// The API server answers 201 Created and sets the pod's spec.nodeName (its
// watchers see MODIFIED). `uid` makes the binding apply only to that
// incarnation of the pod (left out of the body when empty).
//
// Names are checked before any request: the namespace must be a DNS-1123
// label, the pod's name and the node's DNS-1123 subdomains (k8s/names.h),
// so no name can reach the path with '/', '..', '%' or anything else that
// changes what is addressed. The uid may be any text up to 128 bytes without
// control characters (it only travels in the JSON body).
//
// Never posted twice after a 409: the client does not retry a create on 409
// (kube/client.h, Client::Post), and a second POST of a binding that
// landed would answer 409 anyway. A 409 is ABORTED: the pod is bound
// already (or is not that uid any more).
//
// RBAC: `create` on `pods/binding`.
//
// Thread-safety: as the client's (any thread).
//
// Example:
//   KDM_RETURN_IF_ERROR(CreateBinding(*client, {.namespace_name = "ml", .name = "train-0",
//                                               .uid = uid, .node = "gpu-7"}, 5s));
#ifndef KDM_KUBE_BINDING_H_
#define KDM_KUBE_BINDING_H_

#include <chrono>
#include <cstddef>
#include <string>

#include "kdm/base/status.h"
#include "kdm/kube/client.h"

namespace kdm::kube {

struct Binding {
  std::string namespace_name, name, uid, node;
};

// The longest uid accepted (a Kubernetes uid is a 36-byte UUID).
inline constexpr size_t kMaxBindingUidBytes = 128;

// OK on a 2xx answer (201). Errors: INVALID_ARGUMENT before any request for
// a name that is not a DNS name (as above; the message names the field and
// quotes the value) or a bad uid; else Client::Post's: 409 -> ABORTED
// (already bound), 404 -> NOT_FOUND (no such pod), 403 ->
// PERMISSION_DENIED, 5xx/network after the retries -> UNAVAILABLE, the
// timeout -> DEADLINE_EXCEEDED.
Status CreateBinding(Client& client, const Binding& binding, std::chrono::milliseconds timeout);

// The path and body CreateBinding sends, for tests and logs. REQUIRES: the
// names passed CreateBinding's checks.
std::string BindingPath(const Binding& binding);
std::string BindingBody(const Binding& binding);

}  // namespace kdm::kube

#endif  // KDM_KUBE_BINDING_H_
