// A small consumer of an installed kdm: the SDK, the Manager, the allocator, a store.
#include <iostream>

#include "kdm/checkpoint/store.h"
#include "kdm/devicemanager/manager.h"
#include "kdm/pluginapi/sdk/plugin_server.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/presets.h"
int main() {
  auto server = kdm::plugin::PluginServer::Create({});  // no resource name: refused
  auto manager = kdm::devicemanager::Manager::Create({.store = kdm::checkpoint::NewMemoryStore()});
  auto dgx = kdm::topology::Preset("dgx1-v100");
  auto pick = kdm::topology::Allocate(*dgx, {0, 1, 2, 3, 4, 5, 6, 7}, {}, 2,
                                      kdm::topology::Policy::kPacked);
  std::cout << kdm::pluginapi::kVersion << " " << server.status().message()
            << " manager=" << manager.ok() << " pick=" << pick->chosen[0] << "," << pick->chosen[1]
            << "\n";
  return server.ok() || !manager.ok() ? 1 : 0;
}
