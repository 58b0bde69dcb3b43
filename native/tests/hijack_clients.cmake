# Hijack test clients (tests/test_hijack_*.py), included from tests/CMakeLists.txt.
include_guard(GLOBAL)

# A hijack test program: st_test_program of tests/CMakeLists.txt (built into build/tests, installed).

if(ST_HAVE_VERBS AND ST_HAVE_MLX5DV AND EXISTS ${CMAKE_CURRENT_LIST_DIR}/../emu/cuda/emucuda.c)
  st_test_program(hijack_client)
  target_include_directories(hijack_client PRIVATE ${ST_INCLUDE_DIR} ${CMAKE_CURRENT_LIST_DIR}/../emu/cuda)
  target_link_libraries(hijack_client PRIVATE st_emu_mlx5 st_emu_ibverbs st_emu_cuda pthread dl)
endif()

# Programs over the emulated CUDA driver alone: fork safety of the hijack, and a
# second register of a page the GPU path already proxies.
if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/../emu/cuda/emucuda.c AND TARGET st_emu_cuda)
  foreach(t hijack_fork hijack_devptr)
    st_test_program(${t})
    target_include_directories(${t} PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../emu/cuda)
    target_link_libraries(${t} PRIVATE st_emu_cuda)
  endforeach()
endif()

# Unit tests of hijack pieces built from its sources: the order of the
# poller's monitor/wait idle wait (hijack/arch.h, with fakes) and the QP record
# table over many QPs' lifetimes (registry.c compiled in).
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64|aarch64|arm64")
  foreach(t hijack_wait_test hijack_registry_test)
    st_test_program(${t})
    target_include_directories(${t} PRIVATE ${ST_INCLUDE_DIR} ${CMAKE_CURRENT_LIST_DIR}/../src)
    target_link_libraries(${t} PRIVATE pthread)
  endforeach()
endif()
