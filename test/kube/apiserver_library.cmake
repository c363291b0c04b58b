# kdm_test_apiserver: the in-tree HTTPS API server for tests
# (test_api_server.h), the certificates it is given, made at test time
# (test_pki.h), and the stateful FakeCluster on top (fake_cluster.h).
# Included by test/kube/CMakeLists.txt and, in a build without tests, by
# bench/e2e/CMakeLists.txt (the scheduling bench runs the simulation).
add_library(kdm_test_apiserver STATIC ${CMAKE_CURRENT_LIST_DIR}/test_api_server.cc
  ${CMAKE_CURRENT_LIST_DIR}/test_pki.cc ${CMAKE_CURRENT_LIST_DIR}/fake_cluster.cc)
kdm_test_code(kdm_test_apiserver)
target_compile_features(kdm_test_apiserver PUBLIC cxx_std_20)
target_include_directories(kdm_test_apiserver PUBLIC ${PROJECT_BINARY_DIR}/include)
target_link_libraries(kdm_test_apiserver PUBLIC kdm::base nlohmann_json::nlohmann_json
  PRIVATE OpenSSL::SSL OpenSSL::Crypto Threads::Threads)
# Replies and options are written as designated initializers that leave the
# other members at their defaults, which -Wextra would flag.
target_compile_options(kdm_test_apiserver PRIVATE -Wno-missing-field-initializers)
