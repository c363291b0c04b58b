# Install rules: libraries, public headers, generated protocol headers, the
# kdm binary, an exported CMake package (find_package(kdm CONFIG)) and kdm.pc.
include(CMakePackageConfigHelpers)

get_property(kdm_targets GLOBAL PROPERTY KDM_EXPORTED_TARGETS)
install(TARGETS ${kdm_targets}
  EXPORT kdmTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

get_property(kdm_modules GLOBAL PROPERTY KDM_MODULES)
foreach(module ${kdm_modules})
  get_property(headers GLOBAL PROPERTY KDM_PUBLIC_HEADERS_${module})
  get_property(dir GLOBAL PROPERTY KDM_MODULE_DIR_${module})
  foreach(header ${headers})
    if(IS_ABSOLUTE ${header})
      file(RELATIVE_PATH rel ${PROJECT_BINARY_DIR}/${module} ${header})
      set(src ${header})
    else()
      set(rel ${header})
      set(src ${dir}/${header})
    endif()
    get_filename_component(sub ${rel} DIRECTORY)
    install(FILES ${src} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kdm/${module}/${sub})
  endforeach()
endforeach()

install(TARGETS kdm RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

install(EXPORT kdmTargets
  NAMESPACE kdm::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kdm)

configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/kdmConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kdmConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kdm)
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/kdmConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/kdmConfig.cmake
  ${PROJECT_BINARY_DIR}/kdmConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kdm)

# pkg-config: one package "kdm" with every library, in dependency order (a
# module is added after the ones it depends on, so prepending reverses it);
# the generated protocol code follows the wire layer that uses it.
set(kdm_pc_libs "")
foreach(module ${kdm_modules})
  get_target_property(type kdm_${module} TYPE)
  if(NOT type STREQUAL "INTERFACE_LIBRARY")
    if(module STREQUAL "pluginapi")
      string(PREPEND kdm_pc_libs "-lkdm_pluginapi_proto ")
    endif()
    string(PREPEND kdm_pc_libs "-lkdm_${module} ")
  endif()
endforeach()
string(STRIP "${kdm_pc_libs}" kdm_pc_libs)
# libkdm_http speaks HTTPS through OpenSSL (libssl, libcrypto).
set(kdm_pc_requires_private_extra "")
if("http" IN_LIST kdm_modules)
  string(APPEND kdm_pc_requires_private_extra " openssl")
endif()
# kdm.pc names its prefix relative to its own directory (${pcfiledir}), so an
# install moved elsewhere, or made with `cmake --install --prefix`, still
# points at itself.
file(RELATIVE_PATH kdm_pc_prefix_from_pcdir "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
string(REGEX REPLACE "/$" "" kdm_pc_prefix_from_pcdir "${kdm_pc_prefix_from_pcdir}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/kdm.pc.in ${PROJECT_BINARY_DIR}/kdm.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kdm.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
