// gMock stand-ins for a device plugin as the device manager sees it: the
// generated v1beta1::DevicePlugin::StubInterface (every plugin RPC), plus a
// scripted ListAndWatch stream. Use StrictMock<MockDevicePluginStub> so an
// unexpected RPC fails the test.
//
// Thread-safety: gMock mocks are thread-safe; FakeListAndWatch may be driven
// from the test thread while the Endpoint's reader thread reads it.
//
// Example:
//   auto stub = std::make_shared<StrictMock<MockDevicePluginStub>>();
//   auto stream = std::make_shared<FakeListAndWatch>();
//   stream->Push(Snapshot({{"gpu0", true}}));
//   EXPECT_CALL(*stub, GetDevicePluginOptions).WillOnce(Return(grpc::Status::OK));
//   EXPECT_CALL(*stub, ListAndWatchRaw).WillOnce(Return(stream->NewReader()));
//   ...
//   stream->Close();  // before the endpoint stops: the fake ignores cancellation
#ifndef KDM_TEST_MOCKS_MOCK_DEVICE_PLUGIN_H_
#define KDM_TEST_MOCKS_MOCK_DEVICE_PLUGIN_H_

#include <gmock/gmock.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "deviceplugin/v1beta1/api.grpc.pb.h"

namespace kdm::testing {

class MockDevicePluginStub : public v1beta1::DevicePlugin::StubInterface {
 public:
  MOCK_METHOD(grpc::Status, GetDevicePluginOptions,
              (grpc::ClientContext*, const v1beta1::Empty&, v1beta1::DevicePluginOptions*),
              (override));
  MOCK_METHOD(grpc::Status, GetPreferredAllocation,
              (grpc::ClientContext*, const v1beta1::PreferredAllocationRequest&,
               v1beta1::PreferredAllocationResponse*),
              (override));
  MOCK_METHOD(grpc::Status, Allocate,
              (grpc::ClientContext*, const v1beta1::AllocateRequest&, v1beta1::AllocateResponse*),
              (override));
  MOCK_METHOD(grpc::Status, PreStartContainer,
              (grpc::ClientContext*, const v1beta1::PreStartContainerRequest&,
               v1beta1::PreStartContainerResponse*),
              (override));
  MOCK_METHOD((grpc::ClientReaderInterface<v1beta1::ListAndWatchResponse>*), ListAndWatchRaw,
              (grpc::ClientContext*, const v1beta1::Empty&), (override));

