# SPDX-License-Identifier: Apache-2.0
# kvpage built from source inside a user project (tests/consumer/subproject),
# through add_subdirectory and through FetchContent (SOURCE_DIR: offline),
# CPU only: each builds the library and a C program against it, installs
# both and runs the installed program with LD_LIBRARY_PATH unset.
foreach(mode add_subdirectory fetchcontent)
  add_test(NAME consumer_${mode}
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/subproject_test.sh ${mode} ${PROJECT_SOURCE_DIR}
            ${PROJECT_BINARY_DIR}/consumer-${mode} ${CMAKE_C_COMPILER} ${CMAKE_CXX_COMPILER})
  set_tests_properties(consumer_${mode} PROPERTIES LABELS consumer TIMEOUT 900)
endforeach()
