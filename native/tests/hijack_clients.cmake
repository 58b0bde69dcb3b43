# Hijack test clients (tests/test_hijack_*.py), included from tests/CMakeLists.txt.
include_guard(GLOBAL)
if(ST_HAVE_VERBS AND ST_HAVE_MLX5DV AND EXISTS ${CMAKE_CURRENT_LIST_DIR}/../emu/cuda/emucuda.c)
  add_executable(hijack_client ${CMAKE_CURRENT_LIST_DIR}/hijack_client.c)
  target_include_directories(hijack_client PRIVATE ${ST_INCLUDE_DIR} ${CMAKE_CURRENT_LIST_DIR}/../emu/cuda)
  target_link_libraries(hijack_client PRIVATE st_emu_mlx5 st_emu_ibverbs st_emu_cuda pthread dl)
  set_target_properties(hijack_client PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests
    BUILD_RPATH "" SKIP_BUILD_RPATH ON)
  install(TARGETS hijack_client RUNTIME DESTINATION ${ST_INSTALL_DIR}/tests)
endif()

# Fork safety of the hijack: needs only the emulated CUDA driver.
if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/../emu/cuda/emucuda.c AND TARGET st_emu_cuda)
  add_executable(hijack_fork ${CMAKE_CURRENT_LIST_DIR}/hijack_fork.c)
  target_include_directories(hijack_fork PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../emu/cuda)
  target_link_libraries(hijack_fork PRIVATE st_emu_cuda)
  set_target_properties(hijack_fork PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests
    BUILD_RPATH "" SKIP_BUILD_RPATH ON)
  install(TARGETS hijack_fork RUNTIME DESTINATION ${ST_INSTALL_DIR}/tests)
  # a second register of a page the GPU path already proxies
  add_executable(hijack_devptr ${CMAKE_CURRENT_LIST_DIR}/hijack_devptr.c)
  target_include_directories(hijack_devptr PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../emu/cuda)
  target_link_libraries(hijack_devptr PRIVATE st_emu_cuda)
  set_target_properties(hijack_devptr PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests
    BUILD_RPATH "" SKIP_BUILD_RPATH ON)
  install(TARGETS hijack_devptr RUNTIME DESTINATION ${ST_INSTALL_DIR}/tests)
endif()

# The order of the poller's monitor/wait idle wait (hijack/arch.h), with fakes.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64|aarch64|arm64")
  add_executable(hijack_wait_test ${CMAKE_CURRENT_LIST_DIR}/hijack_wait_test.c)
  target_include_directories(hijack_wait_test PRIVATE ${ST_INCLUDE_DIR} ${CMAKE_CURRENT_LIST_DIR}/../src)
  set_target_properties(hijack_wait_test PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests
    BUILD_RPATH "" SKIP_BUILD_RPATH ON)
  install(TARGETS hijack_wait_test RUNTIME DESTINATION ${ST_INSTALL_DIR}/tests)
endif()

# The hijack's QP record table over many QPs' lifetimes (registry.c compiled in).
add_executable(hijack_registry_test ${CMAKE_CURRENT_LIST_DIR}/hijack_registry_test.c)
target_include_directories(hijack_registry_test PRIVATE ${ST_INCLUDE_DIR} ${CMAKE_CURRENT_LIST_DIR}/../src)
target_link_libraries(hijack_registry_test PRIVATE pthread)
set_target_properties(hijack_registry_test PROPERTIES
  RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests
  BUILD_RPATH "" SKIP_BUILD_RPATH ON)
install(TARGETS hijack_registry_test RUNTIME DESTINATION ${ST_INSTALL_DIR}/tests)
