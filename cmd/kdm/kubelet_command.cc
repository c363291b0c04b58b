// `kdm kubelet --root DIR`: the fake kubelet (kdm::fakes::NodeAgent) as a
// process. Flag parsing, logging and signals only.
//
// Exit codes: 0 after SIGTERM/SIGINT (clean shutdown: plugin RPCs in flight
// are cancelled, nothing is admitted or written after the signal), 130/143
// after a second SIGINT/SIGTERM during the shutdown (out at once), 1 when the agent
// cannot start (message on stderr; for a --root that cannot work, e.g. too
// long for its sockets or not creatable, the message names --root), 2 usage.
// --root may be relative; it is made absolute at once. One agent per root:
// the agent holds <root>/.kdm-kubelet.lock and
// <root>/device-plugins/kubelet.sock.lock (flock, kdm/base/file_lock.h) for
// its whole life; when either is held by another process it exits 1 at once
// with one line naming the holder's pid, having touched nothing.
//
// `--publish` also runs the publish loop of `kdm publish` (kdm/publish/),
// reading the agent's Manager in-process (publish::ManagerSource: the answers
// its pod-resources socket gives, without dialling it), on a thread joined
// at shutdown.
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli_common.h"
#include "cli_dialect.h"
#include "commands.h"
#include "duration_flag.h"
#include "kdm/base/env.h"
#include "kdm/base/file_lock.h"
#include "kdm/base/file_system.h"
#include "kdm/checkpoint/paths.h"
#include "kdm/fakes/node_agent.h"
#include "kdm/kube/client.h"
#include "kdm/publish/device_sources.h"
#include "kdm/publish/publish_loop.h"
#include "kube_flags.h"
#include "publish_flags.h"

