# libpartrain and the install rules. The tree links its per-layer
# libraries (src/*/CMakeLists.txt); programs outside it link libpartrain,
# every layer in one library, shared (libpartrain.so, the layers' archives
# whole) and static (libpartrain.a, the archives merged), and find it with
# pkg-config (partrain.pc, relocatable):
#   cmake --install build --prefix DIR
#   cc prog.c $(PKG_CONFIG_PATH=DIR/lib/pkgconfig pkg-config --cflags --libs partrain)
# installs bin/partrain, lib/libpartrain.{so,a}, include/partrain/*.h and
# lib/pkgconfig/partrain.pc (examples/ builds against it in the tests).
set(PT_LAYERS pt_core pt_kernels pt_comm pt_optim pt_model pt_parallel pt_train pt_plan
              pt_calibrate pt_report)

file(WRITE ${CMAKE_BINARY_DIR}/libpartrain_anchor.c
     "/* libpartrain: the layers' archives, whole (cmake/install.cmake) */\ntypedef int pt_libpartrain;\n")
add_library(partrain_shared SHARED ${CMAKE_BINARY_DIR}/libpartrain_anchor.c)
# every object of every layer, whole; then the layers as the tree links
# them, for their dependencies (OpenBLAS, cJSON, Open MPI, threads)
set(whole "-Wl,--whole-archive")
foreach(lib ${PT_LAYERS})
  list(APPEND whole "$<TARGET_FILE:${lib}>")
endforeach()
list(APPEND whole "-Wl,--no-whole-archive")
target_link_libraries(partrain_shared PRIVATE ${whole} ${PT_LAYERS})
add_dependencies(partrain_shared ${PT_LAYERS})
set_target_properties(partrain_shared PROPERTIES OUTPUT_NAME partrain VERSION ${PROJECT_VERSION}
                                                 SOVERSION ${PROJECT_VERSION_MAJOR})

# the archives merged into one with ar's MRI script
set(mri "CREATE ${CMAKE_BINARY_DIR}/libpartrain.a\n")
foreach(lib ${PT_LAYERS})
  string(APPEND mri "ADDLIB $<TARGET_FILE:${lib}>\n")
endforeach()
string(APPEND mri "SAVE\nEND\n")
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/libpartrain.mri CONTENT "${mri}")
add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/libpartrain.a
                   COMMAND ${CMAKE_COMMAND} -E remove -f ${CMAKE_BINARY_DIR}/libpartrain.a
                   COMMAND ${CMAKE_AR} -M < ${CMAKE_BINARY_DIR}/libpartrain.mri
                   DEPENDS ${PT_LAYERS} ${CMAKE_BINARY_DIR}/libpartrain.mri
                   COMMENT "libpartrain.a: the layers' archives merged")
add_custom_target(partrain_static ALL DEPENDS ${CMAKE_BINARY_DIR}/libpartrain.a)

# what a static link needs beside the archive (pkg-config --static)
set(PT_PC_LIBS_PRIVATE "-lm -lpthread -lrt")
if(PT_HAVE_MPI)
  foreach(l ${MPI_C_LIBRARIES})
    string(APPEND PT_PC_LIBS_PRIVATE " ${l}")
  endforeach()
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/partrain.pc.in ${CMAKE_BINARY_DIR}/partrain.pc @ONLY)

install(TARGETS partrain RUNTIME DESTINATION bin)
install(TARGETS partrain_shared LIBRARY DESTINATION lib)
install(FILES ${CMAKE_BINARY_DIR}/libpartrain.a DESTINATION lib)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/partrain DESTINATION include)
install(FILES ${CMAKE_BINARY_DIR}/partrain.pc DESTINATION lib/pkgconfig)
