// fpga_plugin: a whole device plugin written with kdm's C++ SDK, serving two
// FPGAs of example.com/fpga until SIGINT or SIGTERM.
//
//   fpga_plugin [PLUGIN_DIR]   (default /var/lib/kubelet/device-plugins)
//
// docs/sdk.md shows this file as it is; a test builds it and runs
// `kdm conform` against it (test/e2e/conform_e2e_test.cc).
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <utility>

#include "kdm/pluginapi/sdk/plugin_server.h"

int main(int argc, char** argv) {
  // Blocked before the SDK starts its threads: only sigwait below gets them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  kdm::plugin::PluginServer::Options o;
  o.resource_name = "example.com/fpga";
  if (argc > 1) o.plugin_dir = argv[1];
  o.devices = {{"fpga0", true, {0}}, {"fpga1", true, {1}}};  // id, healthy, NUMA nodes
  // Called for each container, with ids listed above only: the SDK answers
  // NOT_FOUND for any other id before this function runs.
  o.allocate = [](const v1beta1::ContainerAllocateRequest& req)
      -> kdm::StatusOr<v1beta1::ContainerAllocateResponse> {
    v1beta1::ContainerAllocateResponse r;
    for (const auto& id : req.devices_ids()) {
      auto* d = r.add_devices();
      d->set_container_path("/dev/" + id);
      d->set_host_path("/dev/" + id);
      d->set_permissions("rw");
    }
    return r;
  };
  auto server = kdm::plugin::PluginServer::Create(std::move(o));
  if (!server.ok()) {
    std::fprintf(stderr, "fpga_plugin: %s\n", server.status().ToString().c_str());
    return 2;
  }
  if (auto s = (*server)->Start(); !s.ok()) {  // directory missing, not writable, ...
    std::fprintf(stderr, "fpga_plugin: %s\n", s.ToString().c_str());
    return 1;
  }
  int sig = 0;
  sigwait(&stop, &sig);
  (*server)->Stop();  // streams end, socket removed, threads joined
  return 0;
}
