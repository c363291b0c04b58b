#include "kdm/devicemanager/device_snapshot.h"

#include <utility>

#include "kdm/pluginapi/constants.h"

namespace kdm::devicemanager {

std::vector<LedgerDevice> ToLedgerDevices(const v1beta1::ListAndWatchResponse& response) {
  std::vector<LedgerDevice> out;
  out.reserve(response.devices_size());
  for (const auto& d : response.devices()) {
    LedgerDevice ld;
    ld.id = d.id();
    ld.healthy = d.health() == pluginapi::kHealthy;
    if (d.has_topology()) {
      for (const auto& n : d.topology().nodes()) ld.numa_nodes.push_back(n.id());
    }
    out.push_back(std::move(ld));
  }
  return out;
}

}  // namespace kdm::devicemanager
