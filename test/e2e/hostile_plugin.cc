// kdm_hostile_plugin: a device plugin process that attacks the node agent the
// way the hardening round found it could be attacked. It speaks v1beta1
// directly (no SDK), so it can break the rules the SDK keeps.
//
// Usage:
//   kdm_hostile_plugin --plugin-dir DIR --resource NAME [--count N]
//                      [--flap-ms MS --flap-for SECONDS]
//                      [--hang allocate|prestart] [--forge] [--lifetime S]
//
//   --count N       devices dev-0 ... dev-(N-1) (default 4)
//   --flap-ms MS    ListAndWatch re-sends the device list every MS ms with
//                   dev-0's health flipped each time, for --flap-for seconds
//                   (default 10), then sends every device healthy and holds
//                   the stream quietly. It writes
//                   "flap_started" and "flap_ended" to stderr.
//   --hang WHAT     Allocate (or PreStartContainer, which it then asks for)
//                   blocks until the caller gives up (its deadline) or the
//                   process stops.
//   --forge         plugin-chosen text tries to forge log lines: device ids
//                   hold "\nevent=forged", GetPreferredAllocation answers an
//                   invalid set of such ids, Allocate fails with a 3 MB error
//                   text holding forged lines.
//
//   --lifetime S    gives up (exit 3) after S seconds (default 300).
//
// It registers with DIR/kubelet.sock once serving, and again whenever the
// registration socket is created anew; when its own socket is removed (a
// kubelet starting clears the directory) it serves on a new one first.
// Exits 0 on SIGTERM/SIGINT, 2 on bad usage.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "deviceplugin/v1beta1/api.grpc.pb.h"

