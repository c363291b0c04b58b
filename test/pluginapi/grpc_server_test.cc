// kdm::pluginapi::StopUnixServer: the one way a kdm gRPC server on a unix
// socket ends (registration, pod-resources, `kdm conform`'s registrar).
#include "kdm/pluginapi/grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "kdm/pluginapi/unix_target.h"
#include "kdm/test/pluginapi/fake_registration_server.h"

namespace kdm::pluginapi {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// A Registration service that answers every call at once.
class AnswersAtOnce final : public v1beta1::Registration::Service {
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest*,
                        v1beta1::Empty*) override {
    return grpc::Status::OK;
  }
};

grpc::Status CallRegister(const std::string& target) {
  auto stub = v1beta1::Registration::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1beta1::Empty empty;
  return stub->Register(&ctx, v1beta1::RegisterRequest(), &empty);
}

TEST(StopUnixServerTest, StopsServingAndRemovesTheSocket) {
  testing::TempSocketDir dir;
  const std::string socket = dir.path() + "/s.sock";
  StatusOr<std::string> target = UnixSocketTarget(socket);
  ASSERT_TRUE(target.ok()) << target.status().message();
  AnswersAtOnce service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(*target, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(CallRegister(*target).ok());
  ASSERT_TRUE(Exists(socket));

  StopUnixServer(server.get(), socket, std::chrono::milliseconds(200));

  EXPECT_FALSE(Exists(socket)) << "the socket file is left behind";
  grpc::Status after = CallRegister(*target);
  EXPECT_EQ(after.error_code(), grpc::StatusCode::UNAVAILABLE) << after.error_message();
}

TEST(StopUnixServerTest, ANullServerOnlyRemovesTheFile) {
  testing::TempSocketDir dir;
  const std::string path = dir.path() + "/left-over.sock";
  std::ofstream(path) << "x";
  ASSERT_TRUE(Exists(path));
  StopUnixServer(nullptr, path, std::chrono::milliseconds(1));
  EXPECT_FALSE(Exists(path));
  // A file that is already gone is not an error.
  StopUnixServer(nullptr, path, std::chrono::milliseconds(1));
  EXPECT_FALSE(Exists(path));
}

}  // namespace
}  // namespace kdm::pluginapi
