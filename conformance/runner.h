// kdm::conformance::Runner: acts as the kubelet toward ONE device plugin and
// runs the checks of the catalogue (check.h) against it — the library behind
// `kdm conform`.
//
// Two ways to reach the plugin:
//  - `root`: serve Registration on <root>/device-plugins/kubelet.sock (the
//    directory is made, mode 0750, when missing), wait up to `timeout` for the
//    first Register (answered OK whatever it says: the reg.* checks judge
//    it), then dial <dir>/<endpoint>. A bad endpoint makes every check that
//    needs the plugin's socket SKIP ("endpoint unusable").
//  - `plugin_socket`: dial an already running plugin; the reg.* checks SKIP.
// Every RPC has a deadline of `timeout` (a ListAndWatch stream: the
// observation window plus a few `timeout`s); every wait is bounded.
//
// Run's error (a setup problem, nothing was judged) versus a Report (every
// check's verdict): INVALID_ARGUMENT for bad Options (see CheckOptions);
// DEADLINE_EXCEEDED when no plugin registered within `timeout`;
// UNAVAILABLE when `plugin_socket` cannot be dialed within `timeout`;
// INTERNAL / FAILED_PRECONDITION naming the path when the directory or the
// registration socket cannot be used.
//
// Thread-safety: Run may be called from any thread; concurrent runs need
// distinct roots. It owns every thread it starts and joins them before
// returning.
//
// Example:
//   Runner::Options o;
//   o.root = "/tmp/conform";
//   o.resource = "example.com/fpga";
//   o.timeout = std::chrono::seconds(5);
//   StatusOr<Report> report = Runner::Run(o);
//   if (!report.ok()) return Fail(report.status());
//   std::cout << RenderText(*report);
#ifndef KDM_CONFORMANCE_RUNNER_H_
#define KDM_CONFORMANCE_RUNNER_H_

#include <chrono>
#include <string>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/conformance/report.h"

namespace kdm::conformance {

class Runner {
 public:
  struct Options {
    // Exactly one of root (registration mode) and plugin_socket.
    std::string root;
    std::string plugin_socket;
    // The extended resource name the plugin must register. Required.
    std::string resource;
    // Deadline of every RPC and bound of every wait.
    std::chrono::milliseconds timeout{10'000};
    // Check ids to run (empty: all). Checks that are left out are not in the
    // Report; what they would have gathered for others is still gathered.
    std::vector<std::string> only;

    // How long lw.full-snapshots watches the first stream before opening a
    // second one.
    std::chrono::milliseconds snapshot_window{1'000};
    // How many streams lw.stream-drop opens and cancels.
    int stream_drop_iterations = 20;

    // A shell command that makes one device unhealthy in the plugin under
    // test (`kdm conform --health-trigger`): run as
    //   /bin/sh -c '<health_trigger> "$@"' kdm-health-trigger <device id>
    // (the id is its last argument, and KDM_DEVICE_ID / KDM_RESOURCE are set),
    // bounded by `timeout`. Empty: the health.* checks SKIP.
    std::string health_trigger;
    // How many streams health.reconnect opens and cancels before it watches
    // a new one.
    int health_reconnects = 3;
  };

  // OK for usable Options; INVALID_ARGUMENT naming the problem otherwise: no
  // or a malformed resource (not an extended resource name), neither or both
  // of root and plugin_socket, a timeout <= 0, an unknown `only` id (the
  // message lists the known ids), a window outside [0, 1 min] or iterations
  // outside [1, 1000], a health trigger with a NUL byte or over 4096 bytes,
  // health reconnects outside [1, 100].
  static Status CheckOptions(const Options& options);

  // Runs the checks (see the header comment for errors).
  static StatusOr<Report> Run(const Options& options);
};

}  // namespace kdm::conformance

#endif  // KDM_CONFORMANCE_RUNNER_H_
