// alloc_e2e_bench: the cost of admitting one 2-GPU container, end to end, and
// the floor it is measured against, in one process and one run.
//
// The path: a Manager (SQLite checkpoint, WAL, synchronous=FULL as
// `kdm kubelet` opens it) and a FakeDevicePlugin (dgx1-v100, policy packed)
// that registered over a real unix socket. One admission is
// Manager::Allocate for a pod with one container asking for 2 GPUs:
// GetPreferredAllocation and Allocate over gRPC, then the checkpoint commit.
// After each admission the pod is removed (RemovePod, its own commit, not
// timed), so every admission sees the same 8 free GPUs.
//
// The floor, measured interleaved with the admissions (one of each per
// round, so both see the same machine load):
//   - two bare unary round trips (v1beta1 GetDevicePluginOptions, answered
//     by a handler that does nothing) over a unix socket, on a channel built
//     as the Manager builds its endpoints' channels;
//   - one bare SQLite commit (BEGIN IMMEDIATE; INSERT OR REPLACE; COMMIT) in
//     WAL mode with the same synchronous level as the Manager's store;
//   floor = p50(two round trips) + p50(commit).
//
// Files (the checkpoint and the floor's database) live in a temporary
// directory under $KDM_BENCH_DIR (default: the current directory), which
// should be a real disk; sockets live in a short directory under /tmp.
//
// Flags: --iterations=N (default 2000), --warmup=N (default 50),
//        --sync=full|normal (default full), --json=PATH (append figures).
// Output: one JSON line per figure (bench/e2e/bench_output.h).
//   build-release/bin/bench/alloc_e2e_bench --iterations=2000
#include <grpcpp/grpcpp.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "kdm/bench/e2e/bench_output.h"
#include "kdm/checkpoint/sqlite_store.h"
#include "kdm/devicemanager/manager.h"
#include "kdm/fakes/gpu_plugin.h"
#include "kdm/pluginapi/unix_target.h"

namespace kdm::bench {
namespace {

using namespace std::chrono_literals;
namespace dm = kdm::devicemanager;

constexpr char kGpu[] = "nvidia.com/gpu";

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "alloc_e2e_bench: %s\n", what.c_str());
  std::exit(1);
}

std::string MakeTempDir(const std::string& base, const char* prefix) {
  std::string tmpl = base + "/" + prefix + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) Die("mkdtemp " + tmpl + " failed");
  return tmpl;
}

// A DevicePlugin service whose GetDevicePluginOptions does nothing: the
// cheapest unary call there is.
class BareService final : public v1beta1::DevicePlugin::Service {
 public:
  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions*) override {
    return grpc::Status::OK;
  }
};

// The bare SQLite commit: same journal mode and synchronous level as the
// Manager's store, one small row per transaction.
class BareSqlite {
 public:
  BareSqlite(const std::string& path, bool full) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) Die("sqlite3_open " + path);
    Exec("PRAGMA journal_mode=WAL");
    Exec(full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL");
    Exec("CREATE TABLE IF NOT EXISTS t(k TEXT PRIMARY KEY, v BLOB NOT NULL)");
    Prepare("BEGIN IMMEDIATE", &begin_);
    Prepare("COMMIT", &commit_);
    Prepare("INSERT OR REPLACE INTO t(k, v) VALUES('pod-main-gpu', ?1)", &insert_);
    Prepare("DELETE FROM t WHERE k = 'pod-main-gpu'", &delete_);
  }
  ~BareSqlite() {
    for (sqlite3_stmt* s : {begin_, commit_, insert_, delete_}) sqlite3_finalize(s);
    sqlite3_close(db_);
  }

  // One transaction inserting a row about the size of a recorded
  // Allocate response.
  void CommitInsert() {
    static const std::string blob(300, 'x');
    Step(begin_);
    sqlite3_bind_blob(insert_, 1, blob.data(), static_cast<int>(blob.size()), SQLITE_STATIC);
    Step(insert_);
    Step(commit_);
  }
  void CommitDelete() {
    Step(begin_);
    Step(delete_);
    Step(commit_);
  }

 private:
  void Exec(const char* sql) {
    if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) != SQLITE_OK) {
      Die(std::string(sql) + ": " + sqlite3_errmsg(db_));
    }
  }
  void Prepare(const char* sql, sqlite3_stmt** out) {
    if (sqlite3_prepare_v2(db_, sql, -1, out, nullptr) != SQLITE_OK) {
      Die(std::string(sql) + ": " + sqlite3_errmsg(db_));
    }
  }
  void Step(sqlite3_stmt* s) {
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) Die(std::string("sqlite3_step: ") + sqlite3_errmsg(db_));
  }

  sqlite3* db_ = nullptr;
  sqlite3_stmt* begin_ = nullptr;
  sqlite3_stmt* commit_ = nullptr;
  sqlite3_stmt* insert_ = nullptr;
  sqlite3_stmt* delete_ = nullptr;
};

