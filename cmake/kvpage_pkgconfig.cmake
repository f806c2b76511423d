# SPDX-License-Identifier: Apache-2.0
# Writes ${PROJECT_BINARY_DIR}/kvpage.pc from cmake/kvpage.pc.in. The file is
# relocatable: its prefix is found from its own folder,
# <prefix>/<libdir>/pkgconfig, however deep libdir is (lib, lib64,
# lib/x86_64-linux-gnu).
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(KVPAGE_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(KVPAGE_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  file(RELATIVE_PATH _kvp_pc_up "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
  string(REGEX REPLACE "/$" "" _kvp_pc_up "${_kvp_pc_up}")
  set(KVPAGE_PC_PREFIX "\${pcfiledir}/${_kvp_pc_up}")
  set(KVPAGE_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(KVPAGE_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(KVPAGE_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
# Libs carries the rpath unless KVPAGE_PKGCONFIG_RPATH is OFF; the variable
# rpath holds it either way.
set(KVPAGE_PC_LIBS_RPATH "")
if(KVPAGE_PKGCONFIG_RPATH)
  set(KVPAGE_PC_LIBS_RPATH "\${rpath} ")
endif()
set(KVPAGE_PC_URL "")
if(PROJECT_HOMEPAGE_URL)
  set(KVPAGE_PC_URL "URL: ${PROJECT_HOMEPAGE_URL}")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/kvpage.pc.in ${PROJECT_BINARY_DIR}/kvpage.pc @ONLY)