namespace {

using namespace std::chrono_literals;

std::atomic<bool> g_stop{false};

struct Flags {
  std::string plugin_dir;
  std::string resource;
  int count = 4;
  int flap_ms = 0;
  int flap_for_s = 10;
  std::string hang;  // "", "allocate", "prestart"
  bool forge = false;
  int lifetime_s = 300;
};

constexpr char kForged[] = "\nevent=forged_by_plugin severity=critical\n";

std::string DeviceId(const Flags& f, int i) {
  std::string id = "dev-" + std::to_string(i);
  if (f.forge && i == 1) id += kForged;
  return id;
}

// Blocks until the call is cancelled (its deadline) or the process stops;
// bounded by the process's own 300 s limit.
void HoldUntilCancelled(grpc::ServerContext* ctx) {
  while (!ctx->IsCancelled() && !g_stop) std::this_thread::sleep_for(5ms);
}

class HostilePlugin final : public v1beta1::DevicePlugin::Service {
 public:
  explicit HostilePlugin(Flags flags) : f_(std::move(flags)) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* options) override {
    options->set_pre_start_required(f_.hang == "prestart");
    options->set_get_preferred_allocation_available(f_.forge);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    bool dev0_healthy = true;
    auto snapshot = [&] {
      v1beta1::ListAndWatchResponse r;
      for (int i = 0; i < f_.count; ++i) {
        auto* d = r.add_devices();
        d->set_id(DeviceId(f_, i));
        d->set_health(i == 0 && !dev0_healthy ? "Unhealthy" : "Healthy");
      }
      return r;
    };
    if (!writer->Write(snapshot())) return grpc::Status::OK;
    if (f_.flap_ms > 0) {
      std::fprintf(stderr, "flap_started\n");
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(f_.flap_for_s);
      while (std::chrono::steady_clock::now() < end && !ctx->IsCancelled() && !g_stop) {
        dev0_healthy = !dev0_healthy;
        if (!writer->Write(snapshot())) return grpc::Status::OK;
        std::this_thread::sleep_for(std::chrono::milliseconds(f_.flap_ms));
      }
      if (!dev0_healthy) {
        // The flap ends with every device healthy, so that watchers know
        // the final state.
        dev0_healthy = true;
        if (!writer->Write(snapshot())) return grpc::Status::OK;
      }
      std::fprintf(stderr, "flap_ended\n");
    }
    HoldUntilCancelled(ctx);
    return grpc::Status::OK;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* response) override {
    for (int i = 0; i < request->container_requests_size(); ++i) {
      auto* c = response->add_container_responses();
      // Ids it never offered, with forged lines: must be refused and quoted.
      c->add_deviceids(std::string("ghost") + kForged);
      c->add_deviceids(std::string(100'000, 'g') + kForged);
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext* ctx, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) override {
    if (f_.hang == "allocate") {
      std::fprintf(stderr, "allocate_hanging\n");
      HoldUntilCancelled(ctx);
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "hung until the deadline");
    }
    if (f_.forge) {
      std::string text = std::string("no") + kForged + std::string(3 << 20, 'x') + kForged;
      return grpc::Status(grpc::StatusCode::INTERNAL, text);
    }
    for (int i = 0; i < request->container_requests_size(); ++i) {
      auto* c = response->add_container_responses();
      (*c->mutable_envs())["HOSTILE_DEVICES"] =
          std::to_string(request->container_requests(i).devices_ids_size());
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext* ctx, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override {
    if (f_.hang == "prestart") {
      std::fprintf(stderr, "prestart_hanging\n");
      HoldUntilCancelled(ctx);
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "hung until the deadline");
    }
    return grpc::Status::OK;
  }

 private:
  const Flags f_;
};

bool Register(const Flags& f, const std::string& endpoint) {
  auto channel = grpc::CreateChannel(
      "unix:" + std::filesystem::absolute(f.plugin_dir + "/kubelet.sock").string(),
      grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest request;
  request.set_version("v1beta1");
  request.set_endpoint(endpoint);
  request.set_resource_name(f.resource);
  request.mutable_options()->set_pre_start_required(f.hang == "prestart");
  request.mutable_options()->set_get_preferred_allocation_available(f.forge);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 30s);
  v1beta1::Empty empty;
  grpc::Status s = stub->Register(&ctx, request, &empty);
  if (!s.ok()) std::fprintf(stderr, "register failed: %s\n", s.error_message().c_str());
  return s.ok();
}

// Which file a socket path names now: inode and change time, so a socket
// removed and made again is told apart even when its inode number is reused.
// All zero when absent.
struct FileId {
  ino_t ino = 0;
  long ctime_ns = 0;
  bool operator==(const FileId&) const = default;
};
FileId IdOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return {};
  return {st.st_ino, st.st_ctim.tv_sec * 1'000'000'000L + st.st_ctim.tv_nsec};
}

// One server on the plugin's socket, with its own service object.
struct Serving {
  std::unique_ptr<HostilePlugin> service;
  std::unique_ptr<grpc::Server> server;
  FileId socket_id;

  void Stop() {
    if (!server) return;
    server->Shutdown(std::chrono::system_clock::now() + 1s);
    server->Wait();
    server.reset();
    service.reset();
  }
};

// Serves on `socket` (removing what is there first).
bool Serve(const Flags& f, const std::string& socket, Serving* out) {
  ::unlink(socket.c_str());
  std::error_code ec;
  if (!std::filesystem::is_directory(f.plugin_dir, ec)) return false;
  out->service = std::make_unique<HostilePlugin>(f);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(out->service.get());
  out->server = builder.BuildAndStart();
  if (!out->server) return false;
  out->socket_id = IdOf(socket);
  return true;
}

int Usage(const char* why) {
  std::fprintf(stderr,
               "kdm_hostile_plugin: %s\nusage: kdm_hostile_plugin --plugin-dir DIR --resource NAME "
               "[--count N] [--flap-ms MS --flap-for S] [--hang allocate|prestart] [--forge] "
               "[--lifetime S]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--forge") {
      f.forge = true;
    } else if (a == "--plugin-dir" && (v = value())) {
      f.plugin_dir = v;
    } else if (a == "--resource" && (v = value())) {
      f.resource = v;
    } else if (a == "--count" && (v = value())) {
      f.count = std::atoi(v);
    } else if (a == "--flap-ms" && (v = value())) {
      f.flap_ms = std::atoi(v);
    } else if (a == "--flap-for" && (v = value())) {
      f.flap_for_s = std::atoi(v);
    } else if (a == "--lifetime" && (v = value())) {
      f.lifetime_s = std::atoi(v);
    } else if (a == "--hang" && (v = value())) {
      f.hang = v;
    } else {
      return Usage(("bad argument: " + a).c_str());
    }
  }
  if (f.plugin_dir.empty() || f.resource.empty())
    return Usage("--plugin-dir and --resource needed");
  if (f.count < 1 || f.count > 1000) return Usage("--count must be 1..1000");
  if (f.lifetime_s < 1) return Usage("--lifetime must be 1 or more seconds");
  if (f.hang != "" && f.hang != "allocate" && f.hang != "prestart") return Usage("bad --hang");

  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const std::string endpoint = "hostile-" + std::to_string(::getpid()) + ".sock";
  const std::string socket = std::filesystem::absolute(f.plugin_dir + "/" + endpoint).string();
  Serving serving;
  const std::string kubelet_socket = f.plugin_dir + "/kubelet.sock";
  FileId registered_with;
  int code = 3;
  bool said_cannot_serve = false;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(f.lifetime_s);
  while (std::chrono::steady_clock::now() < give_up) {
    // Serves once the plugin directory exists; and when its socket is
    // removed (a kubelet that starts clears the directory), serves again on
    // a fresh one, as a real plugin does.
    // No recorded identity (the socket went between bind and stat) counts
    // as lost too.
    if (!serving.server || serving.socket_id == FileId{} || !(IdOf(socket) == serving.socket_id)) {
      const bool again = serving.server != nullptr;
      serving.Stop();
      if (Serve(f, socket, &serving)) {
        registered_with = {};
        if (again) std::fprintf(stderr, "serving_again\n");
      } else {
        serving.Stop();
        if (!said_cannot_serve) {
          std::fprintf(stderr, "kdm_hostile_plugin: cannot serve %s yet\n", socket.c_str());
          said_cannot_serve = true;
        }
      }
    }
    FileId now = IdOf(kubelet_socket);
    if (serving.server && !(now == FileId{}) && !(now == registered_with) &&
        Register(f, endpoint)) {
      registered_with = now;
      std::fprintf(stderr, "registered\n");
    }
    timespec tick{0, 50'000'000};
    if (sigtimedwait(&stop, nullptr, &tick) > 0) {
      code = 0;
      break;
    }
  }
  g_stop = true;
  serving.Stop();
  ::unlink(socket.c_str());
  return code;
}