dm::Pod TwoGpuPod(long i) {
  dm::Pod pod;
  pod.uid = "bench-pod-" + std::to_string(i);
  pod.namespace_name = "default";
  pod.name = "bench-" + std::to_string(i);
  dm::Container c;
  c.name = "main";
  c.limits[kGpu] = dm::Quantity::FromInt(2);
  pod.containers.push_back(c);
  return pod;
}

int Main(int argc, char** argv) {
  const long iterations = IntFlag(argc, argv, "iterations", 2000);
  const long warmup = IntFlag(argc, argv, "warmup", 50);
  const std::string sync = FlagValue(argc, argv, "sync", "full");
  if (sync != "full" && sync != "normal") Die("--sync: want full or normal, got " + sync);
  const bool full = sync == "full";
  Figures out("alloc_e2e", FlagValue(argc, argv, "json"));

  const char* base_env = std::getenv("KDM_BENCH_DIR");
  const std::string data_dir =
      MakeTempDir(base_env != nullptr && *base_env != '\0' ? base_env : ".", "kdm-alloc-bench-");
  const std::string sock_dir = MakeTempDir("/tmp", "kdm-b-");

  // The Manager logs one line per allocation, as in `kdm kubelet`; keep the
  // formatting cost but not the noise on stdout.
  spdlog::set_default_logger(spdlog::basic_logger_mt("bench", data_dir + "/manager.log"));

  checkpoint::SqliteOptions so;
  so.path = data_dir + "/checkpoint.db";
  so.synchronous_full = full;
  auto opened = checkpoint::OpenSqliteStore(so);
  if (!opened.ok()) Die("open store: " + opened.status().ToString());

  dm::Manager::Options mo;
  mo.plugin_dir = sock_dir;
  mo.store = std::shared_ptr<checkpoint::Store>(std::move(opened->store));
  auto manager = dm::Manager::Create(std::move(mo));
  if (!manager.ok()) Die("Manager::Create: " + manager.status().ToString());
  if (Status s = (*manager)->Start(); !s.ok()) Die("Manager::Start: " + s.ToString());

  fakes::PluginConfig pc;
  pc.resource_name = kGpu;
  pc.plugin_dir = sock_dir;
  pc.preset = "dgx1-v100";
  pc.policy = topology::Policy::kPacked;
  auto plugin = fakes::FakeDevicePlugin::Create(std::move(pc));
  if (!plugin.ok()) Die("plugin: " + plugin.status().ToString());
  if (Status s = (*plugin)->Start(); !s.ok()) Die("plugin Start: " + s.ToString());
  if (!WaitUntil([&] { return (*manager)->GetCapacity().resources[kGpu].allocatable == 8; }, 10s,
                 1ms)) {
    Die("the plugin did not register 8 GPUs within 10 s");
  }

  // The floor's server and channel.
  BareService service;
  grpc::ServerBuilder builder;
  StatusOr<std::string> target = pluginapi::UnixSocketTarget(sock_dir + "/floor.sock");
  if (!target.ok()) Die(target.status().message());
  builder.AddListeningPort(*target, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) Die("cannot serve " + sock_dir + "/floor.sock");
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel(*target, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + 10s)) {
    Die("cannot dial the floor's socket");
  }
  auto stub = v1beta1::DevicePlugin::NewStub(channel);
  auto round_trip = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    v1beta1::DevicePluginOptions reply;
    grpc::Status s = stub->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &reply);
    if (!s.ok()) Die("floor round trip: " + s.error_message());
  };
  BareSqlite bare(data_dir + "/floor.db", full);

  std::vector<double> alloc_us, rtt2_us, commit_us;
  alloc_us.reserve(iterations);
  rtt2_us.reserve(iterations);
  commit_us.reserve(iterations);
  const auto wall_start = std::chrono::steady_clock::now();
  for (long i = 0; i < warmup + iterations; ++i) {
    const bool record = i >= warmup;
    dm::Pod pod = TwoGpuPod(i);
    auto t0 = std::chrono::steady_clock::now();
    if (Status s = (*manager)->Allocate(pod, "main"); !s.ok()) {
      Die("Allocate #" + std::to_string(i) + ": " + s.ToString());
    }
    double a = MicrosSince(t0);
    if (Status s = (*manager)->RemovePod(pod.uid); !s.ok()) Die("RemovePod: " + s.ToString());

    t0 = std::chrono::steady_clock::now();
    round_trip();
    round_trip();
    double r = MicrosSince(t0);

    t0 = std::chrono::steady_clock::now();
    bare.CommitInsert();
    double c = MicrosSince(t0);
    bare.CommitDelete();

    if (record) {
      alloc_us.push_back(a);
      rtt2_us.push_back(r);
      commit_us.push_back(c);
    }
  }
  const double wall_s = MicrosSince(wall_start) / 1e6;

  dm::ManagerStats stats = (*manager)->GetStats();
  server->Shutdown(std::chrono::system_clock::now() + 5s);
  (*plugin)->Stop();
  (*manager)->Stop();

  const double rtt2_p50 = Percentile(rtt2_us, 50), commit_p50 = Percentile(commit_us, 50);
  out.Add("iterations", static_cast<double>(iterations), "count");
  out.Add("alloc_p50_us", Percentile(alloc_us, 50), "us");
  out.Add("alloc_p99_us", Percentile(alloc_us, 99), "us");
  out.Add("alloc_mean_us", Mean(alloc_us), "us");
  out.Add("floor_rtt2_p50_us", rtt2_p50, "us");
  out.Add("floor_commit_p50_us", commit_p50, "us");
  out.Add("floor_p50_us", rtt2_p50 + commit_p50, "us");
  out.Add("preferred_ok", static_cast<double>(stats.preferred_ok), "count");
  out.Add("wall_s", wall_s, "s");
  std::fprintf(stderr,
               "alloc_e2e_bench: %ld admissions (sync=%s): p50 %.0f us, p99 %.0f us; floor p50 "
               "%.0f us (2 RTT %.0f + commit %.0f); %.1f s\n",
               iterations, sync.c_str(), Percentile(alloc_us, 50), Percentile(alloc_us, 99),
               rtt2_p50 + commit_p50, rtt2_p50, commit_p50, wall_s);
  std::error_code ec;
  std::filesystem::remove_all(data_dir, ec);
  std::filesystem::remove_all(sock_dir, ec);
  if (stats.preferred_ok < iterations) {
    std::fprintf(stderr,
                 "alloc_e2e_bench: only %lld of the admissions used the plugin's "
                 "preferred answer\n",
                 static_cast<long long>(stats.preferred_ok));
    return 1;
  }
  return out.Write() ? 0 : 1;
}

}  // namespace
}  // namespace kdm::bench

int main(int argc, char** argv) { return kdm::bench::Main(argc, argv); }
