# cmake --install: headers, libkvq.a and libkvq.so (the engine), libkvq_research.a, a CMake package
# (find_package(kvq CONFIG), targets kvq::kvq = shared engine, kvq::kvq_static = static engine,
# kvq::research = the research library on the static engine) and pkg-config files (kvq, kvq-static,
# kvq-research), the LICENSE and CHANGELOG. Both are relocatable, so
# `cmake --install build --prefix DIR` works for any DIR. Eigen and xsimd are build-time only: the
# installed package depends on nothing but Threads.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(KVQ_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvq)
set_target_properties(kvq PROPERTIES EXPORT_NAME kvq_static)
set_target_properties(kvq_shared PROPERTIES EXPORT_NAME kvq)
set_target_properties(kvq_research PROPERTIES EXPORT_NAME research)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kvq DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS kvq kvq_shared kvq_research EXPORT kvqTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT kvqTargets NAMESPACE kvq:: DESTINATION ${KVQ_CMAKE_DIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/kvqConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/kvqConfig.cmake INSTALL_DESTINATION ${KVQ_CMAKE_DIR})
# The C ABI only grows within a major version (kvq.h, ABI notes), as the SONAME libkvq.so.<major> says.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/kvqConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kvqConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/kvqConfigVersion.cmake
  DESTINATION ${KVQ_CMAKE_DIR})

# kvq.pc finds its prefix from its own location (${pcfiledir}).
file(RELATIVE_PATH KVQ_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" KVQ_PC_TO_PREFIX "${KVQ_PC_TO_PREFIX}")
# kvq: the shared engine; kvq-static: the static engine (libkvq.a by path, so that it is linked even where
# libkvq.so is beside it); kvq-research: the research library on the static engine.
foreach(pc kvq kvq-static kvq-research)
  configure_file(${CMAKE_CURRENT_LIST_DIR}/${pc}.pc.in ${CMAKE_CURRENT_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE ${PROJECT_SOURCE_DIR}/CHANGELOG.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
