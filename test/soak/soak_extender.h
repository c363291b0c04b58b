// The soak's cluster half (issue 28): a real `kdm extender --kubeconfig`
// whose API server is an in-process hostile one (the in-tree HTTPS test
// server, test/kube/test_api_server.h) and whose node cache holds two
// honest nodes beside a hostile one.
//
// Attacks (one per call of Attack(), picked at random):
//   on the hostile node, a MODIFIED event carrying: a Node whose
//     spec.podCIDRs nests 100,000 deep; an annotation that is garbage, over
//     256 KiB, nested 100,000 deep, or valid with 32 or 64 GPUs and fresh
//     random links (a new matrix every time: scoring cost and cache churn);
//     a watch line of 16 MiB;
//   on the API server, for 3 s: every WATCH answered 410, every WATCH ended
//     at once, every LIST answered with garbage, every request dropped.
// Invariants:
//   extender-process  the extender never exits before the end, and exits 0
//                     within 5 s of SIGTERM at the end;
//   extender-healthz  GET /healthz answers 200 within 5 s at every check;
//   extender-honest   after an attack ends, a 2-GPU filter over the three
//                     nodes keeps both honest nodes and a prioritize scores
//                     them (bounded wait);
//   extender-lists    at most 10 LISTs in any 10 s (the informer backs off);
//   extender-memory   its RSS stays under 512 MiB (docs/extender.md's
//                     request) and its fds under 256.
#ifndef KDM_TEST_SOAK_SOAK_EXTENDER_H_
#define KDM_TEST_SOAK_SOAK_EXTENDER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "kdm/base/status.h"

namespace kdm::soak {

class ExtenderUnderAttack {
 public:
  struct Options {
    std::string kdm;  // the kdm binary
    std::string dir;  // for the kubeconfig, the CA and the extender's log
    uint64_t seed = 0;
    std::function<void(const std::string& line)> log;
    std::function<void(const std::string& kind, const std::string& detail)> violation;
    std::function<void(const std::string& check)> count;
  };

  // Starts the API server and the extender; waits (bounded) until the
  // extender serves and its watch is open.
  static StatusOr<std::unique_ptr<ExtenderUnderAttack>> Start(Options options);
  virtual ~ExtenderUnderAttack() = default;

  // Injects one attack; returns its name, for the report.
  virtual std::string Attack() = 0;
  // The quick checks: alive, /healthz, memory, the LIST rate.
  virtual void Check() = 0;
  // Ends attack modes, then checks that honest requests are answered right
  // (bounded wait) and everything Check() checks.
  virtual void Settle() = 0;
  // SIGTERM; a violation unless it exits 0 within 5 s (when `check`).
  virtual void Stop(bool check) = 0;
  // Counts for the report ("extender LISTs", "extender peak RSS MiB", ...).
  virtual std::map<std::string, int64_t> Report() const = 0;
};

}  // namespace kdm::soak

#endif  // KDM_TEST_SOAK_SOAK_EXTENDER_H_
