# `cmake --install build --prefix P` installs the public headers, libepmoe.a, the `epmoe` tool and a
# CMake package, so that a C++ user writes
#   find_package(epmoe REQUIRED)
#   target_link_libraries(app PRIVATE epmoe::epmoe)
# and gets the include path, the EPMOE_WITH_* definitions and every link dependency of this build
# (threads; cudart, cublas, the driver API; NCCL), found again on the consumer's machine.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/epmoe DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(epmoe_install_targets epmoe epmoe_cli)
if(TARGET epmoe_nccl)
  list(APPEND epmoe_install_targets epmoe_nccl)
endif()
install(TARGETS ${epmoe_install_targets} EXPORT epmoeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT epmoeTargets NAMESPACE epmoe:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/epmoe)

set(EPMOE_PACKAGE_WITH_CUDA ${EPMOE_HAVE_CUDA})
set(EPMOE_PACKAGE_WITH_NCCL ${EPMOE_HAVE_NCCL})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/epmoeConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/epmoeConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/epmoe)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/epmoeConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/epmoeConfig.cmake ${CMAKE_BINARY_DIR}/epmoeConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/epmoe)