namespace kdm::cli {
namespace {

struct KubeletFlags {
  std::string root;
  std::string checkpoint = "sqlite";
  std::string metrics_addr;
  std::string grace = "5m";
  std::string rpc_timeout = "10s";
  std::string pre_start_timeout = "30s";
  std::string registration_grace = "30s";
  std::vector<std::string> restrictions;  // RESOURCE=NS1,NS2 (repeatable)
  std::vector<std::string> attributes;    // RESOURCE=KEY=VALUE,... (repeatable)
  int verbosity = 0;
  // --publish: the kdm.io/devices annotation, as `kdm publish` writes it.
  bool publish = false;
  PublishLoopFlags publish_loop;
};

int RunKubelet(const KubeletFlags& flags) {
  auto usage = [](const std::string& message) {
    std::cerr << "kdm kubelet: " << message << "\nRun 'kdm kubelet --help' for usage.\n";
    return kUsageError;
  };
  if (flags.root.empty()) return usage("--root is required");
  fakes::NodeAgent::Options options;
  StatusOr<std::string> root = AbsolutePathFlag("--root", flags.root);
  if (!root.ok()) {
    std::cerr << "kdm kubelet: " << root.status().message() << "\n";
    return 1;
  }
  options.root = *root;
  auto kind = checkpoint::ParseStoreKind(flags.checkpoint);
  if (!kind.ok()) return usage("--checkpoint: " + kind.status().message());
  options.checkpoint = *kind;
  auto grace = ParseDurationFlag(flags.grace);
  if (!grace.ok()) return usage("--grace: " + grace.status().message());
  options.grace_period = *grace;
  auto rpc = ParseDurationFlag(flags.rpc_timeout);
  if (!rpc.ok()) return usage("--rpc-timeout: " + rpc.status().message());
  if (rpc->count() == 0) return usage("--rpc-timeout: must be more than 0");
  options.rpc_timeout = *rpc;
  auto pre_start = ParseDurationFlag(flags.pre_start_timeout);
  if (!pre_start.ok()) return usage("--pre-start-timeout: " + pre_start.status().message());
  if (pre_start->count() == 0) return usage("--pre-start-timeout: must be more than 0");
  options.pre_start_timeout = *pre_start;
  auto registration_grace = ParseDurationFlag(flags.registration_grace);
  if (!registration_grace.ok()) {
    return usage("--registration-grace: " + registration_grace.status().message());
  }
  options.registration_grace = *registration_grace;
  if (!flags.metrics_addr.empty()) {
    StatusOr<http::ListenAddress> metrics = ParseListenFlag("--metrics-addr", flags.metrics_addr);
    if (!metrics.ok()) return usage(metrics.status().message());
  }
  options.metrics_addr = flags.metrics_addr;
  auto restrictions = fakes::ParseRestrictions(flags.restrictions);
  if (!restrictions.ok()) return usage("--restrict " + restrictions.status().message());
  options.restrictions = std::move(*restrictions);
  auto attributes = cli::ParseResourceAttributes(flags.attributes);
  if (!attributes.ok()) return usage(attributes.status().message());
  options.attributes = std::move(*attributes);
  if (!flags.publish && flags.publish_loop.any_given()) {
    return usage(
        "--node-name, --topology, --ids, --plugin-policy, --nvml-library, --sysfs-root, "
        "--kubeconfig, --context, --in-cluster, --interval, --min-write-interval, --resync and "
        "--timeout "
        "need --publish");
  }
  if (flags.publish) {
    if (auto f = CheckPublishFlags(flags.publish_loop, flags.attributes, ClientFlags::kRequired)) {
      if (f->code == kUsageError) return usage(f->message);
      std::cerr << "kdm kubelet: " << f->message << "\n";
      return 1;
    }
  }
  for (const char* socket : {"/device-plugins/kubelet.sock", "/pod-resources/kubelet.sock"}) {
    if (Status s = CheckSocketPathFlag("--root", options.root + socket); !s.ok()) {
      std::cerr << "kdm kubelet: " << s.message() << "\n";
      return 1;
    }
  }
  // `kdm --dry-run kubelet`: every check above is pure; nothing below is.
  if (DryRun()) return kOk;
  PublishSetup publish_setup;
  std::unique_ptr<kube::Client> kube_client;
  if (flags.publish) {
    // The same checks and loading as `kdm publish`; the attributes (NVML's
    // included) also feed the requirement checks.
    if (auto f = LoadPublishFlags(flags.publish_loop, flags.attributes, ClientFlags::kRequired,
                                  &publish_setup)) {
      if (f->code == kUsageError) return usage(f->message);
      std::cerr << "kdm kubelet: " << f->message << "\n";
      return 1;
    }
    for (const std::string& w : publish_setup.warnings) {
      std::cerr << "kdm kubelet: warning: " << w << "\n";
    }
    options.attributes = publish_setup.options.attributes;
    options.gpu_indexes = publish_setup.gpu_indexes;
    auto made = MakeKubeClient(flags.publish_loop.kube);
    if (!made.ok()) {
      std::cerr << "kdm kubelet: " << made.status().message() << "\n";
      return 1;
    }
    kube_client = std::move(*made);
  }

  // Before any thread exists (see StopSignals): the first SIGTERM/SIGINT
  // stops the agent cleanly, a second one exits at once (130/143).
  StopSignals stop_signals("kdm kubelet");
  signal(SIGPIPE, SIG_IGN);

  SetUpStderrLogging("kdm-kubelet", LogLevelFor(flags.verbosity, spdlog::level::info));
  auto cannot_start = [](const Status& s) {
    spdlog::error("event=start_failed error=\"{}\"", s.message());
    std::cerr << "kdm kubelet: " << s.message() << "\n";
    return 1;
  };
  // The sockets under --root must fit a unix socket path, and --root must be
  // a directory we can make: said here, naming the flag, before anything
  // starts.
  for (const char* socket : {"/device-plugins/kubelet.sock", "/pod-resources/kubelet.sock"}) {
    if (Status s = CheckSocketPathFlag("--root", options.root + socket); !s.ok()) {
      return cannot_start(s);
    }
  }
  if (Status s = MakeDirectoryFlag("--root", options.root); !s.ok()) return cannot_start(s);
  // One agent per root: a second one stops here, in one line naming the
  // holder's pid, before it touches a socket or a file under --root. The
  // locks are held until this process ends, however it ends.
  auto in_use = [&](const Status& s, const std::string& what) {
    if (!IsLockHeldError(s)) return cannot_start(s);
    std::cerr << "kdm kubelet: --root " << options.root << ": " << what << ": " << s.message()
              << "\n";
    return kRuntimeError;
  };
  StatusOr<FileLock> root_lock = FileLock::Acquire(JoinPath(options.root, kAgentLockName));
  if (!root_lock.ok()) return in_use(root_lock.status(), "another agent runs on it");
  // kubelet.sock has a second possible owner, `kdm conform --root`, which
  // takes only this lock.
  const std::string plugin_dir = options.root + "/device-plugins";
  if (Status s = Env::Default()->CreateDirectories(plugin_dir, 0750); !s.ok()) {
    return cannot_start(s.WithPrefix("--root"));
  }
  StatusOr<FileLock> kubelet_sock_lock =
      FileLock::Acquire(SocketLockPath(JoinPath(plugin_dir, "kubelet.sock")));
  if (!kubelet_sock_lock.ok()) {
    return in_use(kubelet_sock_lock.status(), "device-plugins/kubelet.sock is in use");
  }
  spdlog::info(
      "event=starting root={} checkpoint={} grace={}ms rpc_timeout={}ms pre_start_timeout={}ms "
      "registration_grace={}ms metrics_addr={}",
      options.root, flags.checkpoint, options.grace_period.count(), options.rpc_timeout.count(),
      options.pre_start_timeout.count(), options.registration_grace.count(),
      options.metrics_addr.empty() ? "off" : options.metrics_addr);
  RaiseFdLimit();  // after every flag and file was checked: a bad one is one line
  auto agent = fakes::NodeAgent::Start(options);
  if (!agent.ok()) return cannot_start(agent.status());
  // The publish loop reads the agent's Manager in-process: the answers of
  // its pod-resources socket (one read path, devicemanager::ListPodResources)
  // without a dial, so a socket that can not be reached never stalls it.
  std::unique_ptr<publish::PublishLoop> publish_loop;
  if (flags.publish) {
    spdlog::info("event=publish_starting node={} interval={}ms min_write_interval={}ms",
                 publish_setup.options.node, publish_setup.options.interval.count(),
                 publish_setup.options.min_write_interval.count());
    fakes::NodeAgent* node_agent = agent->get();
    publish_loop = publish::PublishLoop::Start(
        std::move(publish_setup.options),
        std::make_unique<publish::ManagerSource>(&node_agent->manager(),
                                                 [node_agent] { return node_agent->ActivePods(); }),
        std::move(kube_client));
    if (devicemanager::Metrics* metrics = node_agent->metrics()) {
      // The loop outlives the metrics server: the agent stops it below.
      metrics->AddCounterSource(
          "kdm_publish_annotation_too_large_total",
          "kdm.io/devices values not sent because they were over the API server's 256 KiB.",
          [loop = publish_loop.get()] { return loop->annotations_too_large(); });
    }
  }
  const int sig = stop_signals.Wait();
  const auto stop_start = std::chrono::steady_clock::now();
  spdlog::info("event=stopping signal={}", StopSignalName(sig));
  // The loop reads the agent's Manager: it stops first.
  if (publish_loop) publish_loop->Stop();
  (*agent)->Stop();
  spdlog::info("event=stopped took_ms={}", std::chrono::duration_cast<std::chrono::milliseconds>(
                                               std::chrono::steady_clock::now() - stop_start)
                                               .count());
  return 0;
}

}  // namespace

void AddKubeletCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<KubeletFlags>();
  CLI::App* cmd = app.add_subcommand(
      "kubelet",
      "Fake kubelet: device plugin registration, pod-resources API, static pod manifests "
      "(DIR/manifests) and their admission results (DIR/status)");
  cmd->add_option("--root", flags->root,
                  "Root directory (required): device-plugins/, pod-resources/, state/, "
                  "manifests/, status/");
  cmd->add_option("--checkpoint", flags->checkpoint, "Checkpoint format: sqlite | kubelet-json")
      ->capture_default_str();
  cmd->add_option(
      "--metrics-addr", flags->metrics_addr,
      "Serve /metrics and /healthz on HOST:PORT (port 0: any free port); off by default");
  cmd->add_option("--grace", flags->grace,
                  "How long a resource whose plugin went away stays before it is deleted (e.g. 5m)")
      ->capture_default_str()
      ->type_name("DURATION");
  cmd->add_option("--rpc-timeout", flags->rpc_timeout,
                  "Deadline of every device plugin RPC but PreStartContainer (e.g. 300ms, 10s)")
      ->capture_default_str()
      ->type_name("DURATION");
  cmd->add_option("--pre-start-timeout", flags->pre_start_timeout,
                  "Deadline of PreStartContainer (the kubelet's: 30s)")
      ->capture_default_str()
      ->type_name("DURATION");
  cmd->add_option("--registration-grace", flags->registration_grace,
                  "At start, how long a pod admitted before the restart waits for its plugins "
                  "to register before it is judged (e.g. 30s; 0: not at all)")
      ->capture_default_str()
      ->type_name("DURATION");
  cmd->add_option("--restrict", flags->restrictions,
                  "RESOURCE=NS1,NS2: only pods of these namespaces may use RESOURCE; others are "
                  "rejected (repeatable, e.g. --restrict nvidia.com/gpu=ml,research)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--attributes", flags->attributes,
                  "RESOURCE=KEY=VALUE,...: what is known of RESOURCE's devices (model, "
                  "memory_mib, driver, cuda, arch, brand); containers whose NVIDIA_REQUIRE_* "
                  "they do not meet are rejected (repeatable, e.g. --attributes "
                  "nvidia.com/gpu=cuda=12.4,driver=550.54.15,brand=tesla)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  AddVerbosityFlag(cmd, &flags->verbosity);
  cmd->add_flag("--publish", flags->publish,
                "Also publish the node's devices as the kdm.io/devices annotation of Node "
                "--node-name, as `kdm publish` does (the API server from --kubeconfig, "
                "KUBECONFIG, ~/.kube/config or --in-cluster)");
  AddPublishLoopFlags(cmd, &flags->publish_loop);
  cmd->callback([flags, &exit_code] { exit_code = RunKubelet(*flags); });
}

}  // namespace kdm::cli
