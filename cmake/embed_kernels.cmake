# cmake -P: writes a header holding every src/device/kernels/*.cl as {file name, text} pairs
# (device::KernelSources), so the binary builds its programs without the source tree.
set(body "")
string(REPLACE "|" ";" INPUTS "${INPUTS}")
foreach(input ${INPUTS})
  get_filename_component(name ${input} NAME)
  file(READ ${input} text)
  string(APPEND body "    {\"${name}\", R\"lockstep_cl(${text})lockstep_cl\"},\n")
endforeach()
file(WRITE ${OUTPUT}.tmp "#pragma once\n// Generated from src/device/kernels/*.cl by cmake/embed_kernels.cmake.\n#include \"lockstep/device.h\"\nnamespace lockstep::device {\ninline constexpr KernelSource kKernelSources[] = {\n${body}};\n}  // namespace lockstep::device\n")
file(COPY_FILE ${OUTPUT}.tmp ${OUTPUT} ONLY_IF_DIFFERENT)
