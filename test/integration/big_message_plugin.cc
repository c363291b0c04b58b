// A test helper process for hardening_test: a device plugin that serves
// SOCKET, answers GetDevicePluginOptions, and on ListAndWatch first sends
// two small devices (dev0, dev1), then, once the file TRIGGER exists, one
// message of MEGABYTES MiB (a single device whose id is that long), built
// only then. It runs in its own process so that the message it builds does
// not count in the test process's memory high-water mark.
//
// Usage: big_message_plugin SOCKET TRIGGER MEGABYTES
// Exits 0 on SIGTERM/SIGINT, 2 on bad usage, 1 when it cannot serve. Gives
// up (exit 3) if nothing asks it to stop within 120 s.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "deviceplugin/v1beta1/api.grpc.pb.h"

namespace {

std::atomic<bool> g_stop{false};

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

class BigPlugin final : public v1beta1::DevicePlugin::Service {
 public:
  BigPlugin(std::string trigger, long megabytes)
      : trigger_(std::move(trigger)), megabytes_(megabytes) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions*) override {
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    v1beta1::ListAndWatchResponse small;
    for (const char* id : {"dev0", "dev1"}) {
      auto* d = small.add_devices();
      d->set_id(id);
      d->set_health("Healthy");
    }
    if (!writer->Write(small)) return grpc::Status::OK;
    // Bounded poll for the trigger (the test creates it).
    for (int i = 0; i < 12'000 && !Exists(trigger_); ++i) {
      if (ctx->IsCancelled() || g_stop) return grpc::Status::OK;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    {
      v1beta1::ListAndWatchResponse big;
      auto* d = big.add_devices();
      d->set_id(std::string(static_cast<size_t>(megabytes_) << 20, 'x'));
      d->set_health("Healthy");
      std::fprintf(stderr, "big_message_plugin: sending %zu bytes\n", big.ByteSizeLong());
      writer->Write(big);
    }
    while (!ctx->IsCancelled() && !g_stop) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return grpc::Status::OK;
  }

 private:
  const std::string trigger_;
  const long megabytes_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: big_message_plugin SOCKET TRIGGER MEGABYTES\n");
    return 2;
  }
  const std::string socket = argv[1];
  const long megabytes = std::strtol(argv[3], nullptr, 10);
  if (megabytes <= 0 || megabytes > 1024) {
    std::fprintf(stderr, "big_message_plugin: MEGABYTES must be 1..1024\n");
    return 2;
  }
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  BigPlugin service(argv[2], megabytes);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + socket, grpc::InsecureServerCredentials());
  builder.SetMaxSendMessageSize(-1);  // unlimited: it must be able to send it
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    std::fprintf(stderr, "big_message_plugin: cannot serve %s\n", socket.c_str());
    return 1;
  }
  timespec limit{120, 0};
  int sig = sigtimedwait(&stop, nullptr, &limit);
  g_stop = true;
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server->Wait();
  ::unlink(socket.c_str());
  return sig > 0 ? 0 : 3;
}