  // The asynchronous API is never used by kdm; StrictMock fails on a call.
  MOCK_METHOD((grpc::ClientAsyncResponseReaderInterface<v1beta1::DevicePluginOptions>*),
              AsyncGetDevicePluginOptionsRaw,
              (grpc::ClientContext*, const v1beta1::Empty&, grpc::CompletionQueue*), (override));
  MOCK_METHOD((grpc::ClientAsyncResponseReaderInterface<v1beta1::DevicePluginOptions>*),
              PrepareAsyncGetDevicePluginOptionsRaw,
              (grpc::ClientContext*, const v1beta1::Empty&, grpc::CompletionQueue*), (override));
  MOCK_METHOD((grpc::ClientAsyncReaderInterface<v1beta1::ListAndWatchResponse>*),
              AsyncListAndWatchRaw,
              (grpc::ClientContext*, const v1beta1::Empty&, grpc::CompletionQueue*, void*),
              (override));
  MOCK_METHOD((grpc::ClientAsyncReaderInterface<v1beta1::ListAndWatchResponse>*),
              PrepareAsyncListAndWatchRaw,
              (grpc::ClientContext*, const v1beta1::Empty&, grpc::CompletionQueue*), (override));
  MOCK_METHOD((grpc::ClientAsyncResponseReaderInterface<v1beta1::PreferredAllocationResponse>*),
              AsyncGetPreferredAllocationRaw,
              (grpc::ClientContext*, const v1beta1::PreferredAllocationRequest&,
               grpc::CompletionQueue*),
              (override));
  MOCK_METHOD((grpc::ClientAsyncResponseReaderInterface<v1beta1::PreferredAllocationResponse>*),
              PrepareAsyncGetPreferredAllocationRaw,
              (grpc::ClientContext*, const v1beta1::PreferredAllocationRequest&,
               grpc::CompletionQueue*),
              (override));
  MOCK_METHOD((grpc::ClientAsyncResponseReaderInterface<v1beta1::AllocateResponse>*),
              AsyncAllocateRaw,
              (grpc::ClientContext*, const v1beta1::AllocateRequest&, grpc::CompletionQueue*),
              (override));
  MOCK_METHOD((grpc::ClientAsyncResponseReaderInterface<v1beta1::AllocateResponse>*),
              PrepareAsyncAllocateRaw,
              (grpc::ClientContext*, const v1beta1::AllocateRequest&, grpc::CompletionQueue*),
              (override));
  MOCK_METHOD((grpc::ClientAsyncResponseReaderInterface<v1beta1::PreStartContainerResponse>*),
              AsyncPreStartContainerRaw,
              (grpc::ClientContext*, const v1beta1::PreStartContainerRequest&,
               grpc::CompletionQueue*),
              (override));
  MOCK_METHOD((grpc::ClientAsyncResponseReaderInterface<v1beta1::PreStartContainerResponse>*),
              PrepareAsyncPreStartContainerRaw,
              (grpc::ClientContext*, const v1beta1::PreStartContainerRequest&,
               grpc::CompletionQueue*),
              (override));
};

// A scripted server stream: Push() queues a ListAndWatch message, Close()
// ends the stream with `status`. Readers block in Read() until one of the two.
class FakeListAndWatch : public std::enable_shared_from_this<FakeListAndWatch> {
 public:
  void Push(v1beta1::ListAndWatchResponse message) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(message));
    cv_.notify_all();
  }
  void Close(grpc::Status status = grpc::Status::OK) {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    status_ = std::move(status);
    cv_.notify_all();
  }
  // A reader over this stream, owned by the caller (as ListAndWatchRaw's is).
  grpc::ClientReaderInterface<v1beta1::ListAndWatchResponse>* NewReader() {
    return new Reader(shared_from_this());
  }

 private:
  class Reader : public grpc::ClientReaderInterface<v1beta1::ListAndWatchResponse> {
   public:
    explicit Reader(std::shared_ptr<FakeListAndWatch> s) : s_(std::move(s)) {}
    bool Read(v1beta1::ListAndWatchResponse* msg) override {
      std::unique_lock<std::mutex> lock(s_->mu_);
      s_->cv_.wait(lock, [&] { return !s_->queue_.empty() || s_->closed_; });
      if (s_->queue_.empty()) return false;
      *msg = std::move(s_->queue_.front());
      s_->queue_.pop_front();
      return true;
    }
    grpc::Status Finish() override {
      std::lock_guard<std::mutex> lock(s_->mu_);
      return s_->status_;
    }
    bool NextMessageSize(uint32_t* sz) override {
      *sz = UINT32_MAX;
      return true;
    }
    void WaitForInitialMetadata() override {}

   private:
    std::shared_ptr<FakeListAndWatch> s_;
  };

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1beta1::ListAndWatchResponse> queue_;
  bool closed_ = false;
  grpc::Status status_;
};

// One ListAndWatch message. `numa` < 0: no topology.
struct TestDevice {
  std::string id;
  bool healthy = true;
  int64_t numa = -1;
};
inline v1beta1::ListAndWatchResponse Snapshot(const std::vector<TestDevice>& devices) {
  v1beta1::ListAndWatchResponse r;
  for (const auto& d : devices) {
    auto* dev = r.add_devices();
    dev->set_id(d.id);
    dev->set_health(d.healthy ? "Healthy" : "Unhealthy");
    if (d.numa >= 0) dev->mutable_topology()->add_nodes()->set_id(d.numa);
  }
  return r;
}

}  // namespace kdm::testing

#endif  // KDM_TEST_MOCKS_MOCK_DEVICE_PLUGIN_H_
