#include "kdm/publish/publish_loop.h"

#include <utility>

namespace kdm::publish {

std::unique_ptr<PublishLoop> PublishLoop::Start(PublishOptions options,
                                                std::unique_ptr<kube::DeviceSource> source,
                                                std::unique_ptr<kube::Client> client) {
  std::unique_ptr<PublishLoop> loop(new PublishLoop());
  loop->client_ = std::move(client);
  loop->writer_ =
      std::make_unique<kube::NodeAnnotationWriter>(loop->client_.get(), options.timeout);
  loop->source_ = std::move(source);
  kube::Publisher::Options publisher;
  publisher.node = std::move(options.node);
  publisher.topologies = std::move(options.topologies);
  publisher.attributes = std::move(options.attributes);
  publisher.interval = options.interval;
  publisher.min_write_interval = options.min_write_interval;
  publisher.resync = options.resync;
  loop->publisher_ = std::make_unique<kube::Publisher>(std::move(publisher), loop->source_.get(),
                                                       loop->writer_.get());
  kube::Publisher* p = loop->publisher_.get();
  loop->thread_ = std::thread([p] { p->Run(); });
  return loop;
}

void PublishLoop::Stop() {
  if (publisher_) publisher_->Stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace kdm::publish
