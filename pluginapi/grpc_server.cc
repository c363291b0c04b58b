#include "kdm/pluginapi/grpc_server.h"

#include <unistd.h>

namespace kdm::pluginapi {

void StopUnixServer(grpc::Server* server, const std::string& socket_path,
                    std::chrono::milliseconds grace) {
  if (server != nullptr) {
    server->Shutdown(std::chrono::system_clock::now() + grace);
    server->Wait();
  }
  ::unlink(socket_path.c_str());
}

}  // namespace kdm::pluginapi
