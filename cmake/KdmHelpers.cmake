# Helpers shared by every kdm module.

# Warnings are errors on our own code only (generated code gets the defaults).
# Under clang, lock annotations (ABSL_GUARDED_BY, ...) are checked too.
function(kdm_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE -Wthread-safety)
  endif()
  # GCC 12 at -O3 (Release) reports impossible overlaps in inlined
  # std::string concatenation (GCC bug 105329); shown, not fatal. Release
  # only, so other builds keep their flags (and their ccache hits).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE $<$<CONFIG:Release>:-Wno-error=restrict>)
  endif()
endfunction()

# kdm_add_library(<module>
#   SOURCES <files...>          # .cc files, relative to the module folder
#   PUBLIC_HEADERS <files...>   # installed as <prefix>/include/kdm/<module>/...
#   PUBLIC_DEPS <targets...>
#   PRIVATE_DEPS <targets...>)
# Creates target kdm_<module> (alias kdm::<module>, exported as kdm::<module>).
set_property(GLOBAL PROPERTY KDM_EXPORTED_TARGETS "")
function(kdm_add_library module)
  cmake_parse_arguments(ARG "HEADER_ONLY" "" "SOURCES;PUBLIC_HEADERS;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  set(target kdm_${module})
  if(ARG_HEADER_ONLY)
    add_library(${target} INTERFACE)
    set(scope INTERFACE)
  else()
    add_library(${target} ${ARG_SOURCES})
    set(scope PUBLIC)
    kdm_warnings(${target})
    kdm_unity_build(${target})
    target_link_libraries(${target} PRIVATE ${ARG_PRIVATE_DEPS})
  endif()
  add_library(kdm::${module} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${module})
  target_compile_features(${target} ${scope} cxx_std_20)
  target_include_directories(${target} ${scope}
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${target} ${scope} ${ARG_PUBLIC_DEPS})
  set_property(GLOBAL APPEND PROPERTY KDM_EXPORTED_TARGETS ${target})
  set_property(GLOBAL APPEND PROPERTY KDM_PUBLIC_HEADERS_${module} ${ARG_PUBLIC_HEADERS})
  set_property(GLOBAL APPEND PROPERTY KDM_MODULES ${module})
  set_property(GLOBAL PROPERTY KDM_MODULE_DIR_${module} ${CMAKE_CURRENT_SOURCE_DIR})
endfunction()

# Test code's flags. Code generation is most of a build's cost, and test
# code (tests, their helper programs, the fake NVML, fuzz replays) does little
# work of its own: -O0 -g1 compiles a test source in 0.7x the time of -O2 -g
# (-O1 saves nothing), and -g1 still gives file:line in every backtrace and
# sanitizer report (docs/reliability.md, "Cost"). The kdm libraries and
# binaries keep the build type's flags. An empty KDM_TEST_CXX_FLAGS gives
# tests the build type's flags too.
set(KDM_TEST_CXX_FLAGS "-O0;-g1" CACHE STRING "Compile flags added to kdm's test code")

# Unity builds (KDM_UNITY_BUILD, on by default): a target's sources are
# compiled up to six at a time as one unit, so the code every source
# instantiates from gtest, gmock, CLI11, nlohmann, gRPC and spdlog is
# compiled once per batch, not once per source (docs/reliability.md, "Cost").
# Used for the kdm libraries, the kdm binary and the test binaries. Each
# source keeps its file-local helpers under names of its own, so any batch
# compiles; -DKDM_UNITY_BUILD=OFF builds one object per source.
option(KDM_UNITY_BUILD "Compile kdm's targets in batches of sources" ON)
function(kdm_unity_build target)
  if(KDM_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 6)
  endif()
endfunction()

# kdm_test_code(<target>): warnings, test flags and what every test source
# may use: the build tree's include/ (wait_until.h, e2e_util.h), Boost, and
# where the sources and the build are (KDM_TEST_SOURCE_DIR,
# KDM_TEST_BINARY_DIR).
function(kdm_test_code target)
  kdm_warnings(${target})
  target_compile_options(${target} PRIVATE ${KDM_TEST_CXX_FLAGS})
  target_include_directories(${target} PRIVATE ${PROJECT_BINARY_DIR}/include)
  target_include_directories(${target} SYSTEM PRIVATE ${Boost_INCLUDE_DIRS})
  target_compile_definitions(${target} PRIVATE KDM_TEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    KDM_TEST_BINARY_DIR="${PROJECT_BINARY_DIR}")
endfunction()

# kdm_add_test(<name> SOURCES <files...> LIBS <targets...> [LABELS <labels...>]
#              [TIMEOUT <seconds>] [DEPENDS <targets...>])
# One gtest binary under build/bin/tests, one per test folder and kind (label
# and timeout), so a build links a couple of dozen test binaries, not one per
# source; each TEST() becomes its own ctest entry, named Suite.Test as before
# (discovered when ctest runs, so the build never executes tests). DEPENDS:
# targets the tests run (kdm, helper processes, the fake NVML).
function(kdm_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LIBS;LABELS;DEPENDS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  kdm_test_code(${name})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin/tests)
  kdm_unity_build(${name})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gmock GTest::gtest_main)
  if(ARG_DEPENDS)
    add_dependencies(${name} ${ARG_DEPENDS})
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  # ctest -j starts the costliest tests first: the slow ones (timeout over
  # 120 s), then end-to-end ones, so the many short tests fill the gaps.
  set(cost 1)
  if(ARG_TIMEOUT GREATER 120)
    set(cost 50)
  elseif("e2e" IN_LIST ARG_LABELS)
    set(cost 20)
  endif()
  set(tsan_env "")
  if(KDM_SANITIZE STREQUAL "thread")
    # TSAN runs instrumented code 5-15x slower: ctest's limit scales, and so do
    # the bounded waits of the heaviest tests (hardening_test's WaitUntil).
    math(EXPR ARG_TIMEOUT "${ARG_TIMEOUT} * 5")
    # Known false positives inside uninstrumented Debian libraries, each with
    # its reason (docs/reliability.md, "Sanitizers"). Child processes (the kdm
    # binary in e2e tests) inherit it. A property of its own: only the first
    # element of a list-valued ENVIRONMENT survives gtest_discover_tests.
    # suppress_equal_addresses=0: with it on, TSAN keeps every racy address it
    # met (suppressed ones included) and scans them all on each new report,
    # so parsing a 1 MB message out of gRPC's buffers (suppressed reads) took
    # minutes instead of a second. ./run sets the same options for the rest.
    set(tsan_env ENVIRONMENT_MODIFICATION
      "TSAN_OPTIONS=set:suppressions=${PROJECT_SOURCE_DIR}/test/tsan.supp:second_deadlock_stack=1:suppress_equal_addresses=0")
  endif()
  if(KDM_SANITIZE MATCHES "address")
    # Catch a callback that writes to a test body's locals after the body
    # returned (a subscriber outliving its Notification smashed the main
    # thread's stack under TSAN; plain ASan does not check returned frames).
    set(tsan_env ENVIRONMENT_MODIFICATION "ASAN_OPTIONS=set:detect_stack_use_after_return=1")
  endif()
  # ENVIRONMENT holds one variable: gtest_discover_tests flattens its
  # PROPERTIES into one list, so only the first element of a list-valued
  # ENVIRONMENT would survive. Source paths reach tests as compile
  # definitions instead (KDM_TEST_SOURCE_DIR).
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}" COST ${cost} ${tsan_env}
    ENVIRONMENT "KDM_BINARY_DIR=${PROJECT_BINARY_DIR}")
endfunction()
