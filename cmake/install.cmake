# `cmake --install BUILD [--prefix DIR]`: what an engine needs to build against pagedattn without
# this source tree, in the GNUInstallDirs places:
#   include/pagedattn/...                    the public headers and the generated version.h
#   lib/libpagedattn.a, libpagedattn.so*     the library (static and shared, see src/CMakeLists.txt)
#   lib/libpagedattn_<layer>.a               the upper layers that are built (tokenizer, ops, ...)
#   lib/cmake/pagedattn/                     the CMake package: find_package(pagedattn CONFIG)
#                                            gives pagedattn::pagedattn (+ _static, _shared), the
#                                            layers as pagedattn::<layer>, component `cuda`
#   lib/pkgconfig/pagedattn.pc               pkg-config (relocatable: paths from its own place)
#   bin/pagedattn                            the command line (when PAGEDATTN_BUILD_TOOLS)
# The targets come from the global property PAGEDATTN_EXPORTED_TARGETS (src/CMakeLists.txt and
# pagedattn_add_layer), their imported dependencies from PAGEDATTN_EXPORT_DEPENDENCIES.
include(CMakePackageConfigHelpers)

set(PAGEDATTN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/pagedattn)
get_property(PAGEDATTN_EXPORTED_TARGETS GLOBAL PROPERTY PAGEDATTN_EXPORTED_TARGETS)
install(TARGETS ${PAGEDATTN_EXPORTED_TARGETS} EXPORT pagedattnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/pagedattn
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PAGEDATTN_GENERATED_INCLUDE_DIR}/pagedattn/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pagedattn)
install(EXPORT pagedattnTargets NAMESPACE pagedattn:: DESTINATION ${PAGEDATTN_INSTALL_CMAKEDIR})

# The config file: the dependencies (public ones, the static archive's private ones, the layers'),
# then the targets, then pagedattn::pagedattn.
get_property(dependency_lines GLOBAL PROPERTY PAGEDATTN_EXPORT_DEPENDENCIES)
list(JOIN dependency_lines "\n" PAGEDATTN_CONFIG_LAYER_DEPENDENCIES)
set(PAGEDATTN_CONFIG_OPENMP ${OpenMP_CXX_FOUND})
if(NOT PAGEDATTN_CONFIG_OPENMP)
  set(PAGEDATTN_CONFIG_OPENMP OFF)
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/pagedattnConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/pagedattnConfig.cmake
                              INSTALL_DESTINATION ${PAGEDATTN_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/pagedattnConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/pagedattnConfig.cmake
              ${PROJECT_BINARY_DIR}/pagedattnConfigVersion.cmake
        DESTINATION ${PAGEDATTN_INSTALL_CMAKEDIR})

# pkg-config: `pkg-config --cflags --libs pagedattn` links the shared library (the archive's
# private dependencies are in Libs.private / Requires.private for --static).
file(RELATIVE_PATH PAGEDATTN_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" PAGEDATTN_PC_TO_PREFIX "${PAGEDATTN_PC_TO_PREFIX}")
set(PAGEDATTN_PC_CFLAGS "")
set(PAGEDATTN_PC_LIBS "")
set(PAGEDATTN_PC_LIBS_PRIVATE "-pthread")
if(OpenMP_CXX_FOUND)
  string(APPEND PAGEDATTN_PC_LIBS_PRIVATE " ${OpenMP_CXX_FLAGS}")
endif()
if(PAGEDATTN_WITH_CUDA)
  set(PAGEDATTN_PC_CFLAGS "-DPAGEDATTN_WITH_CUDA=1")
  set(PAGEDATTN_PC_LIBS "-L${CUDAToolkit_LIBRARY_DIR} -lcudart")
  string(APPEND PAGEDATTN_PC_LIBS_PRIVATE " -lcublas")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/pagedattn.pc.in ${PROJECT_BINARY_DIR}/pagedattn.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/pagedattn.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
