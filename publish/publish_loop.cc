#include "kdm/publish/publish_loop.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <optional>
#include <string>
#include <utility>

#include "kdm/base/log_rate_limiter.h"
#include "kdm/base/log_value.h"
#include "kdm/k8s/devices_annotation.h"

namespace kdm::publish {

// Refuses, without sending, a value the API server would refuse (and so
// would every kdm reader); the Publisher retries later with the then newest
// value, as after any failed write.
class PublishLoop::SizeCheckingWriter : public kube::AnnotationWriter {
 public:
  explicit SizeCheckingWriter(kube::AnnotationWriter* next) : next_(next) {}
  Status Write(const std::string& node, const std::string& value) override {
    if (value.size() <= k8s::kMaxAnnotationBytes) return next_->Write(node, value);
    const uint64_t total = ++too_large_;
    // At most one write attempt per poll: one line a minute says it all.
    if (std::optional<int64_t> suppressed = log_limiter_.Admit("too_large", Clock::now())) {
      spdlog::error(
          "event=publish_annotation_too_large node={} bytes={} limit={} total={} suppressed={}",
          QuoteLogValue(node, kMaxLogValueBytes), value.size(), k8s::kMaxAnnotationBytes, total,
          *suppressed);
    }
    return OutOfRangeError("kdm.io/devices: the value is " + std::to_string(value.size()) +
                           " bytes, over the limit of " + std::to_string(k8s::kMaxAnnotationBytes) +
                           " bytes; not sent");
  }
  uint64_t too_large() const { return too_large_.load(); }

 private:
  using Clock = LogRateLimiter::Clock;
  kube::AnnotationWriter* const next_;
  std::atomic<uint64_t> too_large_{0};
  LogRateLimiter log_limiter_{1, std::chrono::minutes(1)};  // Write's thread only
};

std::unique_ptr<PublishLoop> PublishLoop::Start(PublishOptions options,
                                                std::unique_ptr<kube::DeviceSource> source,
                                                std::unique_ptr<kube::Client> client) {
  std::unique_ptr<PublishLoop> loop(new PublishLoop());
  loop->client_ = std::move(client);
  loop->writer_ =
      std::make_unique<kube::NodeAnnotationWriter>(loop->client_.get(), options.timeout);
  loop->checked_writer_ = std::make_unique<SizeCheckingWriter>(loop->writer_.get());
  loop->source_ = std::move(source);
  kube::Publisher::Options publisher;
  publisher.node = std::move(options.node);
  publisher.topologies = std::move(options.topologies);
  publisher.attributes = std::move(options.attributes);
  publisher.policies = std::move(options.policies);
  publisher.interval = options.interval;
  publisher.min_write_interval = options.min_write_interval;
  publisher.resync = options.resync;
  loop->publisher_ = std::make_unique<kube::Publisher>(std::move(publisher), loop->source_.get(),
                                                       loop->checked_writer_.get());
  kube::Publisher* p = loop->publisher_.get();
  loop->thread_ = std::thread([p] { p->Run(); });
  return loop;
}

PublishLoop::~PublishLoop() { Stop(); }

void PublishLoop::Stop() {
  if (publisher_) publisher_->Stop();
  // A write in flight ends now, not at --timeout.
  if (writer_) writer_->Cancel();
  if (thread_.joinable()) thread_.join();
}

uint64_t PublishLoop::annotations_too_large() const { return checked_writer_->too_large(); }

}  // namespace kdm::publish
