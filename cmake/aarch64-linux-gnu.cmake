# Cross-compiling lockstep for AArch64 with Debian's cross toolchain and arm64 libraries
# (scripts/aarch64.sh); the result runs under qemu-aarch64. LOCKSTEP_AARCH64_SYSROOT: a directory
# holding arm64 packages unpacked (those not co-installable with the native ones), searched first.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(LOCKSTEP_AARCH64_SYSROOT "" CACHE PATH "unpacked arm64 packages, searched before the system's")
set(CMAKE_FIND_ROOT_PATH ${LOCKSTEP_AARCH64_SYSROOT} /usr/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# pkg-config: the sysroot's .pc files first (scripts/aarch64.sh points their prefix at it). The
# environment is the process's: try_compile, which reads this file again, must see the same
# sysroot or it would reset the search path.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES LOCKSTEP_AARCH64_SYSROOT)
set(ENV{PKG_CONFIG_LIBDIR}
    "${LOCKSTEP_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
