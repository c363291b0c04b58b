// FakeRegistrationServer: a small test-only kubelet side of the device plugin
// API. It serves v1beta1.Registration on <dir>/kubelet.sock and, on each
// accepted Register, dials the plugin back, reads its options and follows its
// ListAndWatch stream, recording every snapshot.
//
// Thread-safety: all methods are thread-safe. Owns one reader thread per
// accepted registration; Stop() cancels and joins them.
#ifndef KDM_TEST_PLUGINAPI_FAKE_REGISTRATION_SERVER_H_
#define KDM_TEST_PLUGINAPI_FAKE_REGISTRATION_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "kdm/pluginapi/unix_target.h"

namespace kdm::testing {

class FakeRegistrationServer final : public v1beta1::Registration::Service {
 public:
  explicit FakeRegistrationServer(std::string dir) : dir_(std::move(dir)) {}
  ~FakeRegistrationServer() override { Stop(); }

  // Binds <dir>/kubelet.sock. Returns false if it cannot.
  bool Start() {
    std::filesystem::remove(SocketPath());
    grpc::ServerBuilder builder;
    StatusOr<std::string> target = pluginapi::UnixSocketTarget(SocketPath());
    if (!target.ok()) return false;
    builder.AddListeningPort(*target, grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    return server_ != nullptr;
  }

  // Stops serving, removes kubelet.sock, ends and joins every reader.
  void Stop() {
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
      server_->Wait();
      server_.reset();
      std::filesystem::remove(SocketPath());
    }
    std::vector<std::unique_ptr<Reader>> readers;
    {
      std::lock_guard lock(mu_);
      readers.swap(readers_);
    }
    for (auto& r : readers) {
      r->context.TryCancel();
      if (r->thread.joinable()) r->thread.join();
    }
  }

  std::string SocketPath() const { return dir_ + "/kubelet.sock"; }

  // Makes the next Register calls fail with INVALID_ARGUMENT and this text
  // (nullopt: accept again).
  void SetRefusal(std::optional<std::string> message) {
    std::lock_guard lock(mu_);
    refusal_ = std::move(message);
  }

  std::vector<v1beta1::RegisterRequest> Requests() const {
    std::lock_guard lock(mu_);
    return requests_;
  }

  // Options the plugin answered on dial-back, per accepted registration.
  std::vector<v1beta1::DevicePluginOptions> DialedOptions() const {
    std::lock_guard lock(mu_);
    return options_;
  }

  // Waits until at least `n` snapshots were received on any stream; returns
  // all snapshots received so far (in arrival order).
  std::vector<v1beta1::ListAndWatchResponse> WaitForSnapshots(
      size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return snapshots_.size() >= n; });
    return snapshots_;
  }

  // Waits until a snapshot satisfying `pred` arrives; returns it.
  template <typename Pred>
  std::optional<v1beta1::ListAndWatchResponse> WaitForSnapshot(
      Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const {
    std::unique_lock lock(mu_);
    std::optional<v1beta1::ListAndWatchResponse> found;
    cv_.wait_for(lock, timeout, [&] {
      for (const auto& s : snapshots_) {
        if (pred(s)) {
          found = s;
          return true;
        }
      }
      return false;
    });
    return found;
  }

  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* request,
                        v1beta1::Empty*) override {
    {
      std::lock_guard lock(mu_);
      requests_.push_back(*request);
      if (refusal_) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, *refusal_);
    }
    StatusOr<std::string> target = pluginapi::UnixSocketTarget(dir_ + "/" + request->endpoint());
    if (!target.ok())
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, target.status().message());
    auto channel = grpc::CreateChannel(*target, grpc::InsecureChannelCredentials());
    auto stub = v1beta1::DevicePlugin::NewStub(channel);
    v1beta1::DevicePluginOptions options;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      v1beta1::Empty empty;
      grpc::Status s = stub->GetDevicePluginOptions(&ctx, empty, &options);
      if (!s.ok())
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "dial back: " + s.error_message());
    }
    {
      // Recorded before the stream starts, so a test that saw a snapshot
      // also sees the options.
      std::lock_guard lock(mu_);
      options_.push_back(options);
    }
    auto reader = std::make_unique<Reader>();
    Reader* r = reader.get();
    r->stub = std::move(stub);
    r->thread = std::thread([this, r] {
      v1beta1::Empty empty;
      auto stream = r->stub->ListAndWatch(&r->context, empty);
      v1beta1::ListAndWatchResponse msg;
      while (stream->Read(&msg)) {
        std::lock_guard lock(mu_);
        snapshots_.push_back(msg);
        cv_.notify_all();
      }
      stream->Finish();
    });
    std::lock_guard lock(mu_);
    readers_.push_back(std::move(reader));
    return grpc::Status::OK;
  }

 private:
  struct Reader {
    std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;
    grpc::ClientContext context;
    std::thread thread;
  };

  const std::string dir_;
  std::unique_ptr<grpc::Server> server_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::optional<std::string> refusal_;
  std::vector<v1beta1::RegisterRequest> requests_;
  std::vector<v1beta1::DevicePluginOptions> options_;
  std::vector<v1beta1::ListAndWatchResponse> snapshots_;
  std::vector<std::unique_ptr<Reader>> readers_;
};

// A short private directory for sockets (a unix socket path has at most 107
// usable bytes, so never under a long build path). Removed on destruction.
class TempSocketDir {
 public:
  TempSocketDir() {
    char tmpl[] = "/tmp/kdm-XXXXXX";
    char* made = ::mkdtemp(tmpl);
    path_ = made ? made : "";
  }
  ~TempSocketDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace kdm::testing

#endif  // KDM_TEST_PLUGINAPI_FAKE_REGISTRATION_SERVER_H_
