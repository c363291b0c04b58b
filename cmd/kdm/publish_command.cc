// `kdm publish`: the node's devices, free devices and topology as the
// kdm.io/devices annotation (docs/publish.md), read from a pod-resources
// socket (a real kubelet's or `kdm kubelet`'s). `--dry-run` prints the
// annotation once and exits; otherwise kube::Publisher polls and writes it to
// the Node object through the API server client (kubectl's loading rules,
// kube_flags.h) until SIGTERM/SIGINT. An API server that is down or refuses
// never stops it: writes are retried. A value over the API server's 256 KiB
// is never printed nor sent (docs/publish.md, "How large the annotation may
// be").
//
// The loop's flags and their checks are shared with `kdm kubelet --publish`
// (publish_flags.h); the loop and the pod-resources source are kdm/publish/'s.
//
// Exit codes: 0 ok (--dry-run printed, or stopped by a signal), 130/143 a
// second SIGINT/SIGTERM during the stop (out at once), 1 runtime
// error (the socket cannot be read, a topology, ids or kubeconfig file cannot
// be read or parsed, NVML fails), 2 usage (bad or missing flags; no NVML
// library on the machine for --topology RESOURCE=nvml).
#include <signal.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_common.h"
#include "cli_dialect.h"
#include "commands.h"
#include "kdm/devicemanager/pod_resources_client.h"
#include "kdm/k8s/devices_annotation.h"
#include "kdm/kube/client.h"
#include "kdm/kube/publisher.h"
#include "kdm/publish/device_sources.h"
#include "kdm/publish/publish_loop.h"
#include "kube_flags.h"
#include "publish_flags.h"

