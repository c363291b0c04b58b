// A ten-line consumer of an installed kdm: uses the SDK and the generated API.
#include <iostream>
#include "kdm/pluginapi/constants.h"
#include "kdm/pluginapi/sdk/plugin_server.h"
int main() {
  kdm::plugin::PluginServer::Options o;  // no resource name: Create must refuse
  auto server = kdm::plugin::PluginServer::Create(std::move(o));
  v1beta1::RegisterRequest r;
  r.set_version(std::string(kdm::pluginapi::kVersion));
  std::cout << r.version() << " " << server.status().message() << "\n";
  return server.ok() ? 1 : 0;
}
