// kdm::k8s names: the Kubernetes rules for the names kdm reads and writes,
// in one place (docs/kubernetes-rules.md, "Names"): DNS-1123 labels
// (namespaces, container names), DNS-1123 subdomains (pod and Node names,
// the domain of a resource name), qualified name parts and extended
// resource names. The device plugin API's checks (pluginapi/api_rules.h),
// the fake kubelet's manifests, the Node annotation writer and the
// extender all call these.
//
// Thread-safety: pure functions; safe from any thread.
//
// Example:
//   if (!kdm::k8s::IsExtendedResourceName("nvidia.com/gpu")) ...;  // it is one
//   kdm::k8s::IsDns1123Subdomain("gpu-node-7");                     // true
#ifndef KDM_K8S_NAMES_H_
#define KDM_K8S_NAMES_H_

#include <cstddef>
#include <string_view>

namespace kdm::k8s {

// Longest DNS-1123 label (a namespace, a container name).
inline constexpr std::size_t kMaxDns1123LabelLength = 63;
// Longest DNS-1123 subdomain (a pod or Node name, the domain of a resource
// name).
inline constexpr std::size_t kMaxDns1123SubdomainLength = 253;
// Longest name part of a qualified name ("gpu" in "nvidia.com/gpu").
inline constexpr std::size_t kMaxQualifiedNamePartLength = 63;

// Kubernetes' IsDNS1123Label: [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most
// kMaxDns1123LabelLength characters.
bool IsDns1123Label(std::string_view s);

// Kubernetes' IsDNS1123Subdomain: dot-separated parts, each
// [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most kMaxDns1123SubdomainLength
// characters in all. There is no limit per part (unlike a DNS label):
// Kubernetes checks only the whole length.
bool IsDns1123Subdomain(std::string_view s);

// The name part of a Kubernetes qualified name:
// [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?, at most
// kMaxQualifiedNamePartLength characters.
bool IsQualifiedNamePart(std::string_view s);

// True for an extended resource name, the kind only a device plugin
// provides: "<domain>/<name>" with exactly one '/', not containing
// "kubernetes.io/", not starting with "requests.", the domain a DNS-1123
// subdomain and the name a qualified name part. cpu, memory,
// hugepages-2Mi, ephemeral-storage and the like are not.
bool IsExtendedResourceName(std::string_view name);

}  // namespace kdm::k8s

#endif  // KDM_K8S_NAMES_H_
