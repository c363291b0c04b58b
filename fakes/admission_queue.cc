#include "kdm/fakes/admission_queue.h"

#include <utility>

namespace kdm::fakes {

AdmissionQueue::AdmissionQueue(int threads) {
  kdm::MutexLock lock(&stop_mu_);
  if (threads < 1) threads = 1;
  workers_.reserve(threads);
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

AdmissionQueue::~AdmissionQueue() { Stop(); }

bool AdmissionQueue::Submit(std::set<std::string> keys, std::function<void()> job) {
  kdm::MutexLock lock(&mu_);
  if (stopping_) return false;
  queued_.push_back({std::move(keys), std::move(job)});
  return true;
}

void AdmissionQueue::Stop() {
  kdm::MutexLock stop_lock(&stop_mu_);
  {
    kdm::MutexLock lock(&mu_);
    stopping_ = true;
    queued_.clear();
  }
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
  workers_.clear();
}

int AdmissionQueue::queued() const {
  kdm::MutexLock lock(&mu_);
  return static_cast<int>(queued_.size());
}

int AdmissionQueue::running() const {
  kdm::MutexLock lock(&mu_);
  return running_;
}

std::deque<AdmissionQueue::Job>::iterator AdmissionQueue::FirstRunnableLocked() {
  // Keys claimed by running jobs and by queued jobs ahead of the one looked
  // at: a job may not pass an earlier one on any of its resources.
  std::set<std::string> ahead;
  for (auto it = queued_.begin(); it != queued_.end(); ++it) {
    bool blocked = false;
    for (const std::string& key : it->keys) {
      if (busy_.count(key) || ahead.count(key)) {
        blocked = true;
        break;
      }
    }
    if (!blocked) return it;
    ahead.insert(it->keys.begin(), it->keys.end());
  }
  return queued_.end();
}

bool AdmissionQueue::HasWorkOrStopping() {
  return stopping_ || FirstRunnableLocked() != queued_.end();
}

void AdmissionQueue::WorkerLoop() {
  while (true) {
    Job job;
    {
      kdm::MutexLock lock(&mu_);
      // No timeout: Submit and the end of every job release mu_, which
      // re-evaluates the condition; Stop sets stopping_.
      mu_.Await(kdm::Condition(this, &AdmissionQueue::HasWorkOrStopping));
      if (stopping_) return;
      auto it = FirstRunnableLocked();
      job = std::move(*it);
      queued_.erase(it);
      for (const std::string& key : job.keys) busy_.insert(key);
      ++running_;
    }
    job.run();
    kdm::MutexLock lock(&mu_);
    for (const std::string& key : job.keys) busy_.erase(busy_.find(key));
    --running_;
  }
}

}  // namespace kdm::fakes