namespace kdm::cli {
namespace {

struct PublishFlags {
  PublishLoopFlags loop;
  std::string socket;
  std::vector<std::string> attributes;  // RESOURCE=KEY=VALUE,... (repeatable)
  bool dry_run = false;
  int verbosity = 0;
};

int RunPublish(const PublishFlags& flags) {
  SetUpStderrLogging("publish", LogLevelFor(flags.verbosity, spdlog::level::info));
  auto fail = [](const PublishFailure& f) {
    std::cerr << "kdm publish: " << f.message << "\n";
    return f.code;
  };
  auto usage = [&](const std::string& m) { return fail({kPublishUsageError, m}); };
  if (flags.loop.node_name.empty()) return usage("--node-name is required");
  if (flags.socket.empty()) return usage("--pod-resources-socket is required");
  auto socket = AbsolutePathFlag("--pod-resources-socket", flags.socket);
  if (!socket.ok()) return usage(socket.status().message());
  if (Status s = CheckSocketPathFlag("--pod-resources-socket", *socket); !s.ok()) {
    return usage(s.message());
  }
  // `kdm --dry-run publish`: the pure checks only (not the annotation
  // `kdm publish --dry-run` prints, which reads the socket).
  if (DryRun()) {
    if (auto f = CheckPublishFlags(
            flags.loop, flags.attributes,
            flags.dry_run ? ClientFlags::kOptional : ClientFlags::kRequiredUnlessDryRun)) {
      return fail(*f);
    }
    return kOk;
  }
  PublishSetup setup;
  if (auto f = LoadPublishFlags(
          flags.loop, flags.attributes,
          flags.dry_run ? ClientFlags::kOptional : ClientFlags::kRequiredUnlessDryRun, &setup)) {
    return fail(*f);
  }
  for (const std::string& w : setup.warnings) std::cerr << "kdm publish: warning: " << w << "\n";

  // Before any client (gRPC may start threads as a channel is made) and the
  // loop's thread exist (see StopSignals): the first SIGTERM/SIGINT stops
  // the loop cleanly, a second one exits at once (130/143). A dry run keeps
  // the default signals.
  std::optional<StopSignals> stop_signals;
  if (!flags.dry_run) stop_signals.emplace("kdm publish");
  std::unique_ptr<kube::Client> kube_client;
  if (!flags.dry_run) {
    auto made = MakeKubeClient(flags.loop.kube);
    if (!made.ok()) return fail({kPublishRuntimeError, made.status().message()});
    kube_client = std::move(*made);
  }
  auto client = devicemanager::PodResourcesClient::Connect(
      {.socket_path = *socket, .timeout = setup.options.timeout});
  if (!client.ok()) return fail({kPublishRuntimeError, client.status().message()});
  auto source = std::make_unique<publish::PodResourcesSource>(std::move(*client));

  if (flags.dry_run) {
    StatusOr<kube::NodeDevices> devices = source->Read();
    if (!devices.ok()) return fail({kPublishRuntimeError, devices.status().message()});
    // A --topology for a resource the node does not have would publish an
    // entry with no devices: said instead, naming it (the loop waits for
    // it: a plugin may register after the publisher starts).
    for (const auto& [resource, _] : setup.options.topologies) {
      if (devices->allocatable.count(resource) || devices->in_use.count(resource)) continue;
      std::string known;
      for (const auto& [r, ids] : devices->allocatable) known += (known.empty() ? "" : ", ") + r;
      return fail({kPublishRuntimeError,
                   "--topology " + resource + ": the node has no resource " + resource +
                       " (its resources: " + (known.empty() ? "none" : known) +
                       "; is its device plugin registered?)"});
    }
    std::vector<std::string> warnings;
    k8s::DevicesAnnotation a = kube::BuildDevicesAnnotation(
        setup.options.node, k8s::FormatRfc3339(std::chrono::system_clock::now()), *devices,
        setup.options.topologies, setup.options.attributes, &warnings, setup.options.policies);
    for (const std::string& w : warnings) std::cerr << "kdm publish: warning: " << w << "\n";
    // What the loop would send, so what the API server would take.
    StatusOr<std::string> value = k8s::EncodeDevicesAnnotationWithin(a);
    if (!value.ok()) return fail({kPublishRuntimeError, value.status().message()});
    std::cout << *value << "\n";
    return kOk;
  }

  signal(SIGPIPE, SIG_IGN);
  spdlog::info("event=publish_starting node={} interval={}ms min_write_interval={}ms resync={}ms",
               setup.options.node, setup.options.interval.count(),
               setup.options.min_write_interval.count(), setup.options.resync.count());
  RaiseFdLimit();  // after every flag and file was checked: a bad one is one line
  auto loop = publish::PublishLoop::Start(std::move(setup.options), std::move(source),
                                          std::move(kube_client));
  const int sig = stop_signals->Wait();
  const auto stop_start = std::chrono::steady_clock::now();
  spdlog::info("event=publish_stopping signal={}", StopSignalName(sig));
  loop->Stop();
  spdlog::info("event=publish_stopped took_ms={}",
               std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - stop_start)
                   .count());
  return kOk;
}

}  // namespace

void AddPublishCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<PublishFlags>();
  auto* cmd = app.add_subcommand(
      "publish",
      "Publish the node's devices, free devices and topology as the kdm.io/devices annotation");
  cmd->add_option("--pod-resources-socket", flags->socket,
                  "The kubelet's pod-resources socket (e.g. "
                  "/var/lib/kubelet/pod-resources/kubelet.sock, or DIR/pod-resources/kubelet.sock "
                  "of `kdm kubelet --root DIR`)")
      ->type_name("PATH");
  AddPublishLoopFlags(cmd, &flags->loop);
  cmd->add_option("--attributes", flags->attributes,
                  "RESOURCE=KEY=VALUE,...: what is known of RESOURCE's devices (model, "
                  "memory_mib, driver, cuda, arch, brand); wins over NVML's (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_flag("--dry-run", flags->dry_run, "Print the annotation JSON once and exit");
  AddVerbosityFlag(cmd, &flags->verbosity);
  cmd->callback([flags, &exit_code] { exit_code = RunPublish(*flags); });
}

}  // namespace kdm::cli
