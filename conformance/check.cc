#include "kdm/conformance/check.h"

namespace kdm::conformance {

const std::vector<CheckInfo>& Catalogue() {
  static const std::vector<CheckInfo> kChecks = {
      {"reg.version", "RegisterRequest.version is exactly \"v1beta1\"",
       "docs/wire-contract.md#field-rules, docs/kubelet-rules.md#registration"},
      {"reg.resource-name",
       "RegisterRequest.resource_name is a valid extended resource name and equals --resource",
       "docs/kubelet-rules.md#registration"},
      {"reg.endpoint",
       "the endpoint is a plain file name of a unix socket (not a symlink) inside the plugin "
       "directory",
       "docs/promises.md#endpoint-checks"},
      {"reg.options-match",
       "the options inside RegisterRequest equal GetDevicePluginOptions' answer",
       "docs/kubelet-rules.md#registration"},
      {"lw.first-snapshot",
       "the first ListAndWatch message arrives within min(--timeout, 5s) and is non-empty",
       "docs/kubelet-rules.md#listandwatch"},
      {"lw.ids", "device ids are unique, non-empty and at most 63 characters",
       "docs/wire-contract.md#field-rules"},
      {"lw.health", "every health string is exactly \"Healthy\" or \"Unhealthy\"",
       "docs/wire-contract.md#field-rules"},
      {"lw.numa", "every NUMA node id is >= 0", "docs/wire-contract.md#field-rules"},
      {"health.trigger",
       "a device --health-trigger makes unhealthy is reported Unhealthy on the open stream within "
       "--timeout",
       "docs/kubelet-rules.md#listandwatch"},
      {"lw.full-snapshots", "every ListAndWatch message is a full snapshot, never a delta",
       "docs/kubelet-rules.md#listandwatch"},
      {"alloc.one-response",
       "Allocate for valid ids (one container) answers OK with exactly one container response",
       "docs/kubelet-rules.md#allocation"},
      {"alloc.unknown-id", "Allocate naming an id the plugin never listed fails",
       "docs/kubelet-rules.md#allocation"},
      {"alloc.paths",
       "device spec and mount paths (container and host) are absolute, without \"..\"",
       "docs/wire-contract.md#field-rules"},
      {"alloc.permissions",
       "device spec permissions are non-empty and a subset of \"rwm\" without repeats",
       "docs/wire-contract.md#field-rules"},
      {"alloc.env-names", "env names match [-._a-zA-Z][-._a-zA-Z0-9]*",
       "docs/wire-contract.md#field-rules"},
      {"alloc.cdi-names", "CDI device names are fully qualified vendor/class=name",
       "docs/wire-contract.md#field-rules"},
      {"alloc.concurrent",
       "64 Allocate calls from 8 threads at once all succeed with the sequential answer",
       "docs/promises.md#deadlines"},
      {"pref.size", "GetPreferredAllocation answers exactly allocation_size ids",
       "docs/kubelet-rules.md#allocation, docs/promises.md#validated-preferred-answers"},
      {"pref.subset", "every preferred id is in available_deviceIDs",
       "docs/promises.md#validated-preferred-answers"},
      {"pref.must-include", "every must_include id is in the preferred answer",
       "docs/promises.md#validated-preferred-answers"},
      {"pref.no-duplicates", "no preferred id is answered twice",
       "docs/promises.md#validated-preferred-answers"},
      {"pref.deterministic", "the same preferred request asked 5 times gives the same set",
       "docs/promises.md#validated-preferred-answers"},
      {"pref.deadline",
       "the largest preferred request (all devices, size count-1) is answered within --timeout",
       "docs/promises.md#deadlines"},
      {"prestart.answered",
       "PreStartContainer answers OK within --timeout when options say pre_start_required",
       "docs/kubelet-rules.md#prestartcontainer"},
      {"lw.stream-drop",
       "20 cancelled ListAndWatch streams later, a new stream and Allocate still work",
       "docs/kubelet-rules.md#listandwatch"},
      {"health.reconnect",
       "after 3 cancelled ListAndWatch streams, every health change --health-trigger makes reaches "
       "the new stream",
       "docs/kubelet-rules.md#listandwatch"},
      {"reg.restart", "after kubelet.sock is removed and created again the plugin registers again",
       "docs/kubelet-rules.md#kubelet-restart"},
  };
  return kChecks;
}

const CheckInfo* FindCheck(std::string_view id) {
  for (const CheckInfo& c : Catalogue()) {
    if (c.id == id) return &c;
  }
  return nullptr;
}

std::string_view CheckGroup(std::string_view id) { return id.substr(0, id.find('.')); }

std::string_view VerdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::kPass:
      return "PASS";
    case Verdict::kFail:
      return "FAIL";
    case Verdict::kSkip:
      return "SKIP";
  }
  return "SKIP";
}

}  // namespace kdm::conformance
