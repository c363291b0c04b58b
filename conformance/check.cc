#include "kdm/conformance/check.h"

namespace kdm::conformance {

const std::vector<CheckInfo>& Catalogue() {
  static const std::vector<CheckInfo> kChecks = {
      {"reg.version", "RegisterRequest.version is exactly \"v1beta1\"",
       "SPEC §1, §3 Registration"},
      {"reg.resource-name",
       "RegisterRequest.resource_name is a valid extended resource name and equals --resource",
       "SPEC §3 Registration"},
      {"reg.endpoint",
       "the endpoint is a plain file name of a unix socket (not a symlink) inside the plugin "
       "directory",
       "SPEC §5.4"},
      {"reg.options-match",
       "the options inside RegisterRequest equal GetDevicePluginOptions' answer",
       "SPEC §3 Registration"},
      {"lw.first-snapshot",
       "the first ListAndWatch message arrives within min(--timeout, 5s) and is non-empty",
       "SPEC §3 ListAndWatch"},
      {"lw.ids", "device ids are unique, non-empty and at most 63 characters", "SPEC §1"},
      {"lw.health", "every health string is exactly \"Healthy\" or \"Unhealthy\"", "SPEC §1"},
      {"lw.numa", "every NUMA node id is >= 0", "SPEC §1"},
      {"lw.full-snapshots",
       "every ListAndWatch message is a full snapshot, never a delta", "SPEC §3 ListAndWatch"},
      {"alloc.one-response",
       "Allocate for valid ids (one container) answers OK with exactly one container response",
       "SPEC §3 Allocation 6"},
      {"alloc.unknown-id", "Allocate naming an id the plugin never listed fails", "SPEC §3"},
      {"alloc.paths",
       "device spec and mount paths (container and host) are absolute, without \"..\"",
       "SPEC §1"},
      {"alloc.permissions",
       "device spec permissions are non-empty and a subset of \"rwm\" without repeats",
       "SPEC §1"},
      {"alloc.env-names", "env names match [-._a-zA-Z][-._a-zA-Z0-9]*", "SPEC §1"},
      {"alloc.cdi-names", "CDI device names are fully qualified vendor/class=name", "SPEC §1"},
      {"alloc.concurrent",
       "64 Allocate calls from 8 threads at once all succeed with the sequential answer",
       "SPEC §5.1"},
      {"pref.size", "GetPreferredAllocation answers exactly allocation_size ids",
       "SPEC §3 step 5, §5.3"},
      {"pref.subset", "every preferred id is in available_deviceIDs", "SPEC §5.3"},
      {"pref.must-include", "every must_include id is in the preferred answer", "SPEC §5.3"},
      {"pref.no-duplicates", "no preferred id is answered twice", "SPEC §5.3"},
      {"pref.deterministic", "the same preferred request asked 5 times gives the same set",
       "SPEC §5.3"},
      {"pref.deadline",
       "the largest preferred request (all devices, size count-1) is answered within --timeout",
       "SPEC §5.1"},
      {"prestart.answered",
       "PreStartContainer answers OK within --timeout when options say pre_start_required",
       "SPEC §3 PreStartContainer"},
      {"lw.stream-drop",
       "20 cancelled ListAndWatch streams later, a new stream and Allocate still work",
       "SPEC §3 ListAndWatch"},
      {"reg.restart",
       "after kubelet.sock is removed and created again the plugin registers again",
       "SPEC §4"},
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
    case Verdict::kPass: return "PASS";
    case Verdict::kFail: return "FAIL";
    case Verdict::kSkip: return "SKIP";
  }
  return "SKIP";
}

}  // namespace kdm::conformance
