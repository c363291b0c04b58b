// kdm::fakes::AdmissionQueue: runs the node agent's pod admissions
// concurrently where they share no device resource, and in submission order
// where they do.
//
// Why: an admission calls the resource's plugin (GetPreferredAllocation,
// Allocate, PreStartContainer), each bounded by a deadline but possibly
// hung until it. Run one after another, one hung plugin delays every pod on
// the node by that deadline; run here, it delays only the pods that ask for
// its resource. Pods asking for the same resource keep the kubelet's order
// (first come, first served), so a later pod never takes devices an earlier
// one was waiting for.
//
// A job is keyed by the set of resources its pod asks for. It starts once no
// job submitted before it that shares a key is queued or running; jobs with
// no shared key run side by side, up to the number of worker threads. A job
// with no key (a pod without device resources) starts as soon as a worker is
// free.
//
// Threads: `threads` workers, started by the constructor, joined by Stop()
// (or the destructor). Thread-safety: every method may be called from any
// thread; Stop() must not be called from a job.
//
// Example:
//   AdmissionQueue queue(8);
//   queue.Submit({"vendor.com/gpu"}, [&] { Admit(pod); });
//   ...
//   queue.Stop();  // drops jobs not started, waits for running ones
#ifndef KDM_FAKES_ADMISSION_QUEUE_H_
#define KDM_FAKES_ADMISSION_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kdm/base/sync.h"

namespace kdm::fakes {

class AdmissionQueue {
 public:
  // REQUIRES: threads >= 1.
  explicit AdmissionQueue(int threads);
  ~AdmissionQueue();
  AdmissionQueue(const AdmissionQueue&) = delete;
  AdmissionQueue& operator=(const AdmissionQueue&) = delete;

  // Queues `job`, keyed by `keys`. Returns false (and drops the job) after
  // Stop().
  bool Submit(std::set<std::string> keys, std::function<void()> job) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops the jobs that have not started, waits for the running ones and
  // joins the workers. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Jobs queued but not started, and jobs running now.
  int queued() const ABSL_LOCKS_EXCLUDED(mu_);
  int running() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job {
    std::set<std::string> keys;
    std::function<void()> run;
  };
  // The first queued job that may start now, or queued_.end().
  std::deque<Job>::iterator FirstRunnableLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasWorkOrStopping() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);

  mutable kdm::Mutex mu_;
  std::deque<Job> queued_ ABSL_GUARDED_BY(mu_);           // submission order
  std::multiset<std::string> busy_ ABSL_GUARDED_BY(mu_);  // keys of running jobs
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // Owned by the constructor and Stop(); Stop() joins them.
  kdm::Mutex stop_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(stop_mu_);
};

}  // namespace kdm::fakes

#endif  // KDM_FAKES_ADMISSION_QUEUE_H_
